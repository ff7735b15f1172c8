"""The on-policy loop (PPO, and the V-trace actor-critics APPO and IMPALA): collect a rollout → share
statistics → update → log → evaluate → checkpoint."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from distrl.algos.appo import APPOAlgo
from distrl.algos.impala import IMPALAAlgo
from distrl.algos.optim import FlatOptimizer
from distrl.algos.ppo import PPOAlgo
from distrl.algos.protocols import Sync
from distrl.algos.value_norm import ValueNormalizer
from distrl.config import PPOConfig, RunConfig, StrategyConfig
from distrl.data.normalize import ObsNormalizer, RewardScaler
from distrl.data.rollout import Rollout, RolloutBatch, RolloutCollector, RolloutSource
from distrl.envs.selfplay import attach_pool, self_play_summary
from distrl.nets.agent import Agent
from distrl.nets.factory import PolicySource, check_agent_spaces
from distrl.training.common import TrainerBase
from distrl.training.state import section


class OnPolicyUpdate(Protocol):
    """What the on-policy loop asks of its learning rule: :class:`~distrl.algos.ppo.PPOAlgo`, or a stand-in
    that prepares batches here and updates elsewhere (decoupled's player).

    What the rule needs summed over every worker's batch (PPO: the advantages' moments, for their global mean
    and std) is its own: ``batch_statistics`` gives this worker's part, which the loop sums unread in its one
    all-reduce per iteration (with its own counts, whose summed steps set ``progress_remaining``), and hands
    back to ``update`` as ``batch_totals``.
    """

    optimizer: FlatOptimizer
    """Its Adam (or RMSProp) state is broadcast at start-up and kept in checkpoints."""

    def reseed(self, seed: int, rank: int, segment: int) -> None: ...

    def prepare(self, rollout: Rollout) -> RolloutBatch: ...

    def batch_statistics(self, batch: RolloutBatch) -> np.ndarray: ...

    def update(
        self,
        batch: RolloutBatch,
        sync: Sync,
        progress_remaining: float = 1.0,
        batch_totals: np.ndarray | None = None,
    ) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, torch.Tensor]: ...

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None: ...


ON_POLICY_ALGOS: dict[str, type[PPOAlgo]] = {"ppo": PPOAlgo, "appo": APPOAlgo, "impala": IMPALAAlgo}
"""The learning rules this loop runs, by ``run.algo``: PPO's, and the V-trace ones that reuse its batching."""


