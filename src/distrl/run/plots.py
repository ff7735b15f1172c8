"""Pictures of runs: reward curves from Monitor files, and speedup-against-ideal bar charts.

matplotlib is imported only here, and only when a picture is asked for (the ``plot`` extra).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from distrl.config import ConfigError
from distrl.run.logs import MONITOR_FILE, monitor_agents, read_monitor

Axis = Literal["total-steps", "steps", "time"]
AXIS_LABELS = {
    "total-steps": "environment steps (all processes)",
    "steps": "environment steps per process",
    "time": "wall time (s)",
}
"""The x axes of a reward figure. ``total-steps``, the default, counts a run's steps as ``--total-steps`` does, over
all its processes, so that runs of every strategy and worker count end where their budgets do; ``steps`` divides by
the processes that collected (:func:`run_workers`)."""


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("plots need matplotlib: pip install 'distrl[plot]'") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


@dataclass
class Curve:
    name: str
    x: np.ndarray
    """Where each finished episode ended."""
    y: np.ndarray
    end: float | None = None
    """Where the run ended on the same axis, when known (see :func:`run_end`): a run's last episodes are
    unfinished when it stops, so its curve ends before it."""


def find_monitor(run: Path) -> Path:
    """A run's Monitor file: distrl's ``monitor.csv``, a file itself, or stable-baselines3's ``*monitor.csv``."""
    if not run.exists():
        raise ConfigError(f"run={str(run)!r} does not exist")
    if run.is_file():
        return run
    if (run / MONITOR_FILE).is_file():
        return run / MONITOR_FILE
    found = sorted(run.glob("*monitor.csv"))
    if not found:
        raise ConfigError(f"run={str(run)!r} has no Monitor file (monitor.csv or *.monitor.csv)")
    return found[0]


def run_workers(run: Path) -> int:
    """How many processes collected experience in a distrl run (1 for anything else, e.g. stable-baselines3's).

    ddp and actor-learner collect in every worker; decoupled only in its player.
    """
    config = run / "config.json" if run.is_dir() else run.parent / "config.json"
    if not config.is_file():
        return 1
    strategy = json.loads(config.read_text()).get("strategy", {})
    collecting = strategy.get("strategy", "single") in ("ddp", "actor-learner")
    return int(strategy.get("workers", 1)) if collecting else 1


def run_end(run: Path, x: Axis) -> float | None:
    """Where a finished distrl run ended on axis ``x``: its summary.json's total steps (per process for
    ``steps``). None for the time axis (Monitor times count the pauses of a resumed run, summary.json's
    not) and for runs without a summary.json (still running, or another library's)."""
    summary = run / "summary.json" if run.is_dir() else run.parent / "summary.json"
    if x == "time" or not summary.is_file():
        return None
    steps = json.loads(summary.read_text()).get("total_steps")
    if steps is None:
        return None
    return steps / run_workers(run) if x == "steps" else float(steps)


def smooth(y: np.ndarray, k: int) -> np.ndarray:
    """Trailing moving average over ``k`` episodes (the first points average what exists)."""
    if k <= 1 or len(y) == 0:
        return y
    cumulative = np.cumsum(np.insert(y, 0, 0.0))
    counts = np.minimum(np.arange(1, len(y) + 1), k)
    return (cumulative[1:] - cumulative[np.arange(1, len(y) + 1) - counts]) / counts


def load_curve(run: Path, x: Axis, k: int = 1) -> Curve:
    path = find_monitor(run)
    try:
        data = read_monitor(path)
    except (ValueError, IndexError, KeyError) as exc:
        raise ConfigError(f"run={str(run)!r}: {exc}") from None
    if len(data["r"]) == 0:
        raise ConfigError(f"run={str(run)!r}: the Monitor file {str(path)!r} holds no episodes")
    total = np.cumsum(data["l"]) * max(1, monitor_agents(path))  # agent-steps, as the run counts its steps
    xs = {"total-steps": total, "steps": total / run_workers(run), "time": data["t"]}[x]
    name = run.name if run.is_dir() else run.stem
    return Curve(name, xs, smooth(data["r"], k), run_end(run, x))


def _check_axis(x: str, k: int) -> None:
    if x not in AXIS_LABELS:
        raise ConfigError(f"x={x!r} is not allowed: must be one of {', '.join(AXIS_LABELS)}")
    if k < 1:
        raise ConfigError(f"smooth={k} is not allowed: must be >= 1")


EXTENSION_NOTE = "dotted: no episode finished after, to the run's last step"


def _extend(ax: Any, x_last: float, y_last: float, end: float | None, color: Any) -> bool:
    """A dotted level line from a curve's last finished episode to where its run ended; True if drawn. Its
    label starts with "_", which keeps it out of the legend."""
    if end is None or end <= x_last:
        return False
    ax.plot([x_last, end], [y_last, y_last], color=color, linestyle=":", linewidth=1.5, label="_to the run's end")
    return True


