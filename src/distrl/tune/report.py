"""What a finished study writes: the best trial as a preset, a table of the top trials, and two plots."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from distrl.run.logs import write_json_atomic
from distrl.tune.trial import PRESET_FILE

BEST_FILE = "best.json"
TOP_FILE = "top_trials.md"
HISTORY_PLOT = "history.png"
IMPORTANCE_PLOT = "importances.png"


def write_results(study: Any, study_dir: Path, algo: str, env_id: str, wall_s: float, top: int = 10) -> int:
    """Write best.json, top_trials.md and the plots; print the table. 1 when no trial completed."""
    import optuna

    states = optuna.trial.TrialState
    trials = study.get_trials(deepcopy=False)
    complete = sorted((t for t in trials if t.state == states.COMPLETE), key=lambda t: -t.value)
    interrupted = sum(bool(t.user_attrs.get("interrupted")) for t in trials)
    counts = {
        "complete": sum(t.state == states.COMPLETE for t in trials),
        "pruned": sum(t.state == states.PRUNED for t in trials),
        "failed": sum(t.state == states.FAIL for t in trials) - interrupted,
        "interrupted and run again": interrupted,
    }
    print(
        f"study {study.study_name!r}: {len(trials)} trials ({', '.join(f'{n} {k}' for k, n in counts.items() if n)}) "
        f"in {wall_s:.1f}s",
        flush=True,
    )
    if not complete:
        print(
            f"distrl: error: no trial of study {study.study_name!r} completed; see {study_dir / 'trials'}",
            file=sys.stderr,
        )
        return 1
    best = complete[0]
    preset = json.loads((Path(best.user_attrs["run_dir"]) / PRESET_FILE).read_text())
    preset["comment"] = (
        f"distrl tune: study {study.study_name!r}, trial {best.number}, evaluation mean return "
        f"{best.value:.2f} after {preset.get('total_steps', 0):,} steps"
    )
    write_json_atomic(study_dir / BEST_FILE, preset)
    table = top_table(complete[:top])
    (study_dir / TOP_FILE).write_text(f"# Top trials of study {study.study_name!r} ({algo}, {env_id})\n\n{table}\n")
    print(table)
    plots = write_plots(study, study_dir)
    print(
        f"best: trial {best.number}, {best.value:.2f}; preset {study_dir / BEST_FILE} "
        f"(distrl train {algo} {env_id} --preset {study_dir / BEST_FILE}); {', '.join(plots)}",
        flush=True,
    )
    return 0


def top_table(trials: list[Any]) -> str:
    """A Markdown table: rank, trial, value, seconds, then each parameter."""
    names = sorted({name for t in trials for name in t.params})
    head = ["rank", "trial", "value", "s", *names]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for rank, t in enumerate(trials, 1):
        cells = [
            str(rank),
            str(t.number),
            f"{t.value:.2f}",
            f"{t.user_attrs.get('wall_s', 0):.0f}",
            *(_cell(t.params.get(n)) for n in names),
        ]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    return "" if value is None else str(value)


def write_plots(study: Any, study_dir: Path) -> list[str]:
    """history.png (each trial's value, the best so far) and importances.png (Optuna's fANOVA importance of
    each parameter); a line saying why instead of a plot that cannot be drawn."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return ["no plots: matplotlib is not installed (pip install 'distrl[plot]')"]
    import optuna

    states = optuna.trial.TrialState
    done = [
        t
        for t in study.get_trials(deepcopy=False)
        if t.state in (states.COMPLETE, states.PRUNED) and t.value is not None
    ]
    written = []
    fig, ax = plt.subplots(figsize=(7, 4))
    for state, marker in ((states.COMPLETE, "o"), (states.PRUNED, "x")):
        points = [(t.number, t.value) for t in done if t.state == state]
        if points:
            label = "pruned (its last evaluation)" if state == states.PRUNED else "complete"
            ax.scatter(*zip(*points), marker=marker, label=label)
    complete = [t for t in done if t.state == states.COMPLETE]
    best, running = [], float("-inf")
    for t in complete:
        running = max(running, t.value)
        best.append((t.number, running))
    if best:
        ax.step(*zip(*best), where="post", color="black", label="best so far")
    ax.set_xlabel("trial")
    ax.set_ylabel("evaluation mean return")
    ax.set_title(f"Optimisation history: {study.study_name}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(study_dir / HISTORY_PLOT, dpi=100)
    plt.close(fig)
    written.append(str(study_dir / HISTORY_PLOT))
    try:
        importances = optuna.importance.get_param_importances(study)
    except (RuntimeError, ValueError) as exc:  # too few trials, or no parameter that varied
        return [*written, f"no {IMPORTANCE_PLOT}: {exc}"]
    if not importances:
        return [*written, f"no {IMPORTANCE_PLOT}: no parameter varied"]
    fig, ax = plt.subplots(figsize=(7, 0.4 * len(importances) + 1.5))
    names = list(importances)[::-1]
    ax.barh(names, [importances[n] for n in names])
    ax.set_xlabel("importance (fANOVA, normalised)")
    ax.set_title(f"Parameter importances: {study.study_name}")
    fig.tight_layout()
    fig.savefig(study_dir / IMPORTANCE_PLOT, dpi=100)
    plt.close(fig)
    return [*written, str(study_dir / IMPORTANCE_PLOT)]
