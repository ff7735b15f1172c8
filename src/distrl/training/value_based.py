"""The value-based loop (DQN): act epsilon-greedily → store (n-step) transitions → gradient steps → target updates →
log → evaluate → checkpoint."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from distrl.algos.dqn import DQNAlgo
from distrl.algos.nstep import NStepAccumulator, NStepBatch
from distrl.algos.protocols import Sync
from distrl.config import ConfigError, DQNConfig, RunConfig, StrategyConfig
from distrl.data.prioritized import PrioritizedReplay
from distrl.data.replay import CompactReplayBuffer, ReplayBuffer, Transitions
from distrl.data.replay_memory import check_replay_memory
from distrl.envs.masks import random_actions
from distrl.envs.names import shown_name
from distrl.envs.spaces import check_observation_space, stored_layout
from distrl.nets.factory import PolicySource, make_q_network
from distrl.training.common import TrainerBase
from distrl.training.off_policy import ReplayOwner
from distrl.training.replay_learner import ReplaySource, learn_from_actors

ACTION_BYTES = 8
"""An action is stored as one int64 per transition."""


def replay_extra_bytes(cfg: DQNConfig) -> int:
    """Bytes per transition beside observations, action, reward and flag: the n-step discount, and the sum tree's
    share (up to two float64 nodes per row) with prioritised replay."""
    return 4 * (cfg.n_steps > 1) + 16 * cfg.prioritized_replay


def make_replay(
    cfg: DQNConfig, obs_shape: tuple[int, ...], obs_dtype: np.dtype | type
) -> ReplayBuffer | CompactReplayBuffer | PrioritizedReplay:
    """DQN's replay: int64 actions, a discount per transition for n-step returns, priorities if asked for. The same
    class serves one process and the shared replay of many actors (``--strategy actor-learner``)."""
    buffer_cls = CompactReplayBuffer if cfg.optimize_memory_usage else ReplayBuffer
    buffer = buffer_cls(cfg.buffer_size, obs_shape, (), obs_dtype, action_dtype=np.int64, discounts=cfg.n_steps > 1)
    if not cfg.prioritized_replay:
        return buffer
    return PrioritizedReplay(buffer, cfg.prioritized_replay_alpha, cfg.prioritized_replay_eps)


def check_dqn_spaces(env_id: str, observation_space: spaces.Space, action_space: spaces.Space, cfg: DQNConfig) -> None:
    """Fail before the run directory or the replay is made when DQN cannot act in these spaces or its replay
    would not fit in memory."""
    if not isinstance(action_space, spaces.Discrete):
        raise ConfigError(
            f"env={shown_name(env_id)!r} has a {type(action_space).__name__} action space; dqn needs Discrete "
            "(sac for Box actions, ppo for any)"
        )
    try:
        check_observation_space(observation_space)
    except ConfigError as exc:
        raise ConfigError(f"env={shown_name(env_id)!r}: {exc}") from None
    shape, dtype = stored_layout(observation_space)
    check_replay_memory(
        cfg.buffer_size,
        shape,
        dtype,
        1,
        cfg.optimize_memory_usage,
        action_bytes=ACTION_BYTES,
        extra_bytes=replay_extra_bytes(cfg),
    )


class DQNTrainer(ReplayOwner, TrainerBase):
    """Trains DQN on one worker's environments and replay buffer; the main worker logs and checkpoints."""

    algo_name = "dqn"

    def __init__(
        self,
        run: RunConfig,
        cfg: DQNConfig,
        sync: Sync | None = None,
        run_dir: Path | None = None,
        log: bool = True,
        strategy: StrategyConfig | None = None,
        requested: DQNConfig | None = None,
        device: torch.device | None = None,
        policy: PolicySource = None,
        collector_factory: Callable[[DQNTrainer], ReplaySource] | None = None,
    ):
        """``collector_factory``: actors that collect elsewhere into a replay they share (``--strategy
        actor-learner``, Ape-X), in place of this process's environments and replay."""
        self.policy_source = policy if policy is not None else run.policy
        super().__init__(run, cfg, sync, run_dir, log, strategy, requested, device)
        obs_space, space = self.env.single_observation_space, self.env.single_action_space
        assert isinstance(space, spaces.Discrete)
        self.n_actions, self.action_start = int(space.n), int(space.start)
        build = (obs_space, space, cfg, self.device, run.seed, self.policy_source, run.precision, run.network_mask)
        self.algo = DQNAlgo(cfg, make_q_network(*build), make_q_network(*build), self.device)
        self.take_replay(lambda: make_replay(cfg, self.obs_shape, self.obs_dtype), collector_factory)
        self.nstep = NStepAccumulator(cfg.n_envs, cfg.n_steps, cfg.gamma) if cfg.n_steps > 1 else None
        self.env_offset = self.sync.rank * cfg.n_envs
        self.keeps_worker_state = cfg.save_replay  # under ddp each rank keeps its own buffer in checkpoints
        self.exploration_rate = cfg.exploration_initial_eps
        self.obs: np.ndarray | None = None
        self.start_segment()

    @classmethod
    def check_spaces(cls, env_id: str, observation_space: Any, action_space: Any, cfg: Any) -> None:
        check_dqn_spaces(env_id, observation_space, action_space, cfg)

    def start_segment(self) -> None:
        """Restart environments, exploration and replay sampling from the step count; n-step transitions under
        way end where the segment does, bootstrapping from the observation each environment was at."""
        if self.nstep is not None and self.obs is not None:
            self._store(self.nstep.cut(self.obs))
        seed, n = self.run.seed, self.cfg.n_envs
        self.obs = self.env.reset(seed=seed + self.steps + self.env_offset).astype(self.obs_dtype)
        self.explore_rngs = [np.random.default_rng([seed, self.env_offset + i, self.steps]) for i in range(n)]
        self.sample_rng = np.random.default_rng([seed, self.sync.rank, self.steps, 0xD9])

    def save_checkpoint(self, path: Path | None = None) -> Path | None:
        # a periodic checkpoint starts a segment: cut the n-step transitions under way before the replay is
        # saved, so that a run resumed from it holds what the uninterrupted run holds
        if path is None and self.nstep is not None and self.obs is not None:
            self._store(self.nstep.cut(self.obs))
        return super().save_checkpoint(path)

    def _progress(self, total: int) -> float:
        return self.steps / max(total, 1)

    def explore(self, total: int) -> np.ndarray:
        """Env-index actions for this vector step: uniformly random before ``learning_starts``, then
        epsilon-greedy with this step's epsilon. Every env draws its coin and its random action each step, from
        its own stream keyed by its global index, so the actions do not depend on how envs are split over workers."""
        warming_up = self.steps < self.cfg.learning_starts * self.sync.world_size  # steps count all workers
        self.exploration_rate = 1.0 if warming_up else self.cfg.epsilon(self._progress(total))
        coins = np.array([rng.random() for rng in self.explore_rngs])
        randoms = random_actions(self.explore_rngs, self.n_actions, self.algo.q.legal(self.obs))
        explore = coins < self.exploration_rate
        if explore.all():
            return randoms
        return np.where(explore, randoms, self.algo.q.act(self.obs))

    def _store(self, batch: NStepBatch) -> None:
        if len(batch):
            valid = np.ones(len(batch), dtype=bool)
            self.replay.add(
                batch.obs,
                batch.actions,
                batch.returns,
                batch.next_obs,
                batch.terminated,
                valid,
                discounts=batch.discounts,
            )

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
                actions = self.explore(total)
                step = self.env.step(actions + self.action_start)
                next_obs = step.obs.astype(self.obs_dtype)
                terminated = step.terminated.astype(np.float32)
                if self.nstep is None:
                    self.replay.add(self.obs, actions, step.reward, next_obs, terminated, step.valid)
                else:
                    self._store(
                        self.nstep.add(
                            self.obs, actions, step.reward, next_obs, step.terminated, step.truncated, step.valid
                        )
                    )
                self.obs = next_obs
                returns.extend(step.episode_returns.tolist())
                lengths.extend(step.episode_lengths.tolist())
            self.steps += per_iteration
            crossed = (
                self.steps // cfg.target_update_interval - (self.steps - per_iteration) // cfg.target_update_interval
            )
            self.algo.update_target(crossed)  # stable-baselines3 updates while collecting, before the phase's steps
            episodes, votes = self.count_episodes(len(returns))
            update_start = time.perf_counter()
            metrics: dict[str, float] = {}
            learns = self.steps >= cfg.learning_starts * self.sync.world_size and self.replay.size >= 1
            if learns:
                metrics = self._gradient_steps(cfg.gradient_steps_per_phase(), self._progress(total))
            metrics["rollout/exploration_rate"] = self.exploration_rate
            self._end_iteration(start, update_start, updated=learns)
            self._log(returns, lengths, episodes, metrics)
            if self.end_of_iteration(per_iteration, votes, self.steps < total):
                break
        return self.summary()

    def after_steps(self, new_steps: int) -> None:
        """Target network updates for every multiple of ``target_update_interval`` the last ``new_steps`` env steps
        crossed: stable-baselines3 updates while collecting, before the phase's gradient steps."""
        every = self.cfg.target_update_interval
        self.algo.update_target(self.steps // every - (self.steps - new_steps) // every)

    def beta(self, progress: float) -> float:
        return self.cfg.beta(progress)

    def learner_step(self, batch: Transitions, progress: float) -> tuple[dict[str, float], np.ndarray | None]:
        """One gradient step; the batch's TD errors when its replay samples by priority."""
        metrics, errors = self.algo.update(batch, self.sync)
        if self.cfg.prioritized_replay:
            metrics["replay/beta"] = self.beta(progress)
            return metrics, errors
        return metrics, None

    def _gradient_steps(self, n: int, progress: float) -> dict[str, float]:
        metrics: dict[str, float] = {}
        for _ in range(n):
            batch = self.replay.sample(self.cfg.batch_size, self.sample_rng, self.device, self.beta(progress))
            metrics, errors = self.learner_step(batch, progress)
            if errors is not None:
                self.replay.update_priorities(batch.rows, errors)
        return metrics

    def replay_recipe(self) -> functools.partial:
        """How to make this run's replay elsewhere (the holder of a replay that many actors share)."""
        return functools.partial(make_replay, self.cfg, self.obs_shape, self.obs_dtype)

    def weights(self) -> dict[str, Any]:
        """What actors collecting elsewhere act with: the policy version and the Q network's parameters."""
        return {"version": self.policy_version, "params": self.algo.q.params.flat()}

    def act_for_eval(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return self.algo.q.act(obs.astype(self.obs_dtype, copy=False)) + self.action_start

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

    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "replay_size": int(self.replay.size), "gradient_steps": self.algo.gradient_steps}
