"""``pipeline``: generators → queue → scorer → versioned replay → learner, all running at once.

N generator actors draw data with their copy of the policy while the learner (this process)
trains on what has already arrived. Two workloads share the machinery:

- group tasks (``grpo``): a generator draws ``slices_per_call`` slices of groups per request;
  a scorer actor rewards the queued slices in batches; the learner takes ``slices_per_step``
  scored slices per step (:class:`Pipeline`).
- Gymnasium envs (``ppo``): a generator is a rollout worker that collects one fragment of
  ``n_steps`` × ``n_envs`` steps per request, with the behaviour log-probabilities; rewards
  come from the env, so there is no scorer; the learner runs a PPO update on one fragment per
  step, against the behaviour log-probabilities (:mod:`distrl.strategies.pipeline_ppo`, an
  APPO-like asynchronous PPO without V-trace: values and GAE come from the learner's current critic).

Nobody waits longer than the data demands:

- a generator is handed the newest ``(version, weights)`` with each request and loads them
  before it starts (ready-to-update, then ready-to-generate), so one request's data never
  mixes versions; weights travel by value as one float vector, only to a generator whose copy
  is out of date;
- at most ``queue_size`` slices wait for the scorer: past that, finished generators idle
  (back-pressure) instead of filling memory;
- the learner steps whenever the buffer holds a batch, and otherwise waits on whichever stage
  can feed it, failing after ``starve_timeout_s`` with the name of that stage.

Every generated slice or fragment is trained on, evicted, dropped for lag, or left in the
buffer at the end (generations under way at the end are drained into it), and summary.json's
counters add up. A generator that dies is restarted; its lost request was never counted.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.algos.grpo import GroupBatch, GroupPolicy, GRPOAlgo
from distrl.config import ConfigError, GRPOConfig, RunConfig, StrategyConfig
from distrl.data.replay import VersionedReplay
from distrl.strategies.actors import ActorEngine, RayActors, as_array
from distrl.strategies.pool import Feeder, GeneratorPool
from distrl.tasks import make_task


class Generator:
    """Actor: draws slices of ``states_per_slice`` groups of ``group_size`` samples, one version per request."""

    def __init__(self, task: str, cfg: GRPOConfig, seed: int, generator_id: int, restarts: int = 0,
                 scorer: Any = None):
        self.task = make_task(task, seed)
        self.cfg = cfg
        self.scorer = scorer
        self.id = generator_id
        self.policy = GroupPolicy(self.task.obs_dim, self.task.n_actions, cfg.net_arch, seed)
        self.version = -1
        stream = (seed, generator_id, restarts)
        self.rng = np.random.default_rng(stream)
        self.torch_rng = torch.Generator().manual_seed(int(np.random.SeedSequence(stream).generate_state(1)[0]))
        torch.set_num_threads(1)

    def generate(self, version: int, weights: Any, slices: int = 1) -> dict[str, Any]:
        """``slices`` slices drawn with policy ``version``; ``weights`` (flat, see ``as_array``) is None when
        this generator already holds that version."""
        start = time.perf_counter()
        if weights is not None:  # ready-to-update: load, then ready-to-generate
            self.policy.load_flat_weights(as_array(weights))
            self.version = version
        if self.version != version:
            raise RuntimeError(f"generator {self.id} holds version {self.version}, asked for {version} without weights")
        n, S = slices, self.cfg.states_per_slice
        states = self.task.states(n * S, self.rng)
        actions, log_probs = self.policy.sample(torch.from_numpy(states), self.cfg.group_size, self.torch_rng)
        G = self.cfg.group_size
        return {"obs": states.reshape(n, S, -1), "actions": actions.numpy().reshape(n, S, G),
                "log_probs": log_probs.numpy().reshape(n, S, G), "version": self.version, "generator": self.id,
                "generate_s": time.perf_counter() - start}

    def generate_scored(self, version: int, weights: Any, slices: int) -> dict[str, Any]:
        """:meth:`generate`, then hand the slices to the scorer (a client of the scorer actor) and return them scored."""
        return self.scorer.score(self.generate(version, weights, slices))[0]

    def pid(self) -> int:
        return os.getpid()


class Scorer:
    """Actor: rewards a batch of generations with one call of the task's reward function."""

    def __init__(self, task: str, seed: int):
        self.task = make_task(task, seed)
        torch.set_num_threads(1)

    def score(self, *generations: dict[str, Any]) -> list[dict[str, Any]]:
        obs_dim = generations[0]["obs"].shape[-1]
        states = np.concatenate([g["obs"].reshape(-1, obs_dim) for g in generations])
        actions = np.concatenate([g["actions"].reshape(-1, g["actions"].shape[-1]) for g in generations])
        rewards = self.task.rewards(states, actions)
        out, at = [], 0
        for g in generations:
            n = g["actions"].shape[0] * g["actions"].shape[1]
            out.append({**g, "rewards": rewards[at:at + n].reshape(g["actions"].shape)})
            at += n
        return out

    def pid(self) -> int:
        return os.getpid()


