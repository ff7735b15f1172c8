"""What a population-based training study writes at its end, and again with ``distrl tune report STUDY_DIR``:
best.json, best_schedule.json, members.md (printed too), lineage.png and schedule.png."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrl.config import ConfigError
from distrl.config.argv import parse_flags
from distrl.run.logs import write_json_atomic
from distrl.tune.lineage import LINEAGE_FILE, Segment, counts, final_returns, members, read_lineage, schedule
from distrl.tune.member import SCHEDULE_FILE, MemberState, PBTSpec

BEST_FILE = "best.json"
MEMBERS_FILE = "members.md"
LINEAGE_PLOT = "lineage.png"
SCHEDULE_PLOT = "schedule.png"


@dataclass(frozen=True)
class ReportArgs:
    """Write a --scheduler pbt study's results again from its lineage and members: best.json,
    best_schedule.json, members.md, lineage.png and schedule.png."""

    debug: bool = False
    """Show full tracebacks for errors."""


def report_command(argv: list[str]) -> int:
    """``distrl tune report STUDY_DIR``."""
    if not argv or argv[0].startswith("-"):
        if any(a in ("-h", "--help") for a in argv):
            parse_flags(ReportArgs, ["--help"], prog="distrl tune report STUDY_DIR")
        raise ConfigError("STUDY_DIR is missing: distrl tune report STUDY_DIR")
    parse_flags(ReportArgs, argv[1:], prog=f"distrl tune report {argv[0]}")
    study_dir = Path(argv[0])
    if not (study_dir / LINEAGE_FILE).exists():
        raise ConfigError(
            f"study_dir={argv[0]!r} holds no {LINEAGE_FILE}: not a --scheduler pbt study (an Optuna study writes its "
            "results again when its distrl tune command runs again)"
        )
    return write_pbt_results(study_dir)


def write_pbt_results(study_dir: Path) -> int:
    """Write the study's results from its lineage and members; print the table. 1 when no member finished."""
    spec = PBTSpec.read(study_dir)
    events = read_lineage(study_dir / LINEAGE_FILE)
    finals = final_returns(events)
    finished = {m: r for m, (step, r) in finals.items() if step >= spec.budget_steps}
    if not finished:
        print(f"distrl: error: no member of the study in {study_dir} finished its budget", file=sys.stderr)
        return 1
    best = max(sorted(finished), key=lambda m: finished[m])
    segments = schedule(events, best)
    state = MemberState.read(spec.member_dir(best))
    final_values = segments[-1].hyperparameters
    preset = {"algo": spec.algo, "env": spec.env_id, **spec.values(final_values), "total_steps": spec.budget_steps}
    preset["comment"] = (
        f"distrl tune --scheduler pbt: {best}'s final hyperparameters (evaluation mean return {finished[best]:.2f} "
        f"after {finals[best][0]:,} steps). It trained along {SCHEDULE_FILE}, which distrl tune replay trains "
        "again; this preset trains them from the start instead"
    )
    write_json_atomic(study_dir / BEST_FILE, preset)
    write_json_atomic(
        study_dir / SCHEDULE_FILE,
        {
            "algo": spec.algo,
            "env": spec.env_id,
            "member": best,
            "return": finished[best],
            "steps": finals[best][0],
            "checksum": state.checksum if state is not None else "",
            "segments": [s.to_json() for s in segments],
        },
    )
    table = members_table(events, spec)
    (study_dir / MEMBERS_FILE).write_text(f"# Members of the PBT study in {study_dir}\n\n{table}\n")
    print(table)
    plots = write_plots(study_dir, events, segments, spec)
    print(
        f"best: {best}, {finished[best]:.2f}; {len(segments)} segment(s) in {study_dir / SCHEDULE_FILE} (distrl tune "
        f"replay {study_dir}); preset of its final values {study_dir / BEST_FILE}; {', '.join(plots)}",
        flush=True,
    )
    return 0


