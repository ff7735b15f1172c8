"""The run lifecycle every trainer shares: start or resume, the events it reports, checkpoints, the main
worker's state broadcast to the others so that every worker starts alike, and the end (final evaluation,
model, summary.json, the end line). Trainers differ in where their batches come from and in their update;
environment trainers add their envs in ``common.py``, GRPO's trainer its task in ``group.py``."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl._version import __version__
from distrl.algos.protocols import LocalSync, Sync
from distrl.config import ConfigError, RunConfig, StrategyConfig, to_dict
from distrl.envs.names import named_code
from distrl.run import checkpoint, preemption, trust
from distrl.run.logs import MONITOR_FILE, Console, RunLogger, write_json_atomic
from distrl.run.quiet import route_to_run_log
from distrl.training.malloc import keep_freed_memory
from distrl.training.precision import bf16_slow_note


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' is not available on this machine: use --device cpu or auto")
    return torch.device(device)


def set_cpu_options(run: RunConfig) -> None:
    """This process's CPU settings for a run: torch's intra-op threads and subnormal flushing, and the C
    allocator's thresholds (:mod:`distrl.training.malloc`)."""
    torch.set_num_threads(run.threads)  # default 1: for small networks a second thread only contends
    torch.set_flush_denormal(run.flush_denormal)
    if run.keep_freed_memory:
        keep_freed_memory()


