"""Run outputs: Monitor CSV, TensorBoard scalars, summary.json and console progress."""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import numpy as np

MONITOR_FILE = "monitor.csv"


class MonitorWriter:
    """Episode log in stable-baselines3's Monitor format: a JSON comment line, then ``r,l,t`` (and ``columns``:
    a multi-agent env's return of each agent, ``r_<agent>``, after them; Monitor readers read columns by name)."""

    def __init__(self, path: Path, env_id: str, columns: tuple[str, ...] = ()):
        self.path = path
        if path.exists() and path.stat().st_size > 0:
            with path.open() as f:
                header = json.loads(f.readline()[1:])
                self.rows = max(0, sum(1 for line in f if line.strip()) - 1)  # less the "r,l,t" line
            self.t_start = float(header["t_start"])
            self.file = path.open("a")
        else:
            self.t_start = time.time()
            self.rows = 0
            self.file = path.open("w")
            self.file.write("#" + json.dumps({"t_start": self.t_start, "env_id": env_id}) + "\n")
            self.file.write(",".join(("r", "l", "t", *columns)) + "\n")
        self.file.flush()

    def write(self, returns: list[float], lengths: list[int], extra: list[list[float]] | None = None) -> None:
        if not returns:
            return
        t = round(time.time() - self.t_start, 6)
        tails = ["".join(f",{v:.6g}" for v in row) for row in extra] if extra else [""] * len(returns)
        self.file.writelines(f"{r:.6g},{n},{t}{tail}\n" for r, n, tail in zip(returns, lengths, tails))
        self.file.flush()
        self.rows += len(returns)

    def close(self) -> None:
        self.file.close()


def read_monitor(path: Path) -> dict[str, np.ndarray]:
    """Read a Monitor CSV (distrl's or stable-baselines3's) into arrays r, l, t."""
    with path.open() as f:
        first = f.readline()
        if not first.startswith("#"):
            raise ValueError(f"{path}: not a Monitor file (first line must be a '#{{...}}' header)")
        header = f.readline().strip().split(",")
        rows = [line.strip().split(",") for line in f if line.strip()]
    columns = {name: i for i, name in enumerate(header)}
    for name in ("r", "l", "t"):
        if name not in columns:
            raise ValueError(f"{path}: Monitor header lacks column {name!r}")
    return {name: np.array([float(row[columns[name]]) for row in rows]) for name in ("r", "l", "t")}


def monitor_agents(path: Path) -> int:
    """How many agents a Monitor file has a return column for (``r_<agent>`` after ``r,l,t``; 0: a single-agent
    run). A multi-agent game's length ``l`` counts game steps, each one step of every agent."""
    with path.open() as f:
        f.readline()  # the JSON header
        return sum(column.startswith("r_") for column in f.readline().strip().split(","))


def truncate_monitor(path: Path, rows: int) -> list[float]:
    """Keep a Monitor file's header and its first ``rows`` episodes; returns their returns.

    A run resumed from a checkpoint replays the steps after it, so the episodes the
    interrupted run logged after that checkpoint must go, or they would be counted twice.
    """
    if not path.exists():
        return []
    lines = path.read_text().splitlines(keepends=True)
    kept = lines[: 2 + rows]
    if len(kept) < len(lines):
        tmp = path.with_suffix(path.suffix + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return [float(line.split(",", 1)[0]) for line in kept[2:] if line.strip()]


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


class Console:
    """Progress on a terminal (a rich bar), or plain lines at most every few seconds otherwise, counted in
    what bounds the run: ``unit`` is "steps", or "iterations" for a run stopped by --iterations."""

    def __init__(
        self, total: int, unit: str, quiet: bool, every_s: float = 5.0, rate: str = "SPS", value: str = "return"
    ):
        """``rate`` and ``value`` label the two figures each update shows (steps per second, mean return)."""
        self.rate, self.value = rate, value
        self.quiet = quiet
        self.total = total
        self.unit = unit
        self.every_s = every_s
        self._last = 0.0
        self._progress = None
        if not quiet and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                TimeRemainingColumn(),
                transient=False,
            )
            self._task = self._progress.add_task(unit, total=total, info="")
            self._progress.start()

    def update(self, done: int, sps: float, mean_return: float | None, extra: str = "") -> None:
        if self.quiet:
            return
        ret = "n/a" if mean_return is None else f"{mean_return:.{1 if self.value == 'return' else 3}f}"
        info = f"{self.rate} {sps:,.0f}  {self.value} {ret}{extra}"
        if self._progress is not None:  # a run may pass its total by part of an iteration: the bar shows it
            self._progress.update(self._task, total=max(self.total, done), completed=done, info=info)
            return
        now = time.monotonic()
        if now - self._last >= self.every_s or done >= self.total:
            self._last = now
            print(f"{self.unit} {done:,}/{self.total:,}  {info}", file=sys.stderr, flush=True)

    def episodes(self, label: str, total: int) -> EpisodeProgress:
        """Progress of an evaluation of ``total`` episodes, shown as the run's own progress is."""
        return EpisodeProgress(self, label, total)

    def line(self, text: str) -> None:
        if self.quiet:
            return
        if self._progress is not None:
            self._progress.console.print(text)
        else:
            print(text, file=sys.stderr, flush=True)

    def close(self, done: int | None = None) -> None:
        """Stop the bar, first brought to ``done`` (the real count); lines printed after it come below it."""
        if self._progress is not None:
            if done is not None:
                self._progress.update(self._task, total=max(self.total, done), completed=done)
            self._progress.stop()
            self._progress = None


