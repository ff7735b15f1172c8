"""The off-policy loop (SAC): act → store in the replay buffer → gradient steps → log → evaluate → checkpoint."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from distrl.algos.protocols import Sync
from distrl.algos.sac import SACAlgo
from distrl.config import ConfigError, RunConfig, SACConfig, StrategyConfig
from distrl.data.replay import CompactReplayBuffer, ReplayBuffer, Transitions
from distrl.data.replay_memory import check_replay_memory
from distrl.envs.names import shown_name
from distrl.envs.spaces import check_observation_space, from_bounds, stored_layout, to_bounds
from distrl.nets.factory import PolicySource, make_sac_networks
from distrl.training.common import TrainerBase
from distrl.training.replay_learner import ReplaySource, learn_from_actors

REPLAY_FILE = "replay.safetensors"


def make_sac_replay(cfg: SACConfig, obs_shape: tuple[int, ...], obs_dtype: np.dtype | type, action_dim: int) -> Any:
    """SAC's replay: actions in [-1, 1], each observation once with ``optimize_memory_usage``. The same class
    serves one process and the shared replay of many actors (``--strategy actor-learner``)."""
    buffer = CompactReplayBuffer if cfg.optimize_memory_usage else ReplayBuffer
    return buffer(cfg.buffer_size, obs_shape, action_dim, obs_dtype)


class ReplayOwner:
    """A trainer's replay (SAC's, DQN's): its own, or the one actors elsewhere fill; and the checkpoint hooks that
    keep it: with ``save_replay`` the main worker keeps its buffer in each checkpoint, and under ddp every other
    rank keeps its own beside it."""

    cfg: Any
    replay: Any
    sync: Sync
    actors: ReplaySource | None

    def take_replay(
        self, make_local: Callable[[], Any], collector_factory: Callable[[Any], ReplaySource] | None
    ) -> None:
        """Make this process's replay, or, with ``collector_factory`` (``--strategy actor-learner``, Ape-X), take
        the shared one its actors fill: its holder saves and loads it with checkpoints."""
        self.actors = None
        if collector_factory is None:
            self.replay = make_local()
            return
        self.actors = self.collector = collector_factory(self)  # type: ignore[attr-defined]
        self.replay = self.actors.replay

    def load_replay(self, path: Path) -> None:
        if self.cfg.save_replay and (path / REPLAY_FILE).exists():
            self.replay.load(path / REPLAY_FILE)

    def after_checkpoint(self, path: Path) -> None:
        if self.cfg.save_replay:
            self.replay.save(path / REPLAY_FILE)

    def _rank_replay(self, path: Path) -> Path:
        return path / f"replay-rank{self.sync.rank}.safetensors"

    def save_worker_state(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)  # a rank on another machine keeps its buffer there
        self.replay.save(self._rank_replay(path))

    def load_worker_state(self, path: Path) -> None:
        if self.cfg.save_replay and self._rank_replay(path).exists():
            self.replay.load(self._rank_replay(path))


class OffPolicyTrainer(ReplayOwner, TrainerBase):
    """Trains SAC on one worker's environments and replay buffer; the main worker logs and checkpoints."""

    algo_name = "sac"

    def __init__(
        self,
        run: RunConfig,
        cfg: SACConfig,
        sync: Sync | None = None,
        run_dir: Path | None = None,
        log: bool = True,
        strategy: StrategyConfig | None = None,
        requested: SACConfig | None = None,
        device: torch.device | None = None,
        policy: PolicySource = None,
        collector_factory: Callable[[OffPolicyTrainer], ReplaySource] | None = None,
    ):
        """``collector_factory``: actors that collect elsewhere into a replay they share (``--strategy
        actor-learner``, Ape-X), in place of this process's environments and replay."""
        self.policy_source = policy if policy is not None else run.policy
        super().__init__(run, cfg, sync, run_dir, log, strategy, requested, device)
        space = self.env.single_action_space
        assert isinstance(space, spaces.Box)
        self.action_dim = int(np.prod(space.shape))
        self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
        networks = make_sac_networks(
            self.env.single_observation_space, space, cfg, self.device, run.seed, self.policy_source, run.precision
        )
        self.algo = SACAlgo(cfg, networks, self.device, run.seed)
        self.take_replay(
            lambda: make_sac_replay(cfg, self.obs_shape, self.obs_dtype, self.action_dim), collector_factory
        )
        self.env_offset = self.sync.rank * cfg.n_envs
        self.keeps_worker_state = cfg.save_replay  # under ddp each rank keeps its own buffer in checkpoints
        if cfg.init_from:
            try:
                self._go_on_from(cfg.init_from)
            except BaseException:
                self.close()
                raise
        self.start_segment()

    @classmethod
    def check_env(cls, run: RunConfig, cfg: Any) -> None:
        """With ``init_from``, the run it names too, before any run directory is made: a CQL run with networks of
        this run's sizes."""
        super().check_env(run, cfg)
        if cfg.init_from:
            from distrl.training.init_from import check_goes_on_from, check_sac_fits, read_run

            _, state = read_run(cfg.init_from)
            check_goes_on_from("sac", cfg.init_from, state)
            check_sac_fits(cfg, cfg.init_from, state)

    def _go_on_from(self, init_from: str) -> None:
        """A CQL run's networks (``training/init_from.py``), and with ``keep_dataset`` its dataset in the replay."""
        from distrl.training.init_from import check_goes_on_from, check_strategy, dataset_of, read_run, sac_from_cql

        check_strategy(init_from, self.strategy.strategy if self.actors is None else "actor-learner")
        tensors, state = read_run(init_from)
        check_goes_on_from("sac", init_from, state)
        sac_from_cql(self.algo, tensors, state, init_from)
        if self.cfg.keep_dataset:
            data = dataset_of(state, init_from, self.sync.rank, self.sync.world_size)
            every = np.ones(data.size, dtype=bool)
            actions = from_bounds(data.actions, self.low, self.high)
            self.replay.add(data.obs, actions, data.rewards, data.next_obs, data.terminated, every)
        kept = f", its dataset's {self.replay.size:,} transitions in the replay" if self.cfg.keep_dataset else ""
        self.report(f"went on from the CQL run {init_from}: its policy, critics and entropy coefficient{kept}")

    @classmethod
    def check_spaces(cls, env_id: str, observation_space: Any, action_space: Any, cfg: Any) -> None:
        if not isinstance(action_space, spaces.Box):
            raise ConfigError(
                f"env={shown_name(env_id)!r} has a {type(action_space).__name__} action space; sac needs Box"
            )
        try:
            check_observation_space(observation_space)
        except ConfigError as exc:
            raise ConfigError(f"env={shown_name(env_id)!r}: {exc}") from None
        shape, dtype = stored_layout(observation_space)  # before the run directory or the buffer is made
        check_replay_memory(cfg.buffer_size, shape, dtype, int(np.prod(action_space.shape)), cfg.optimize_memory_usage)

    def to_env(self, action: np.ndarray) -> np.ndarray:
        """Rescale actions from [-1, 1] to the env's bounds."""
        return to_bounds(action, self.low, self.high)

    def start_segment(self) -> None:
        """Restart environments, exploration noise, replay sampling and update noise from the step count."""
        seed, n = self.run.seed, self.cfg.n_envs
        self.obs = self.env.reset(seed=seed + self.steps + self.env_offset).astype(self.obs_dtype)
        self.noise_rngs = [np.random.default_rng([seed, self.env_offset + i, self.steps]) for i in range(n)]
        self.sample_rng = np.random.default_rng([seed, self.sync.rank, self.steps, 0x5AC])
        self.algo.reseed(seed, self.sync.rank, self.steps)

    def _explore(self) -> np.ndarray:
        """Actions in [-1, 1]: uniform before ``learning_starts`` (unless the run went on from another), then
        sampled from the policy."""
        shape = (self.action_dim,)
        starting = self.steps < self.cfg.learning_starts * self.sync.world_size  # steps count all workers
        if starting and not self.cfg.init_from:  # a run that goes on from CQL plays its policy from the start
            return np.stack([rng.uniform(-1.0, 1.0, shape) for rng in self.noise_rngs]).astype(np.float32)
        noise = np.stack([rng.standard_normal(shape, dtype=np.float32) for rng in self.noise_rngs])
        return self.algo.actor.act(self.obs, noise)

    def train(self, total_steps: int | None = None, stop_at: int | None = None) -> dict[str, Any]:
        total = total_steps if total_steps is not None else self.run.total_steps
        limit = min(total, stop_at) if stop_at is not None else total
        if self.actors is not None:
            return learn_from_actors(self, self.actors, total, limit)
        cfg = self.cfg
        per_iteration = cfg.n_envs * cfg.train_freq * self.sync.world_size
        while self.steps < limit:
            start = time.perf_counter()
            returns: list[float] = []
            lengths: list[int] = []
            for _ in range(cfg.train_freq):
                action = self._explore()
                step = self.env.step(self.to_env(action))
                next_obs = step.obs.astype(self.obs_dtype)
                self.replay.add(self.obs, action, step.reward, next_obs, step.terminated.astype(np.float32), step.valid)
                self.obs = next_obs
                returns.extend(step.episode_returns.tolist())
                lengths.extend(step.episode_lengths.tolist())
            self.steps += per_iteration
            episodes, votes = self.count_episodes(len(returns))
            update_start = time.perf_counter()
            metrics: dict[str, float] = {}
            if self.steps >= cfg.learning_starts * self.sync.world_size and self.replay.size >= 1:
                for _ in range(cfg.gradient_steps):
                    batch = self.replay.sample(cfg.batch_size, self.sample_rng, self.device)
                    metrics = self.algo.update(batch, self.sync)
            self._end_iteration(start, update_start, updated=bool(metrics))
            self._log(returns, lengths, episodes, metrics)
            if self.end_of_iteration(per_iteration, votes, self.steps < total):
                break
        return self.summary()

    def learner_step(self, batch: Transitions, progress: float) -> tuple[dict[str, float], np.ndarray | None]:
        """One gradient step (SAC samples uniformly: no TD errors go back)."""
        return self.algo.update(batch, self.sync), None

    def beta(self, progress: float) -> float:
        return 1.0

    def after_steps(self, new_steps: int) -> None:
        """SAC's target critics follow its gradient steps, not the env steps."""

    def replay_recipe(self) -> functools.partial:
        """How to make this run's replay elsewhere (the holder of a replay that many actors share)."""
        return functools.partial(make_sac_replay, self.cfg, self.obs_shape, self.obs_dtype, self.action_dim)

    def weights(self) -> dict[str, Any]:
        """What actors collecting elsewhere act with: the policy version and the actor's parameters."""
        return {"version": self.policy_version, "params": self.algo.actor.params.flat()}

    def act_for_eval(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return self.to_env(self.algo.actor.act(obs.astype(self.obs_dtype), None))

    # ---- state ----

    def state_tensors(self) -> dict[str, torch.Tensor]:
        return self.algo.state_tensors()

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        self.algo.load_state_tensors(tensors)
        self.load_replay(path)

    def broadcast_tensors(self) -> list[torch.Tensor]:
        return self.algo.broadcast_tensors()

    def after_broadcast(self, tensors: list[torch.Tensor]) -> None:
        self.algo.after_broadcast(tensors[-1])