def split_slices(scored: dict[str, Any]) -> list[dict[str, Any]]:
    """One scored generation → its slices (each one version, ``states_per_slice`` groups)."""
    return [{"obs": scored["obs"][j], "actions": scored["actions"][j], "log_probs": scored["log_probs"][j],
             "rewards": scored["rewards"][j]} for j in range(len(scored["obs"]))]


def stack(slices: list[tuple[int, dict[str, Any]]]) -> GroupBatch:
    items = [s for _, s in slices]
    cat = lambda name: torch.from_numpy(np.concatenate([s[name] for s in items]))  # noqa: E731
    versions = torch.cat([torch.full((len(s["obs"]),), v, dtype=torch.long) for v, s in slices])
    return GroupBatch(obs=cat("obs"), actions=cat("actions"), behaviour_log_probs=cat("log_probs"),
                      rewards=cat("rewards"), versions=versions)


@dataclass
class PipelineStats:
    """What the pipeline did, for summary.json and TensorBoard."""

    learner_busy_s: float = 0.0
    generate_s: float = 0.0
    generated: int = 0
    queue_depth: int = 0
    """The latest queue depth. It and the policy lag are kept as running figures, not lists: the
    feeder records a depth every few milliseconds, and a run may last millions of steps."""
    queue_depth_total: int = 0
    queue_depth_count: int = 0
    queue_depth_max: int = 0
    lag_total: float = 0.0
    lag_count: int = 0
    lag_min: float = float("inf")
    lag_max: float = 0.0
    events: list[str] = field(default_factory=list)

    def record_queue(self, depth: int) -> None:
        self.queue_depth = depth
        self.queue_depth_total += depth
        self.queue_depth_count += 1
        self.queue_depth_max = max(self.queue_depth_max, depth)

    def record_lag(self, lag: float) -> None:
        self.lag_total += lag
        self.lag_count += 1
        self.lag_min = min(self.lag_min, lag)
        self.lag_max = max(self.lag_max, lag)

    def summary(self, wall: float, steps: int, generators: int, replay: VersionedReplay, restarts: int,
                unit: str) -> dict[str, Any]:
        busy = self.learner_busy_s / max(wall, 1e-9)
        counters = {k.replace("slice", unit): v for k, v in replay.counters().items()}
        return {"learner_steps": steps, "pipeline_wall_s": wall, "learner_steps_per_s": steps / max(wall, 1e-9),
                "learner_busy_fraction": busy, "learner_idle_fraction": 1 - busy,
                "generator_utilisation": self.generate_s / max(wall * max(generators, 1), 1e-9),
                f"{unit}s_generated": self.generated, f"{unit}s_per_s": self.generated / max(wall, 1e-9),
                "queue_depth_mean": self.queue_depth_total / max(self.queue_depth_count, 1),
                "queue_depth_max": self.queue_depth_max, "buffer_max": replay.max_size,
                "policy_lag_min": self.lag_min if self.lag_count else 0.0,
                "policy_lag_mean": self.lag_total / max(self.lag_count, 1),
                "policy_lag_max": self.lag_max, "generator_restarts": restarts, "events": self.events,
                **counters}


DEFAULT_QUEUE_SLICES = 16
"""GRPO's ``queue_size`` when it is left at 0: four learner steps of the default four slices."""


def check_pipeline(cfg: GRPOConfig, strategy: StrategyConfig) -> None:
    """Settings that only make sense together; checked before any actor starts."""
    if strategy.buffer_capacity < cfg.slices_per_step:
        raise ConfigError(f"buffer_capacity={strategy.buffer_capacity} is not allowed: must be >= slices_per_step "
                          f"({cfg.slices_per_step})")
    if 0 < strategy.queue_size < cfg.slices_per_call:
        raise ConfigError(f"queue_size={strategy.queue_size} is not allowed: must be >= slices_per_call "
                          f"({cfg.slices_per_call}), or no generation would ever be queued")