def members_table(events: list[dict[str, Any]], spec: PBTSpec) -> str:
    """A Markdown table of the members, those that finished their budget first, by final return: final return,
    steps, whether it finished, exploits, restarts and final hyperparameters."""
    finals = final_returns(events)
    exploits, restarts = counts(events, "exploit"), counts(events, "restart")
    given_up = {e["member"] for e in events if e["event"] == "failed"}
    names = sorted(spec.mutations)
    head = ["rank", "member", "return", "steps", "status", "exploits", "restarts", *names]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]

    def status(member: str) -> str:
        if finals.get(member, (0, 0.0))[0] >= spec.budget_steps:
            return "done"
        return "given up" if member in given_up else "stopped"

    ranked = sorted(members(events), key=lambda m: (status(m) != "done", -finals.get(m, (0, float("-inf")))[1]))
    for rank, member in enumerate(ranked, 1):
        step, value = finals.get(member, (0, float("nan")))
        values = schedule(events, member)[-1].hyperparameters
        cells = [str(rank), member, f"{value:.2f}", f"{step:,}", status(member)]
        cells += [str(exploits[member]), str(restarts[member]), *(_cell(values.get(n)) for n in names)]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cell(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def write_plots(study_dir: Path, events: list[dict[str, Any]], segments: list[Segment], spec: PBTSpec) -> list[str]:
    """lineage.png and schedule.png; a line saying why instead, without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["no plots: matplotlib is not installed (pip install 'distrl[tune]')"]
    draw_lineage(plt, study_dir / LINEAGE_PLOT, events, segments)
    draw_schedule(plt, study_dir / SCHEDULE_PLOT, segments, spec)
    return [str(study_dir / LINEAGE_PLOT), str(study_dir / SCHEDULE_PLOT)]


def draw_lineage(plt: Any, path: Path, events: list[dict[str, Any]], best: list[Segment]) -> None:
    """One horizontal track per member against environment steps, its evaluations coloured by return; an arrow
    from a member's track to another's where that one copied it, a cross where a member failed; the best
    member's ancestry (``best``) underlaid."""
    names = members(events)
    row = {name: i for i, name in enumerate(names)}
    tracks: dict[str, list[list[tuple[int, float]]]] = {name: [[(0, float("nan"))]] for name in names}
    points: list[tuple[int, int, float]] = []
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(names) + 1.8))
    for e in events:
        member = e.get("member", "")
        if e["event"] == "eval":
            tracks[member][-1].append((int(e["step"]), float(e["return"])))
            points.append((int(e["step"]), row[member], float(e["return"])))
        elif e["event"] == "exploit":
            step = int(e["source_step"])
            tracks[member].append([(step, float("nan"))])
            ax.annotate(
                "",
                xy=(step, row[member]),
                xytext=(step, row[e["source"]]),
                arrowprops={"arrowstyle": "->", "color": "tab:red", "lw": 1.0, "alpha": 0.7},
            )
        elif e["event"] in ("restart", "failed"):
            ax.plot([int(e.get("failed_after", e["step"]))], [row[member]], "x", color="black")
    for name, runs in tracks.items():
        for run in runs:
            ax.plot([s for s, _ in run], [row[name]] * len(run), color="0.6", lw=1.5, zorder=1)
    for i, segment in enumerate(best):
        y = row[segment.member]
        label = f"{best[-1].member}'s ancestry" if i == 0 else None
        ax.plot(
            [segment.from_step, segment.to_step], [y, y], color="tab:orange", lw=6, alpha=0.4, zorder=0, label=label
        )
    ax.legend(loc="lower right", fontsize=8)
    if points:
        scatter = ax.scatter(
            [p[0] for p in points], [p[1] for p in points], c=[p[2] for p in points], cmap="viridis", zorder=2, s=28
        )
        fig.colorbar(scatter, ax=ax, label="evaluation mean return")
    ax.set_yticks(range(len(names)), names)
    ax.invert_yaxis()
    ax.set_xlabel("environment steps")
    ax.set_title("PBT lineage: evaluations; arrows: a member copies another's checkpoint")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def draw_schedule(plt: Any, path: Path, segments: list[Segment], spec: PBTSpec) -> None:
    """Each mutated hyperparameter of the best member's ancestry against environment steps, one panel each;
    each segment labelled with the member that trained it."""
    names = sorted(spec.mutations)
    fig, axes = plt.subplots(len(names), 1, figsize=(8, 1.9 * len(names) + 0.8), sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], names):
        mutation = spec.mutations[name]
        choices = [json.dumps(c) for c in mutation.get("choices", [])]
        for segment in segments:
            value = segment.hyperparameters.get(name)
            y = choices.index(json.dumps(value)) if choices else value
            ax.hlines(y, segment.from_step, segment.to_step, color="tab:blue", lw=2)
            ax.text(segment.from_step, y, f" {segment.member}", fontsize=7, va="bottom")
        for segment in segments[1:]:
            ax.axvline(segment.from_step, color="0.7", ls=":", lw=1)
        if choices:
            ax.set_yticks(range(len(choices)), choices)
        elif mutation.get("log"):
            ax.set_yscale("log")
        ax.set_ylabel(name)
    axes[-1, 0].set_xlabel("environment steps")
    axes[0, 0].set_title(f"Hyperparameter schedule of {segments[-1].member} (its ancestry)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