class OnPolicyTrainer(TrainerBase):
    """Trains PPO (or APPO, IMPALA: ``run.algo``) on one worker's environments; the main worker logs and checkpoints."""

    algo_name = "ppo"

    def __init__(
        self,
        run: RunConfig,
        cfg: PPOConfig,
        sync: Sync | None = None,
        run_dir: Path | None = None,
        log: bool = True,
        strategy: StrategyConfig | None = None,
        requested: PPOConfig | None = None,
        device: torch.device | None = None,
        collector_factory: Callable[[TrainerBase], RolloutSource] | None = None,
        policy: PolicySource = None,
        update_factory: Callable[[PPOAlgo], OnPolicyUpdate] | None = None,
    ):
        """
        Args:
            run, cfg: what to train; ``cfg`` is the config this worker runs (after scaling).
            sync: how updates agree with other workers (default: a single process).
            run_dir: where the main worker writes logs and checkpoints (None: nowhere).
            strategy: the strategy settings, recorded in config.json and checkpoints.
            requested: the PPO config as the user gave it, before ``--scaling``.
            device: overrides ``run.device`` (a ddp rank's own GPU).
            collector_factory: builds a collector in place of the local one (actor-learner's remote workers).
            update_factory: wraps the PPO learning rule in place of using it here (decoupled's player).
            policy: the network, when the Python API was given a module, class or factory (default: ``run.policy``).
        """
        if run.algo in ON_POLICY_ALGOS:
            self.algo_name = run.algo
        super().__init__(run, cfg, sync, run_dir, log, strategy, requested, device)
        self.agent = self.build_agent(cfg, policy)
        self.opponents = attach_pool(self.env, lambda: self.build_agent(cfg, policy), run)
        """Self-play: the past policies the training games' other seat is played by."""
        if self.opponents is not None:
            self.opponents.observe(self.policy_version, self.agent.params.data)
        self.obs_normalizer = ObsNormalizer.for_space(
            self.env.single_observation_space, cfg.normalize_obs, cfg.clip_obs
        )
        rows = self.env.n_envs  # n_envs games of a multi-agent env: a row per agent of each
        self.reward_scaler = RewardScaler(rows, cfg.gamma, cfg.normalize_reward)
        self.collector: RolloutSource = RolloutCollector(
            self.env,
            self.agent,
            self.obs_normalizer,
            self.reward_scaler,
            cfg.n_steps,
            run.seed,
            env_offset=self.sync.rank * rows,
        )
        if collector_factory is not None:
            self.collector = collector_factory(self)
            # the collector's workers play the training games, each against a pool of its own that it reports at
            # the end (actor_learner.workers_self_play); this process's pool served to check the env above
            self.opponents = None
        algo = ON_POLICY_ALGOS[self.algo_name](cfg, self.agent, run.seed)
        algo.set_agents(self.agent_setup)
        self.value_norm = algo.value_norm
        """With ``normalize_value``: the value statistics, which the start-up broadcast carries."""
        self.algo: OnPolicyUpdate = update_factory(algo) if update_factory is not None else algo
        self.start_segment()

    @classmethod
    def check_spaces(cls, env_id: str, observation_space: Any, action_space: Any, cfg: Any) -> None:
        check_agent_spaces(env_id, cls.algo_name, observation_space, action_space, cfg, cfg.normalize_obs)

    def train(self, total_steps: int | None = None, stop_at: int | None = None) -> dict[str, Any]:
        """Train until ``total_steps`` (schedules anneal over it); ``stop_at`` ends early, as an interruption would."""
        total = total_steps if total_steps is not None else self.run.total_steps
        limit = min(total, stop_at) if stop_at is not None else total
        per_iteration = self.cfg.rollout_size * self.sync.world_size * self.collector.n_workers
        preempt, min_steps = None, 0
        if self.strategy.sync_frac < 1.0 and self.sync.world_size > 1:
            needed = math.ceil(self.strategy.sync_frac * self.sync.world_size)
            preempt = lambda: self.sync.count_finished(self.iteration) >= needed  # noqa: E731
            min_steps = math.ceil(self.strategy.min_rollout_frac * self.cfg.n_steps)
        while self.steps < limit:
            start = time.perf_counter()
            rollout = self.collector.collect(self.policy_version, preempt, min_steps)
            if preempt is not None and rollout.collected_steps == self.cfg.n_steps:
                self.sync.mark_finished(self.iteration)
            batch = self.algo.prepare(rollout)
            totals = self._sum_over_workers(rollout, batch)
            self.steps += int(totals["steps"][0])
            self.episodes += int(totals["episodes"].sum())
            update_start = time.perf_counter()
            metrics = self.algo.update(
                batch,
                self.sync,
                progress_remaining=max(0.0, 1.0 - self.steps / total),
                batch_totals=totals["algo"],
            )
            now = self._end_iteration(start, update_start)
            if self.opponents is not None:
                self.opponents.observe(self.policy_version, self.agent.params.data)
                metrics["self_play/learner_elo"] = self.opponents.learner_elo
            metrics.update(
                {
                    "charts/samples": float(totals["samples"][0]),
                    "charts/local_samples": float(rollout.valid.sum()),
                    "time/collect_s": rollout.collect_s,
                    "time/update_s": now - update_start,
                    "time/collected_steps": float(rollout.collected_steps),
                    **self.collector.iteration_metrics(),
                }
            )
            self._log(
                rollout.episode_returns,
                rollout.episode_lengths,
                totals["episodes"],
                metrics,
                rollout.episode_agent_returns,
            )
            if self.end_of_iteration(per_iteration, totals["votes"], self.steps < total):
                break
        if self.opponents is not None:
            self.extra_summary["self_play"] = self_play_summary(self.opponents, self.env)
        return self.summary()

    def _sum_over_workers(self, rollout: Rollout, batch: RolloutBatch) -> dict[str, np.ndarray]:
        """One all-reduce per iteration for every count and statistic the workers must share.

        Steps, valid samples, per-worker episode counts, the learning rule's ``batch_statistics``, the
        normalisers' moments and the stop votes travel together: a collective costs about a millisecond on
        small machines, so they are batched. Updates the normalisers.
        """
        episodes = np.zeros(self.sync.world_size)
        episodes[self.sync.rank] = len(rollout.episode_returns)
        parts = {
            "steps": np.array([rollout.steps]),
            "samples": np.array([rollout.valid.sum()]),
            "episodes": episodes,
            "algo": self.algo.batch_statistics(batch),
            "votes": self.stop_votes(),
        }
        if self.cfg.normalize_obs:
            parts["obs"] = rollout.obs_moments
        if self.cfg.normalize_reward:
            parts["reward"] = rollout.reward_moments
        summed = self.sync.all_sum(np.concatenate([np.asarray(v, dtype=np.float64) for v in parts.values()]))
        out, offset = {}, 0
        for name, value in parts.items():
            out[name] = summed[offset : offset + len(value)]
            offset += len(value)
        if "obs" in out:
            self.obs_normalizer.update(out["obs"])
        if "reward" in out:
            self.reward_scaler.update(out["reward"])
        return out

    def weights(self) -> dict[str, Any]:
        """What a remote collector needs to act like this learner: version, parameters, normaliser statistics."""
        return {
            "version": self.policy_version,
            "params": self.agent.params.data.cpu().numpy().copy(),
            "obs_stats": self.obs_normalizer.stats.state(),
            "reward_stats": self.reward_scaler.stats.state(),
        }

    def act_for_eval(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return self.agent.env_action(self.greedy_actions(self.policy_obs(obs), starts))

    def policy_obs(self, obs: np.ndarray) -> np.ndarray:
        return self.obs_normalizer(obs)

    def start_segment(self) -> None:
        """Restart environments, sampling noise and minibatch shuffling from seeds derived from the step count."""
        self.collector.reset(self.run.seed, self.steps)
        self.algo.reseed(self.run.seed, self.sync.rank, self.steps)

    # ---- state ----

    def _stats(self) -> list[Any]:
        return [self.obs_normalizer.stats, self.reward_scaler.stats]

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"params/{k}": v for k, v in self.agent.params.state_dict().items()}
        tensors.update({f"optim/{k}": v for k, v in self.algo.state_dict().items()})
        for prefix, stats in zip(("obs_norm", "reward_norm"), self._stats()):
            tensors.update({f"{prefix}/{k}": torch.from_numpy(np.atleast_1d(v)) for k, v in stats.state().items()})
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        self.agent.params.load_state_dict(section(tensors, "params"))
        self.algo.load_state_dict(section(tensors, "optim"))
        for prefix, stats in zip(("obs_norm", "reward_norm"), self._stats()):
            stats.load({k.split("/", 1)[1]: v.numpy() for k, v in tensors.items() if k.startswith(prefix + "/")})
        self._refresh()

    @staticmethod
    def start_state(
        agent: Agent,
        optimizer: FlatOptimizer,
        obs_normalizer: ObsNormalizer,
        reward_scaler: RewardScaler,
        value_norm: ValueNormalizer | None = None,
    ) -> list[torch.Tensor]:
        """What the start-up broadcast carries, for any holder of these parts (a trainer, or decoupled's
        trainer ranks): the live parameter and Adam tensors (and value statistics, with ``value_norm``), then
        one float64 tensor packing the obs and reward statistics (mean, var, count each) and Adam's step count."""
        stats = (obs_normalizer.stats, reward_scaler.stats)
        packed = [np.concatenate([s.mean.ravel(), s.var.ravel(), [s.count]]) for s in stats]
        packed.append(np.array([optimizer.steps], dtype=np.float64))
        live = [agent.params.data, optimizer.exp_avg, optimizer.exp_avg_sq]
        if value_norm is not None:
            live.append(value_norm.state)
        return [*live, torch.from_numpy(np.concatenate(packed))]

    @staticmethod
    def load_start_state(
        tensors: list[torch.Tensor],
        optimizer: FlatOptimizer,
        obs_normalizer: ObsNormalizer,
        reward_scaler: RewardScaler,
    ) -> None:
        """Unpack what :meth:`start_state` packed (the live tensors before its last were received in place)."""
        values, offset = tensors[-1].numpy(), 0
        for stats in (obs_normalizer.stats, reward_scaler.stats):
            size = stats.mean.size
            stats.load(
                {
                    "mean": values[offset : offset + size],
                    "var": values[offset + size : offset + 2 * size],
                    "count": values[offset + 2 * size],
                }
            )
            offset += 2 * size + 1
        optimizer.steps = int(values[offset])

    def broadcast_tensors(self) -> list[torch.Tensor]:
        return self.start_state(
            self.agent, self.algo.optimizer, self.obs_normalizer, self.reward_scaler, self.value_norm
        )

    def after_broadcast(self, tensors: list[torch.Tensor]) -> None:
        self.load_start_state(tensors, self.algo.optimizer, self.obs_normalizer, self.reward_scaler)
        self._refresh()

    def _refresh(self) -> None:
        self.obs_normalizer.refresh()
        self.agent.refresh_acting_copy()