class Pipeline:
    """GRPO's learner side: owns the generators, the scorer, the queue, the replay buffer and the learner step."""

    def __init__(self, engine: ActorEngine, task: str, cfg: GRPOConfig, run: RunConfig, strategy: StrategyConfig):
        check_pipeline(cfg, strategy)
        self.engine, self.task_name, self.cfg, self.run, self.strategy = engine, task, cfg, run, strategy
        task_obj = make_task(task, run.seed)
        self.algo = GRPOAlgo(task_obj.obs_dim, task_obj.n_actions, cfg, run.seed)
        self.replay = VersionedReplay(strategy.buffer_capacity, strategy.max_policy_lag, strategy.replay_sampling,
                                      seed=run.seed, max_reuse=strategy.max_reuse)
        self.stats = PipelineStats()
        self.scorer = engine.spawn(Scorer, task, run.seed)
        scorer = engine.client(self.scorer, strategy.timeout_s)

        def request(actor: Any, version: int, weights: Any) -> Any:
            # the generator hands its slices to the scorer itself: the learner sends one request
            # and hears of the slices once, scored
            return engine.call(actor, "generate_scored", version, weights, cfg.slices_per_call)

        self.pool = GeneratorPool(engine, strategy.workers,
                                  lambda i, restarts: engine.spawn(Generator, task, cfg, run.seed, i, restarts, scorer),
                                  request, strategy, self.stats.events, depth=2)

    def train(self, on_step: Any = None) -> dict[str, Any]:
        cfg, pool = self.cfg, self.pool
        per_call = cfg.slices_per_call
        queue_size = self.strategy.queue_size or DEFAULT_QUEUE_SLICES

        def room() -> int:
            # generators go again while the queue has room: slices requested, being scored, or
            # buffered but not trained on yet; the learner's pace sets the generators' pace
            ahead = len(pool.in_flight) * per_call + self.replay.untrained()
            self.stats.record_queue(ahead)
            return (queue_size - ahead) // per_call

        startup = pool.ready(self.scorer)  # the clock starts once every actor is up
        start = time.perf_counter()
        # the feeder thread stores scored slices and sends requests; this loop only samples and steps
        feeder = Feeder(pool, lambda scored: self._store([scored]), room, self.algo.version,
                        self.algo.flat_weights(), self.engine.weights, "generators and scorer").start()
        try:
            while self.algo.version < cfg.learner_steps:
                batch = feeder.take(lambda: self.replay.sample(cfg.slices_per_step, self.algo.version),
                                    self.strategy.starve_timeout_s,
                                    lambda: f"learner version {self.algo.version}, buffer {len(self.replay)}")
                step_start = time.perf_counter()
                metrics = self.algo.update(stack(batch))
                feeder.publish(self.algo.version, self.algo.flat_weights())
                self.stats.learner_busy_s += time.perf_counter() - step_start
                self.stats.record_lag(metrics["lag_mean"])
                if on_step is not None:
                    on_step(self.algo.version, metrics)
        finally:
            feeder.stop()
        wall = time.perf_counter() - start
        # drain: requests under way are scored into the buffer, so that every generated slice is
        # accounted for (trained, evicted, dropped for lag, or left at the end)
        for _, scored in pool.drain():
            self._store([scored])
        summary = self.stats.summary(wall, self.algo.version, len(pool.actors), self.replay, pool.restarted(), "slice")
        return {**summary, "wall_s": wall, "startup_s": startup}

    def _store(self, scored: list[dict[str, Any]]) -> None:
        for generation in scored:
            self.stats.generated += len(generation["obs"])
            self.stats.generate_s += generation["generate_s"]
            for piece in split_slices(generation):
                self.replay.add(generation["version"], piece)

    def close(self) -> None:
        self.pool.close()
        self.engine.kill(self.scorer)


def run_pipeline(task: str, cfg: GRPOConfig, run: RunConfig, strategy: StrategyConfig,
                 run_dir: Path | None = None, on_step: Any = None) -> tuple[dict[str, Any], GRPOAlgo]:
    """Train GRPO on a group task with ``strategy.workers`` generators; returns (summary, learner)."""
    check_pipeline(cfg, strategy)
    with actor_engine(strategy, run_dir, debug=run.debug) as engine:
        pipeline = Pipeline(engine, task, cfg, run, strategy)
        try:
            return pipeline.train(on_step), pipeline.algo
        finally:
            pipeline.close()


@contextmanager
def actor_engine(strategy: StrategyConfig, run_dir: Path | None = None, num_cpus: int | None = None,
                 debug: bool = False) -> Iterator[Any]:
    """The engine ``strategy.engine`` names, started for the run and stopped after it."""
    if strategy.engine == "monarch":
        from distrl.strategies.monarch_engine import monarch_session

        with monarch_session() as engine:
            yield engine
        return
    from distrl.strategies.ray_engine import ray_session

    with ray_session(strategy.ray_address, run_dir, num_cpus=num_cpus, debug=debug) as ray:
        yield RayActors(ray)