def resumed_line(at: str, path: Path) -> str:
    """The event a resumed run logs: where it goes on from, and torchrun's restart count if it restarted it."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"resumed at {at} from {path}" + (f" (torchrun restart {restart})" if restart != "0" else "")


class RunState:
    """A run's lifecycle, checkpoints and start-up broadcast (the trainers hold the attributes below);
    subclasses implement the tensor hooks, ``start_segment``, ``summary`` and ``end_line``."""

    algo_name: str
    run: RunConfig
    cfg: Any
    requested: Any
    strategy: StrategyConfig
    sync: Sync
    is_main: bool
    device: torch.device
    env_id: str
    run_dir: Path | None
    logger: RunLogger | None
    console: Console | None
    events: list[str]
    extra_summary: dict[str, Any]
    steps: int
    iteration: int
    episodes: int
    policy_version: int
    train_s: float
    update_s: float
    wall_before: float
    _created: float

    def start_run(
        self,
        run: RunConfig,
        cfg: Any,
        sync: Sync | None,
        strategy: StrategyConfig | None,
        requested: Any,
        device: torch.device | None,
        run_dir: Path | None,
    ) -> None:
        """What every trainer starts with: the run and algorithm configs, its sync (``LocalSync`` alone), the
        strategy, the config as the user asked for it (before scaling), whether it is rank 0, its device, and
        zeroed counters, no events, and no logger or console yet."""
        self.run, self.cfg = run, cfg
        self.sync = sync if sync is not None else LocalSync()
        self.strategy = strategy if strategy is not None else StrategyConfig()
        self.requested = requested if requested is not None else cfg
        self.is_main = self.sync.rank == 0
        self.device = device if device is not None else resolve_device(run.device)
        if self.device.type == "cpu":
            set_cpu_options(run)
        self.steps = self.iteration = self.episodes = self.policy_version = 0
        self.train_s = self.update_s = 0.0
        self.wall_before = 0.0
        """Wall time of the earlier processes of a resumed run, up to its checkpoint."""
        self._created = time.perf_counter()
        self.events = []
        self.extra_summary = {}
        """Figures a strategy adds to summary.json (ddp: the replicas' final parameter checksums)."""
        self.run_dir = run_dir
        self.logger = None
        self.console = None
        """Progress and events on the terminal: a run directory's main worker has one; the API's
        ``learn(progress_bar=True)`` lends one for its call."""
        self.stopped_by = 0
        """The signal this run stopped on after its checkpoint (see :mod:`distrl.run.preemption`), or 0."""
        self._last_checkpoint_at = time.monotonic()
        preemption.reinstall()  # after an engine's start (Ray's driver takes SIGTERM)
        preemption.listen()

    def state_tensors(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        raise NotImplementedError

    def start_segment(self) -> None:
        raise NotImplementedError

    # ---- start, events, end ----

    def run_to_end(self, resume_path: Path | None, start: float) -> dict[str, Any]:
        """Resume if asked, train to the configured end, then finish (final eval, model, summary)."""
        try:
            self.begin(resume_path)
            self.train()
        except BaseException:
            self.close()
            raise
        return self.finish(time.perf_counter() - start)

    def train(self) -> Any:
        raise NotImplementedError

    def begin(self, resume_path: Path | None) -> None:
        """Load the checkpoint to resume from and say so, or clear the episodes an unfinished earlier start
        left in the run directory (killed before its first checkpoint). On the main worker only."""
        if self.logger is not None and not self.run.debug:  # other libraries' warnings: in the run, not on screen
            self.restore_warnings = route_to_run_log(self.logger.run_dir)
        note = bf16_slow_note(self.run, self.strategy) if self.is_main else None
        if note is not None:
            self.report(note)
        if resume_path is not None:
            self.load_checkpoint(resume_path)
            self.report(resumed_line(f"{self.progress_unit()} {self.steps:,}", resume_path))
        elif self.logger is not None:
            self.logger.start_afresh()

    restore_warnings: Callable[[], None] | None = None

    def progress_unit(self) -> str:
        """What ``steps`` counts: environment steps, or a learner's steps."""
        return "step"

    def report(self, message: str, on_console: bool = True) -> None:
        """An event worth a line: on the console (unless ``on_console`` is off: the caller prints it itself), in
        ``events.log`` and in summary.json."""
        stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
        self.events.append(stamped)
        if self.console is not None and on_console:
            self.console.line(message)
        if self.logger is not None:
            with (self.logger.run_dir / "events.log").open("a") as f:
                f.write(stamped + "\n")

    def end_collection(self) -> dict[str, Any]:
        """Hook: stop collecting (a pipeline drains its generators); what summary.json adds."""
        return {}

    def final_evaluation(self) -> dict[str, Any]:
        """Hook: the evaluation at the end, on the main worker; figures summary.json adds to :meth:`summary`'s."""
        return {}

    def after_summary(self, summary: dict[str, Any]) -> None:
        """Hook, on the main worker with a run directory: what else the end writes (a plot, a model directory)."""

    def summary(self) -> dict[str, Any]:
        """What every run's summary.json holds; trainers add their own figures, then ``extra_summary``'s."""
        return {
            "algo": self.run.algo,
            "env": self.env_id,
            "strategy": self.strategy.strategy,
            "workers": self.strategy.workers if self.strategy.strategy != "single" else 1,
            "train_s": self.train_s,
            "update_s": self.update_s,
            "sync_s": self.sync.sync_s,
            "events": self.events,
            "distrl_version": __version__,
        }

    def end_line(self, summary: dict[str, Any]) -> str:
        """The one line a finished run prints: what it did, its times (labelled), the evaluation."""
        raise NotImplementedError

    def progress_done(self) -> int:
        return self.steps

    def finish(self, wall_s: float) -> dict[str, Any]:
        """Final evaluation, model and summary.json (main worker), then close; ``wall_s`` is this
        process's time up to here, to which the end's collection and final evaluation are added, and a
        resumed run adds its earlier processes' (``wall_before``). A run stopped by a signal has written its
        checkpoint instead: it closes and raises :class:`~distrl.run.preemption.Stopped`."""
        if self.stopped_by:
            self.stop()
        ending = time.perf_counter()
        self.extra_summary.update(self.end_collection())
        evaluation = self.final_evaluation() if self.is_main else {}
        wall_s += time.perf_counter() - ending  # the end line's "total" includes the final evaluation
        summary = {**self.summary(), **evaluation, "wall_s": self.wall_before + wall_s}
        if self.run_dir is not None and (self.is_main or self.keeps_worker_state):
            self.save_checkpoint(self.run_dir / checkpoint.MODEL_DIR)
        if self.is_main and self.run_dir is not None:
            if self.logger is not None:
                self.logger.summary(summary)
            else:
                write_json_atomic(self.run_dir / "summary.json", summary)
            self.after_summary(summary)
            if self.console is not None:
                self.console.close(self.progress_done())  # the bar ends on the real count, above the summary
                self.console.line(self.end_line(summary))
        self.close()
        return summary

    def stop(self) -> None:
        """End a run stopped by a signal: say where it stopped, flush and close everything, raise Stopped."""
        at = f"{self.progress_unit()} {self.steps:,}"
        message = ""
        if self.is_main and self.run_dir is not None:
            written = self.run_dir / checkpoint.CHECKPOINTS_DIR / f"step-{self.steps:012d}"
            message = (
                f"stopped by {preemption.name(self.stopped_by)} at {at}: checkpoint {written}; "
                f"continue with: distrl train --resume {self.run_dir}"
            )
            self.report(message, on_console=False)  # the command prints it once, as it exits
            if self.console is not None:
                self.console.close(self.progress_done())
        self.close()
        raise preemption.Stopped(self.stopped_by, message)

    def release(self) -> None:
        """Hook: close what the trainer holds besides its logs (envs, workers, actors)."""

    def close(self) -> None:
        if self.console is not None:
            self.console.close()
        self.release()
        if self.logger is not None:
            logger, self.logger = self.logger, None
            try:
                logger.close()
            except OSError:
                if sys.exc_info()[0] is None:  # closing after a failure (a full disk): that failure is the news
                    raise
        if self.restore_warnings is not None:
            self.restore_warnings()
            self.restore_warnings = None

    # ---- checkpoints and the start-up broadcast ----

    def broadcast_tensors(self) -> list[torch.Tensor]:
        """Tensors that rank 0 sends to every worker at start-up (parameters, optimizer state,
        packed statistics); parameters and optimizer state are the live tensors themselves."""
        raise NotImplementedError

    def env_name(self) -> str:
        """The env (or task) as config.json and checkpoints record it, for any process to rebuild."""
        return self.env_id

    def config_dict(self) -> dict[str, Any]:
        return {
            "run": to_dict(self.run.replace(env=self.env_name())),
            "strategy": to_dict(self.strategy),
            self.algo_name: to_dict(self.requested),
            f"{self.algo_name}_effective": to_dict(self.cfg),
        }

    def counters(self) -> dict[str, Any]:
        return {
            "steps": self.steps,
            "iteration": self.iteration,
            "episodes": self.episodes,
            "policy_version": self.policy_version,
            "train_s": self.train_s,
            "wall_s": self.wall_before + time.perf_counter() - self._created,
        }

    def checkpoint_state(self) -> dict[str, Any]:
        """Hook: what a checkpoint's JSON state records beside the counters (spaces, a task's counts)."""
        return {}

    def checkpoint_contents(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        state = {
            "algo": self.algo_name,
            "env_id": self.env_name(),
            "config": self.config_dict(),
            **self.counters(),
            **self.checkpoint_state(),
            "distrl_version": __version__,
            "monitor_rows": self.logger.monitor_rows() if self.logger is not None else {},
        }
        return self.state_tensors(), state

    def save_checkpoint(self, path: Path | None = None) -> Path | None:
        """Write a checkpoint (main worker); a periodic one (no ``path``) also starts a new segment.

        Each periodic checkpoint is an episode boundary: every worker restarts its
        environments and random streams from seeds derived from the step count (see
        ``start_segment``), so a run resumed from it continues exactly as the
        uninterrupted run does.
        """
        written = None
        target = path
        if target is None and self.run_dir is not None:
            target = self.run_dir / checkpoint.CHECKPOINTS_DIR / f"step-{self.steps:012d}"
        if self.is_main and target is not None:
            written = self.write_checkpoint(target)
            self.after_checkpoint(target)
            if path is None and self.run.keep_checkpoints:
                checkpoint.prune(target.parent.parent, self.run.keep_checkpoints)
        self._last_checkpoint_at = time.monotonic()
        if self.sync.world_size > 1 and self.keeps_worker_state:
            self.sync.all_sum(np.zeros(1))  # a barrier: past it, the main worker has written the directory
            if not self.is_main and target is not None:
                self.save_worker_state(target)
        if path is None:
            self.start_segment()
        return written

    def stop_votes(self) -> np.ndarray:
        """This worker's part of the all-reduce each iteration already makes, so that every worker decides alike:
        [a stop signal came here, the main worker's clock says a checkpoint is due (--checkpoint-every-s)]."""
        every_s = self.run.checkpoint_every_s
        due = self.is_main and every_s > 0 and time.monotonic() - self._last_checkpoint_at >= every_s
        return np.array([float(preemption.requested() > 0), float(due)])

    def checkpoint_or_stop(self, due_by_steps: bool, votes: np.ndarray, more: bool) -> bool:
        """After an iteration, with the summed :meth:`stop_votes`: write a checkpoint if one is due by steps or
        by the clock and ``more`` steps are to come, or if a worker got a stop signal; True to stop here."""
        stop = votes[0] > 0
        if stop or (more and (due_by_steps or votes[1] > 0)):
            self.save_checkpoint()
        if stop:
            self.stopped_by = preemption.requested() or int(preemption.STOP_SIGNALS[0])
        return stop

    def write_checkpoint(self, path: Path) -> Path:
        """Write the checkpoint's tensors and state at ``path``. A run whose config names code (a custom env,
        wrappers, a policy factory, rewards) is recorded as this user's, to load without --trust-code."""
        tensors, state = self.checkpoint_contents()
        written = checkpoint.save(path, tensors, state)
        if named_code(self.run, self.cfg) and not self.trust_failed:
            problem = trust.remember(written, state)
            if problem is not None:  # said once: loading this run will ask for --trust-code
                self.trust_failed = True
                self.report(f"{problem}; evaluating this run will need --trust-code")
        return written

    trust_failed = False

    def after_checkpoint(self, path: Path) -> None:
        """Hook: write what does not belong in the checkpoint's tensors (a replay buffer)."""

    keeps_worker_state = False
    """Whether every worker keeps state of its own in checkpoints (:meth:`save_worker_state`), beside the
    main worker's; then every worker calls :meth:`save_checkpoint` together."""

    def save_worker_state(self, path: Path) -> None:
        """Hook, on each worker but the main one: add this worker's own state (its replay buffer) to the
        checkpoint the main worker has just written at ``path``."""

    def load_worker_state(self, path: Path) -> None:
        """Hook, on each worker but the main one, after the start-up broadcast: read back what
        :meth:`save_worker_state` kept in the checkpoint at ``path``."""

    def load_checkpoint_state(self, state: dict[str, Any], path: Path) -> None:
        """Hook: check and restore what :meth:`checkpoint_state` recorded, before the tensors load."""

    def load_checkpoint(self, path: Path, rewind_logs: bool = True) -> None:
        """Load the checkpoint at ``path``: tensors, statistics and counters, then start a new segment.

        Args:
            path: a checkpoint directory.
            rewind_logs: cut this run's Monitor files back to the episodes the checkpoint had seen, as a
                resumed run must (it replays the steps after it). False where the checkpoint is another
                run's (a population-based training member copying a better one): this run's own logs are
                its history and stay as they are.
        """
        tensors, state = checkpoint.load(path)
        if state.get("algo") != self.algo_name:
            raise ConfigError(f"checkpoint={str(path)!r} holds a {state.get('algo')!r} model, not {self.algo_name}")
        self.load_checkpoint_state(state, path)
        try:
            self.load_state_tensors(tensors, path)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"checkpoint={str(path)!r} does not fit this model: {exc}") from None
        self.steps, self.iteration = state["steps"], state["iteration"]
        self.episodes, self.policy_version = state["episodes"], state["policy_version"]
        self.train_s = state.get("train_s", 0.0)
        self.wall_before = state.get("wall_s", 0.0)
        if self.logger is not None and rewind_logs:  # older checkpoints: the main Monitor file holds every episode
            self.logger.rewind(state.get("monitor_rows") or {MONITOR_FILE: self.episodes})
        self.start_segment()

    COUNTERS = ("steps", "iteration", "episodes", "policy_version", "train_s")
    """The counters a worker receives with the main worker's state (:meth:`counters_tensor`)."""

    def counters_tensor(self) -> torch.Tensor:
        return torch.tensor([getattr(self, name) for name in self.COUNTERS], dtype=torch.float64)

    def broadcast_state(self, sync: Sync | None = None) -> None:
        """Make every worker hold the main worker's tensors, statistics and counters (over ``sync``, by default
        the trainer's own; decoupled's player sends over the whole world's)."""
        tensors, counters = self.broadcast_tensors(), self.counters_tensor()
        exchange_start_state(tensors, counters, sync if sync is not None else self.sync)
        for name, value in zip(self.COUNTERS, counters.tolist()):
            setattr(self, name, float(value) if name == "train_s" else int(value))
        self.after_broadcast(tensors)
        self.start_segment()

    def after_broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Hook: unpack what :meth:`broadcast_tensors` packed; refresh acting copies and caches."""


def exchange_start_state(tensors: list[torch.Tensor], counters: torch.Tensor, sync: Sync) -> None:
    """The start-up broadcast: rank 0's ``tensors``, then its counters, overwrite every other rank's in place."""
    for tensor in tensors:
        sync.broadcast_(tensor)
    sync.broadcast_(counters)


def section(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    """The checkpoint entries named ``prefix/name``, keyed by ``name``."""
    start = len(prefix) + 1
    return {key[start:]: value for key, value in tensors.items() if key.startswith(prefix + "/")}
