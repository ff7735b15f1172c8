"""What a trainer carries beyond its process: checkpoints to resume from, and the main worker's state
broadcast to the others so that every worker starts alike."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

import distrl
from distrl import checkpoint
from distrl.config import ALGO_CONFIGS, ConfigError, RunConfig, StrategyConfig, from_dict, to_dict
from distrl.envs import VecEnv
from distrl.env_names import portable_env_name
from distrl.logs import MONITOR_FILE, RunLogger
from distrl.protocols import Sync


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    assert isinstance(space, spaces.Box)
    return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "shape": list(space.shape)}


def configs_from_checkpoint(path: Path) -> tuple[RunConfig, StrategyConfig, Any, dict[str, Any]]:
    """The run, strategy and (requested) algorithm configs stored in a checkpoint, and its JSON state."""
    _, state = checkpoint.load(path)
    config = state["config"]
    algo = state.get("algo", "ppo")
    if algo not in ALGO_CONFIGS:
        raise ConfigError(f"checkpoint={str(path)!r} holds an unknown algorithm {algo!r}")
    return (from_dict(RunConfig, config["run"]), from_dict(StrategyConfig, config["strategy"]),
            from_dict(ALGO_CONFIGS[algo], config[algo]), state)


def resumed_line(at: str, path: Path) -> str:
    """The event a resumed run logs: where it goes on from, and torchrun's restart count if it restarted it."""
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"resumed at {at} from {path}" + (f" (torchrun restart {restart})" if restart != "0" else "")


class RunState:
    """Checkpoints and the start-up broadcast of a trainer (:class:`~distrl.training.common.TrainerBase`
    holds the attributes below); subclasses implement the tensor hooks and ``start_segment``."""

    algo_name: str
    run: RunConfig
    cfg: Any
    requested: Any
    strategy: StrategyConfig
    sync: Sync
    is_main: bool
    env: VecEnv
    env_id: str
    obs_dim: int
    run_dir: Path | None
    logger: RunLogger | None
    steps: int
    iteration: int
    episodes: int
    policy_version: int
    train_s: float
    wall_before: float
    _created: float

    def state_tensors(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        raise NotImplementedError

    def start_segment(self) -> None:
        raise NotImplementedError

    def broadcast_tensors(self) -> list[torch.Tensor]:
        """Tensors that rank 0 sends to every worker at start-up (parameters, optimizer state,
        packed statistics); parameters and optimizer state are the live tensors themselves."""
        raise NotImplementedError

    def config_dict(self) -> dict[str, Any]:
        return {"run": to_dict(self.run.replace(env=portable_env_name(self.env_id))), "strategy": to_dict(self.strategy),
                self.algo_name: to_dict(self.requested), f"{self.algo_name}_effective": to_dict(self.cfg)}

    def counters(self) -> dict[str, Any]:
        return {"steps": self.steps, "iteration": self.iteration, "episodes": self.episodes,
                "policy_version": self.policy_version, "train_s": self.train_s,
                "wall_s": self.wall_before + time.perf_counter() - self._created}

    def checkpoint_contents(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        state = {
            "algo": self.algo_name, "env_id": portable_env_name(self.env_id), "config": self.config_dict(), **self.counters(),
            "observation_dim": self.obs_dim, "action_space": space_to_json(self.env.single_action_space),
            "distrl_version": distrl.__version__,
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
            tensors, state = self.checkpoint_contents()
            written = checkpoint.save(target, tensors, state)
            self.after_checkpoint(target)
        if self.sync.world_size > 1 and self.keeps_worker_state:
            self.sync.all_sum(np.zeros(1))  # a barrier: past it, the main worker has written the directory
            if not self.is_main and target is not None:
                self.save_worker_state(target)
        if path is None:
            self.start_segment()
        return written

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

    def load_checkpoint(self, path: Path) -> None:
        tensors, state = checkpoint.load(path)
        if state.get("algo") != self.algo_name:
            raise ConfigError(f"checkpoint={str(path)!r} holds a {state.get('algo')!r} model, not {self.algo_name}")
        try:
            self.load_state_tensors(tensors, path)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise ConfigError(f"checkpoint={str(path)!r} does not fit this model: {exc}") from None
        self.steps, self.iteration = state["steps"], state["iteration"]
        self.episodes, self.policy_version = state["episodes"], state["policy_version"]
        self.train_s = state.get("train_s", 0.0)
        self.wall_before = state.get("wall_s", 0.0)
        if self.logger is not None:  # older checkpoints: the main Monitor file holds every episode
            self.logger.rewind(state.get("monitor_rows") or {MONITOR_FILE: self.episodes})
        self.start_segment()

    COUNTERS = ("steps", "iteration", "episodes", "policy_version", "train_s")
    """The counters a worker receives with the main worker's state (:meth:`counters_tensor`)."""

    def counters_tensor(self) -> torch.Tensor:
        return torch.tensor([getattr(self, name) for name in self.COUNTERS], dtype=torch.float64)

    def broadcast_state(self) -> None:
        """Make every worker hold the main worker's tensors, statistics and counters."""
        tensors = self.broadcast_tensors()
        for tensor in tensors:
            self.sync.broadcast_(tensor)
        counters = self.counters_tensor()
        self.sync.broadcast_(counters)
        for name, value in zip(self.COUNTERS, counters.tolist()):
            setattr(self, name, float(value) if name == "train_s" else int(value))
        self.after_broadcast(tensors)
        self.start_segment()

    def after_broadcast(self, tensors: list[torch.Tensor]) -> None:
        """Hook: unpack what :meth:`broadcast_tensors` packed; refresh acting copies and caches."""