def _finish(fig: Any, x: str, k: int, title: str, out: Path | None, extended: bool = False) -> Any:
    """Labels, grid and legend of a reward figure (the legend's title explains dotted ends where there are
    some); written to ``out`` when given."""
    ax = fig.axes[0]
    ax.set_xlabel(AXIS_LABELS[x])
    ax.set_ylabel(f"return of finished episodes{f' (mean of {k})' if k > 1 else ''}")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    legend = ax.legend(loc="best", fontsize=8, title=EXTENSION_NOTE if extended else None)
    if extended:
        legend.get_title().set_fontsize(7)
    fig.tight_layout()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    return fig


def reward_curves(
    runs: list[Path], x: Axis = "total-steps", k: int = 1, out: Path | None = None, title: str = "Episode return"
) -> Any:
    """A figure with one curve per run, a point per finished episode, each continued dotted to its run's last
    step where that is known (:func:`run_end`); written to ``out`` (PNG) when given. Returns the Figure."""
    _check_axis(x, k)
    curves = [load_curve(Path(run), x, k) for run in runs]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    extended = False
    for curve in curves:
        (line,) = ax.plot(curve.x, curve.y, label=curve.name, linewidth=1.5)
        extended |= _extend(ax, float(curve.x[-1]), float(curve.y[-1]), curve.end, line.get_color())
    return _finish(fig, x, k, title, out, extended)


def mean_curves(
    groups: dict[str, list[Path]],
    x: Axis = "total-steps",
    k: int = 1,
    out: Path | None = None,
    title: str = "Episode return",
    points: int = 200,
) -> Any:
    """A figure with one curve per group of runs (the seeds of one setting, say): their mean at ``points``
    evenly spaced x up to where the shortest run's last finished episode ends, and the band from the lowest to
    the highest run there (each run's smoothed curve read between its episode ends); the mean goes on dotted to
    the shortest run's last step where every run's is known. Written to ``out`` (PNG) when given."""
    _check_axis(x, k)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    extended = False
    for label, runs in groups.items():
        curves = [load_curve(Path(run), x, k) for run in runs]
        grid = np.linspace(0.0, min(float(c.x[-1]) for c in curves), points)
        ys = np.stack([np.interp(grid, c.x, c.y) for c in curves])
        (line,) = ax.plot(
            grid, ys.mean(axis=0), linewidth=1.5, label=label if len(runs) == 1 else f"{label} ({len(runs)} runs)"
        )
        if len(runs) > 1:
            ax.fill_between(grid, ys.min(axis=0), ys.max(axis=0), color=line.get_color(), alpha=0.15, linewidth=0)
        ends = [c.end for c in curves]
        end = min(e for e in ends if e is not None) if None not in ends else None
        extended |= _extend(ax, float(grid[-1]), float(ys.mean(axis=0)[-1]), end, line.get_color())
    return _finish(fig, x, k, title, out, extended)


def seed_groups(runs: list[Path]) -> dict[str, list[Path]]:
    """The runs grouped by their settings: runs whose config.json differ only in the seed (and run directory)
    are one group, named by what their names share (``ppo-ant-s0``, ``ppo-ant-s1``: ``ppo-ant``). A run
    without a config.json (a Monitor file, another library's run) is a group of its own."""
    groups: dict[str, list[Path]] = {}
    for run in map(Path, runs):
        config = run / "config.json"
        if run.is_dir() and config.is_file():
            settings = json.loads(config.read_text())
            settings["run"] = {
                k: v for k, v in settings.get("run", {}).items() if k not in ("seed", "run_dir", "resume")
            }
            key = json.dumps(settings, sort_keys=True)
        else:
            key = str(run)
        groups.setdefault(key, []).append(run)
    named: dict[str, list[Path]] = {}
    for members in groups.values():
        names = [run.name if run.is_dir() else run.stem for run in members]
        shared = re.sub(r"([-_]s(eed)?)?[-_]*$", "", os.path.commonprefix(names)) if len(names) > 1 else names[0]
        label = shared or names[0]
        named[label if label not in named else f"{label} ({names[0]})"] = members
    return named


def speedup(t1: float, steps1: float, tn: float, steps_n: float) -> float:
    """Speedup of a run against the 1-worker run, adjusted for unequal total steps: T1/TN x stepsN/steps1."""
    return (t1 / tn) * (steps_n / steps1)


def speedup_chart(workers: list[int], speedups: list[float], title: str, out: Path | None = None) -> Any:
    """Bars of measured speedup beside the ideal (= workers). Returns the Figure."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 4))
    positions = np.arange(len(workers))
    ax.bar(positions - 0.2, workers, width=0.4, color="#cccccc", label="ideal")
    ax.bar(positions + 0.2, speedups, width=0.4, color="#3366aa", label="measured")
    for p, s in zip(positions, speedups):
        ax.text(p + 0.2, s + 0.03, f"{s:.2f}×", ha="center", fontsize=9)
    ax.set_xticks(positions, [str(w) for w in workers])
    ax.set_xlabel("workers")
    ax.set_ylabel("speedup")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="upper left")
    fig.tight_layout()
    if out is not None:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, dpi=100)
    return fig
