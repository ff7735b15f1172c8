"""``pipeline`` on Gymnasium envs: PPO, APPO and IMPALA with asynchronous actors (the pipeline's generators),
its queue and its versioned replay; the learner never waits while a batch of fragments is there.

The generators are rollout workers that collect continuously, each with its own environments, and pick
up the newest weights between fragments; :class:`AsyncCollector` is the on-policy trainer's
collector, so the trainer, its logs, evaluation and checkpoints are those of every PPO run. Each
fragment carries the policy version that drew it and its behaviour log-probs; the correction for the
lag is the algorithm's (APPO's and IMPALA's V-trace, PPO's ratio), never the transport's.
The machinery (generator pool, versioned replay, engines) is :mod:`distrl.strategies.pipeline`'s, the counters
:mod:`distrl.strategies.pipeline_stats`'.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import numpy as np

from distrl.config import ConfigError, RunConfig, StrategyConfig
from distrl.data.rollout import merge_rollouts
from distrl.data.versioned import VersionedReplay
from distrl.strategies.actors import ActorEngine, Overheads, RayActors
from distrl.strategies.pipeline import actor_engine
from distrl.strategies.pipeline_stats import PipelineStats
from distrl.strategies.pool import GeneratorPool


class AsyncCollector:
    """The pipeline of PPO, APPO and IMPALA: rollout workers keep collecting while the learner trains; same
    interface as a collector.

    ``collect()`` returns the next ``n_workers`` fragments from the versioned replay (behaviour log-probs
    included), merged along the env axis, waiting only while fewer are buffered. The rollout it returns counts, in
    ``collected_steps`` and its episode lists, every step and episode the generators delivered
    since the previous call, so that step budgets, SPS and monitor.csv cover everything played,
    whether or not it was trained on.
    """

    def __init__(self, trainer: Any, strategy: StrategyConfig, engine: ActorEngine):
        from distrl.strategies.actor_learner import RolloutWorker, WorkerSpec

        self.trainer, self.strategy, self.engine = trainer, strategy, engine
        vtrace = trainer.algo_name != "ppo"
        self.n_workers = strategy.fragments_per_step or (strategy.workers if vtrace else 1)
        """Fragments per learner step (the trainer counts an iteration's steps with it)."""
        # APPO's and IMPALA's actors never wait for the learner: each has its next request queued behind the one
        # it runs (depth 2), and the queue holds those and a whole batch besides. PPO's generators, one request
        # each, keep its lag small: its only correction is the ratio.
        depth = 2 if vtrace else 1
        default_queue = depth * strategy.workers + self.n_workers if vtrace else strategy.workers + self.n_workers - 1
        self.queue_size = strategy.queue_size or default_queue
        for name, value in (("queue_size", self.queue_size), ("buffer_capacity", strategy.buffer_capacity)):
            if value < self.n_workers:
                raise ConfigError(
                    f"{name}={value} is not allowed: must be at least fragments_per_step = {self.n_workers} "
                    "(the learner waits for that many fragments)"
                )
        self.replay = VersionedReplay(
            strategy.buffer_capacity,
            strategy.max_policy_lag,
            strategy.replay_sampling,
            seed=trainer.run.seed,
            max_reuse=strategy.max_reuse,
        )
        self.stats = PipelineStats()
        self.seed, self.segment = trainer.run.seed, 0

        first = trainer.sync.rank * strategy.workers  # a ddp rank's actors play environments of their own

        def spawn(i: int, restarts: int) -> Any:
            actor = engine.spawn(
                RolloutWorker,
                WorkerSpec("ppo", trainer.run, trainer.cfg, first + i),
                cpus=strategy.worker_cpus,
                gpus=strategy.worker_gpus,
            )
            if restarts:  # a replacement starts new episodes, seeded by its restart count
                engine.call(actor, "reset", self.seed, self.segment + 1_000_003 * restarts)
            return actor

        def request(actor: Any, version: int, weights: dict[str, Any] | None) -> Any:
            return engine.call(actor, "collect", weights if weights is not None else {"version": version}, 0, True)

        self.pool = GeneratorPool(engine, strategy.workers, spawn, request, strategy, trainer.report, depth=depth)
        self.pending_env_steps, self.pending_returns, self.pending_lengths = 0, [], []
        self.pending_agent_returns: list[list[float]] = []
        """What the generators delivered since the last batch: env steps, finished episodes' returns and lengths."""
        self.overheads = Overheads()
        self.last_overhead_s = 0.0
        self.last_metrics: dict[str, float] = {}
        """Per-iteration figures the trainer logs to TensorBoard with its own."""
        self.startup_s = 0.0

    def _weights(self) -> dict[str, Any]:
        payload = self.trainer.weights()
        return {**payload, "params": self.engine.weights(payload["version"], payload["params"])}

    def reset(self, seed: int, segment: int = 0) -> None:
        """Start a segment (at the start, after a checkpoint): the generations under way finish into the buffer
        first (their steps count, as at the end), then every generator restarts its episodes."""
        for _, fragment in self.pool.drain():
            self._add(fragment)
        self.seed, self.segment = seed, segment
        self.startup_s += self.pool.ready()
        for pending in [self.engine.call(a, "reset", seed, segment) for a in self.pool.actors]:
            self.engine.result(pending, self.strategy.timeout_s)

    def _harvest(self, timeout: float = 0) -> None:
        for _, fragment in self.pool.finished(timeout):
            self._add(fragment)

    def _add(self, fragment: Any) -> None:
        # Ray hands numpy arrays over read-only (zero-copy); the learner's tensors need their own memory
        for name in ("obs", "actions", "rewards", "terminated", "truncated", "valid", "log_probs"):
            if getattr(fragment, name) is not None:
                setattr(fragment, name, np.array(getattr(fragment, name)))
        self.stats.generated += 1
        self.stats.generate_s += fragment.collect_s
        self.pending_env_steps += fragment.steps
        self.pending_returns += fragment.episode_returns
        self.pending_lengths += fragment.episode_lengths
        self.pending_agent_returns += fragment.episode_agent_returns
        self.replay.add(fragment.policy_version, fragment)

    def _submit(self, policy_version: int) -> None:
        """Requests for idle generators while fewer than ``queue_size`` fragments are ahead of the learner."""
        ahead = len(self.pool.in_flight) + self.replay.untrained()
        submitted = len(self.pool.in_flight)
        self.pool.submit(policy_version, self._weights, limit=self.queue_size - ahead)
        self.stats.record_queue(ahead + len(self.pool.in_flight) - submitted)

    def collect(self, policy_version: int, preempt: Any = None, min_steps: int = 0) -> Any:
        start = time.perf_counter()
        self._harvest()
        self._submit(policy_version)
        while (taken := self.replay.sample(self.n_workers, policy_version)) is None:
            self.pool.wait_any("generators", policy_version, len(self.replay))
            self._harvest()
            self._submit(policy_version)
        lags = [policy_version - version for version, _ in taken]
        for lag in lags:
            self.stats.record_lag(float(lag))
        fragments = [fragment for _, fragment in taken]
        batch = merge_rollouts(fragments) if len(fragments) > 1 else fragments[0]
        # the steps and episodes delivered count once each, in whole vector steps of the batch's width
        # (the remainder waits for the next batch; what is left at the end is reported as drained)
        width = int(batch.rewards.shape[1])
        vector_steps = self.pending_env_steps // width
        self.pending_env_steps -= vector_steps * width
        rollout = dataclasses.replace(
            batch,
            policy_version=policy_version - max(lags),
            collected_steps=vector_steps,
            episode_returns=self.pending_returns,
            episode_lengths=self.pending_lengths,
            episode_agent_returns=self.pending_agent_returns,
            collect_s=time.perf_counter() - start,
        )
        self.pending_returns, self.pending_lengths, self.pending_agent_returns = [], [], []
        self.last_overhead_s = rollout.collect_s  # the learner's wait for data
        self.overheads.add(self.last_overhead_s)
        self.last_metrics = {
            "pipeline/policy_lag": float(np.mean(lags)),
            "pipeline/policy_lag_max": float(max(lags)),
            "pipeline/dropped_for_lag": float(self.replay.dropped_for_lag),
            "pipeline/learner_busy_fraction": self.trainer.update_s / max(self.trainer.train_s, 1e-9),
            "pipeline/queue_depth": float(self.stats.queue_depth),
            "pipeline/buffer_size": float(len(self.replay)),
            "pipeline/generator_restarts": float(self.pool.restarted()),
        }
        return rollout

    def iteration_metrics(self) -> dict[str, float]:
        return {"time/overhead_s": self.last_overhead_s, **self.last_metrics}

    def summary(self) -> dict[str, Any]:
        """The learner's waits for data, per fragment."""
        return self.overheads.summary()

    def finish(self) -> dict[str, Any]:
        """Drain the generations under way into the buffer; the pipeline's figures for summary.json.

        Times are over the training loop (``train_s``: collection waits and updates, no evaluation
        or start-up); ``drained_steps`` are the env steps of the fragments drained at the end,
        which ``total_steps`` does not count. With self-play, ``self_play`` holds each generator's games and
        pool (:func:`~distrl.strategies.actor_learner.workers_self_play`), the drained fragments' games included.
        """
        from distrl.strategies.actor_learner import workers_self_play

        for _, fragment in self.pool.drain():
            self._add(fragment)
        self.stats.learner_busy_s = self.trainer.update_s
        summary = self.stats.summary(
            self.trainer.train_s,
            self.trainer.policy_version,
            len(self.pool.actors),
            self.replay,
            self.pool.restarted(),
            "fragment",
        )
        figures = {
            **summary,
            "drained_steps": self.pending_env_steps,
            "startup_s": self.startup_s,
            "placement": {"generators": self.pool.placement()},
        }
        if self.trainer.run.self_play:
            figures["self_play"] = workers_self_play(self.engine, self.pool.actors, self.strategy.timeout_s)
        return figures

    def close(self) -> None:
        self.pool.close()


def run_async_ppo(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Path, resume_path: Path | None = None
) -> dict[str, Any]:
    """PPO, APPO or IMPALA on a Gymnasium env with ``strategy.workers`` generators feeding this process's learner."""
    from distrl.strategies.actor_learner import _check_resources
    from distrl.training import make_trainer

    if run.algo not in ("ppo", "appo", "impala"):
        raise ConfigError(
            f"algo={run.algo!r} is not available with --strategy pipeline on a Gymnasium env: "
            "use ppo, appo or impala (or grpo on a group task)"
        )
    start = time.perf_counter()
    cpus = max(os.cpu_count() or 1, int(np.ceil(strategy.workers * strategy.worker_cpus)))
    with actor_engine(strategy, run_dir, num_cpus=cpus, debug=run.debug) as engine:
        if isinstance(engine, RayActors):
            _check_resources(engine.ray, strategy)
        trainer = make_trainer(
            run.algo,
            run,
            cfg,
            run_dir=run_dir,
            strategy=strategy,
            collector_factory=lambda t: AsyncCollector(t, strategy, engine),
        )
        return trainer.run_to_end(resume_path, start)