class EpisodeProgress:
    """An evaluation's progress, episode k of n: a second bar under the run's on a terminal, else a line at
    most every ``every_s`` seconds, the first ``every_s`` after it began (quick evaluations print none)."""

    def __init__(self, console: Console, label: str, total: int):
        self.console, self.label, self.total = console, label, total
        self._last = time.monotonic()
        self._task = None
        if console._progress is not None:
            self._task = console._progress.add_task(label, total=total, info="")

    def __call__(self, finished: int, steps: int) -> None:
        """After a vector step: ``finished`` episodes have ended, whose steps and those of the episodes under way
        add up to ``steps``."""
        if self.console.quiet:
            return
        info = f"{steps:,} env steps"
        if self.console._progress is not None and self._task is not None:
            self.console._progress.update(self._task, completed=finished, info=info)
            return
        now = time.monotonic()
        if now - self._last >= self.console.every_s:
            self._last = now
            print(f"{self.label}: episodes {finished}/{self.total}  {info}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Remove the bar (the evaluation's result is a line of its own)."""
        if self.console._progress is not None and self._task is not None:
            self.console._progress.remove_task(self._task)
        self._task = None


def _quiet_tensorboard_writer_threads() -> None:
    """TensorBoard writes from a thread of its own. A write that fails there (a full disk) is kept for the writer,
    which raises it in the training thread at its next call, where the run turns it into its one-line error; the
    thread also dies of it, and Python's default hook would print that second traceback into the middle of the
    line. Threads of TensorBoard's writer that die of an OSError end unprinted; every other thread's end is
    printed as before."""
    previous = threading.excepthook
    if getattr(previous, "quiets_tensorboard", False):
        return

    def hook(args: Any) -> None:
        writer_thread = type(args.thread).__module__.startswith("tensorboard.")  # a thread gone already: NoneType
        if not (writer_thread and isinstance(args.exc_value, OSError)):
            previous(args)

    hook.quiets_tensorboard = True  # type: ignore[attr-defined]
    threading.excepthook = hook


class RunLogger:
    """Everything a run writes besides checkpoints. Only the main worker has one."""

    def __init__(self, run_dir: Path, env_id: str, monitor: bool = True, agents: tuple[str, ...] = ()):
        """``monitor=False``: a run without episodes (GRPO) writes no monitor.csv. ``agents``: a multi-agent env's,
        whose returns get a column each after the team's."""
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)
        self.env_id = env_id
        self.columns = tuple(f"r_{agent}" for agent in agents)
        self.monitor = MonitorWriter(run_dir / MONITOR_FILE, env_id, self.columns) if monitor else None
        self.rank_monitors: dict[int, MonitorWriter] = {}
        self.recent_returns: deque[float] = deque(maxlen=100)
        self._tb: Any = None
        self._last_scalars = float("-inf")
        self.trackers: list[Any] = []

    @classmethod
    def start(
        cls,
        run_dir: Path,
        env_id: str,
        config: dict[str, Any],
        track: tuple[str, ...],
        project: str,
        monitor: bool = True,
        agents: tuple[str, ...] = (),
    ) -> RunLogger:
        """A run directory's logger with config.json written and the trackers started (closed again if one fails)."""
        logger = cls(run_dir, env_id, monitor, agents)
        write_json_atomic(run_dir / "config.json", config)
        try:
            logger.track(track, project, config)
        except BaseException:
            logger.close()
            raise
        return logger

    def track(self, names: tuple[str, ...], project: str, config: dict[str, Any]) -> None:
        """Send everything TensorBoard gets to these trackers too (see :mod:`distrl.run.tracking`)."""
        from distrl.run.tracking import open_trackers

        self.trackers = open_trackers(names, self.run_dir, project, config)

    @property
    def tb(self) -> Any:
        if self._tb is None:  # tensorboard's import costs about a second: only when first used
            from torch.utils.tensorboard import SummaryWriter

            _quiet_tensorboard_writer_threads()
            self._tb = SummaryWriter(str(self.run_dir))
        return self._tb

    def episodes(
        self,
        returns: list[float],
        lengths: list[int],
        step: int,
        rank: int | None = None,
        agent_returns: list[list[float]] | None = None,
    ) -> None:
        """Log finished episodes; with ``rank`` also to that worker's own ``ranks/rank-N.monitor.csv``.
        ``agent_returns``: a multi-agent env's return of each agent in each episode (games), in the order of
        the logger's ``agents``."""
        self.monitor.write(returns, lengths, agent_returns)
        if rank is not None:
            if rank not in self.rank_monitors:
                (self.run_dir / "ranks").mkdir(exist_ok=True)
                self.rank_monitors[rank] = MonitorWriter(
                    self.run_dir / "ranks" / f"rank-{rank}.monitor.csv", self.env_id, self.columns
                )
            self.rank_monitors[rank].write(returns, lengths, agent_returns)
        self.recent_returns.extend(returns)
        if returns:
            values = {
                "charts/episodic_return": float(np.mean(returns)),
                "charts/episodic_length": float(np.mean(lengths)),
            }
            if agent_returns:  # each agent's mean return, as charts/episodic_return/r_<agent>
                means = np.mean(np.asarray(agent_returns, np.float64), 0)
                values.update({f"charts/episodic_return/{c}": float(m) for c, m in zip(self.columns, means)})
            for name, value in values.items():
                self.tb.add_scalar(name, value, step)
            for tracker in self.trackers:
                tracker.scalars(values, step)

    def monitor_rows(self) -> dict[str, int]:
        """Episodes logged so far in each Monitor file, by path relative to the run directory."""
        writers = [w for w in (self.monitor, *self.rank_monitors.values()) if w is not None]
        return {str(w.path.relative_to(self.run_dir)): w.rows for w in writers}

    def rewind(self, rows: dict[str, int]) -> None:
        """Cut each Monitor file back to the episodes a checkpoint had seen (see :func:`truncate_monitor`)."""
        if self.monitor is None:  # a run without episodes
            return
        self.monitor.close()
        for writer in self.rank_monitors.values():
            writer.close()
        self.rank_monitors = {}  # reopened, in append mode, when their workers next log
        kept: list[float] = []
        for name, n in rows.items():
            returns = truncate_monitor(self.run_dir / name, n)
            if name == MONITOR_FILE:
                kept = returns
        self.monitor = MonitorWriter(self.run_dir / MONITOR_FILE, self.env_id)
        self.recent_returns.clear()
        self.recent_returns.extend(kept)

    def start_afresh(self) -> None:
        """Log a run started over in this directory (not resumed) from its first episode: the Monitor files
        an earlier, unfinished start left here (killed before its first checkpoint) go."""
        if self.monitor is None:
            return
        stale = sorted((self.run_dir / "ranks").glob("rank-*.monitor.csv"))
        if self.monitor.rows == 0 and not stale:
            return
        for writer in [self.monitor, *self.rank_monitors.values()]:
            writer.close()
        self.rank_monitors = {}
        for path in [self.run_dir / MONITOR_FILE, *stale]:
            path.unlink(missing_ok=True)
        self.monitor = MonitorWriter(self.run_dir / MONITOR_FILE, self.env_id)
        self.recent_returns.clear()

    def scalars(self, values: dict[str, float], step: int, every_s: float = 0.0) -> None:
        """Write scalars to TensorBoard; with ``every_s``, at most that often (short iterations)."""
        now = time.monotonic()
        if every_s and now - self._last_scalars < every_s:
            return
        self._last_scalars = now
        for name, value in values.items():
            self.tb.add_scalar(name, value, step)
        for tracker in self.trackers:
            tracker.scalars(values, step)

    def summary(self, values: dict[str, Any]) -> None:
        """The run's summary.json, and its figures to the trackers."""
        write_json_atomic(self.run_dir / "summary.json", values)
        for tracker in self.trackers:
            tracker.summary(values)

    @property
    def mean_return(self) -> float | None:
        return float(np.mean(self.recent_returns)) if self.recent_returns else None

    def close(self) -> None:
        if self.monitor is not None:
            self.monitor.close()
        for monitor in self.rank_monitors.values():
            monitor.close()
        if self._tb is not None:
            self._tb.close()
        trackers, self.trackers = self.trackers, []
        from distrl.run.tracking import close_trackers

        close_trackers(trackers)
