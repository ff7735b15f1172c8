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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.algos.grpo import GroupBatch, GroupPolicy, GRPOAlgo
from distrl.config import ConfigError, GRPOConfig, RunConfig, StrategyConfig
from distrl.data.replay import VersionedReplay
from distrl.strategies.actors import ActorDied, ActorEngine, ActorRaised, RayActors, as_array, spend_restart
from distrl.tasks import make_task


class PipelineStalled(RuntimeError):
    """A stage produced nothing for ``starve_timeout_s``; the message names it."""


class GeneratorFailed(RuntimeError):
    """A generator raised (or died) more often than allowed, or raised with ``on_worker_error=abort``."""


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


class GeneratorPool:
    """N generator actors, each with at most ``depth`` requests in flight; a failed one is replaced.

    ``spawn(i, restarts)`` starts actor ``i`` on the engine; ``request(actor, version, weights)``
    sends it one request and returns the pending result. The pool remembers which policy version
    each actor holds, so weights travel only to an actor whose copy is out of date. A second
    request queued behind the first (``depth=2``) hides the round trip: the actor starts it the
    moment it finishes the first.
    """

    def __init__(self, engine: ActorEngine, n: int, spawn: Callable[[int, int], Any], request: Callable[..., Any],
                 strategy: StrategyConfig, events: list[str], depth: int = 1):
        self.engine, self.spawn, self.request, self.strategy, self.events = engine, spawn, request, strategy, events
        self.actors = [spawn(i, 0) for i in range(n)]
        self.depth = depth
        self.restarts = [0] * n
        self.held = [-1] * n                    # the policy version each actor holds (or will, once its queue runs)
        self.busy = [0] * n                     # requests in flight per actor
        self.in_flight: dict[Any, int] = {}     # pending request -> actor index

    def submit(self, version: int, weights: Callable[[], Any], limit: int | None = None) -> None:
        """Top up every actor to ``depth`` requests (at most ``limit`` new ones in all), least busy first."""
        budget = len(self.actors) * self.depth if limit is None else limit
        for _ in range(self.depth):
            for i in sorted(range(len(self.actors)), key=lambda j: self.busy[j]):
                if budget <= 0 or self.busy[i] >= self.depth:
                    continue
                stale = self.held[i] != version
                self.in_flight[self.request(self.actors[i], version, weights() if stale else None)] = i
                self.held[i] = version
                self.busy[i] += 1
                budget -= 1

    def finished(self, timeout: float = 0) -> list[tuple[int, Any]]:
        """Results of the requests that are done (waiting up to ``timeout`` for the first); failures replaced."""
        if not self.in_flight:
            return []
        done = self.engine.wait(list(self.in_flight), 0)
        if not done and timeout > 0:
            done = self.engine.wait(list(self.in_flight), timeout, first=True)
        out = []
        for pending in done:
            i = self.in_flight.pop(pending, None)
            if i is None:  # a request of an actor replaced earlier in this loop
                continue
            self.busy[i] -= 1
            result = self._get(pending, i)
            if result is not None:
                out.append((i, result))
        return out

    def ready(self, *others: Any) -> float:
        """Wait until every actor (and ``others``) has started; returns the seconds it took."""
        start = time.perf_counter()
        actors = [*self.actors, *others]
        pending = [self.engine.call(a, "pid") for a in actors]
        done = self.engine.wait(pending, self.strategy.timeout_s)
        if len(done) < len(pending):
            names = [f"generator {i}" if i < len(self.actors) else "scorer" for i, p in enumerate(pending)
                     if p not in done]
            raise PipelineStalled(f"{', '.join(names)} did not start within {self.strategy.timeout_s:.0f} s")
        for p in pending:  # an actor that failed to start raises here
            self.engine.result(p, self.strategy.timeout_s)
        return time.perf_counter() - start

    def drain(self) -> list[tuple[int, Any]]:
        """Wait for every request under way (up to ``timeout_s``) and return their results."""
        out = []
        while self.in_flight:
            if not self.engine.wait(list(self.in_flight), self.strategy.timeout_s, first=True):
                late = sorted(set(self.in_flight.values()))
                raise PipelineStalled(f"generator(s) {late} did not finish within {self.strategy.timeout_s:.0f} s")
            out += self.finished()
        return out

    def _get(self, pending: Any, i: int) -> Any:
        try:
            return self.engine.result(pending, self.strategy.timeout_s)
        except ActorDied as exc:
            reason = f"died ({exc})"
        except ActorRaised as exc:
            reason = f"raised {exc}"
            if self.strategy.on_worker_error == "abort":
                raise GeneratorFailed(f"generator {i} {reason}") from None
        spend_restart(self.restarts, i, self.strategy.max_worker_restarts, "generator", reason.splitlines()[0],
                      GeneratorFailed)
        self.events.append(f"generator {i} {reason.splitlines()[0]}; restarted ({self.restarts[i]}/"
                           f"{self.strategy.max_worker_restarts})")
        self.engine.kill(self.actors[i])
        self.actors[i] = self.spawn(i, self.restarts[i])
        self.held[i] = -1
        for p in [p for p, j in self.in_flight.items() if j == i]:  # lost with the old actor, never counted
            del self.in_flight[p]
        self.busy[i] = 0
        return None

    def wait_any(self, stage: str, learner_version: int, buffered: int) -> None:
        """Block until some request finishes; fail after ``starve_timeout_s`` naming ``stage``."""
        if not self.in_flight:
            raise PipelineStalled(f"the learner has no data and no generation is under way ({stage})")
        timeout = self.strategy.starve_timeout_s
        if not self.engine.wait(list(self.in_flight), timeout, first=True):
            raise PipelineStalled(f"the learner received no data for {timeout:.0f} s: the {stage} did not answer "
                                  f"(learner version {learner_version}, buffer {buffered}, "
                                  f"{len(self.in_flight)} generations in flight)")

    def restarted(self) -> int:
        return sum(self.restarts)

    def close(self) -> None:
        for actor in self.actors:
            self.engine.kill(actor)


@dataclass
class PipelineStats:
    """What the pipeline did, for summary.json and TensorBoard."""

    learner_busy_s: float = 0.0
    generate_s: float = 0.0
    generated: int = 0
    queue_depths: list[int] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)

    def summary(self, wall: float, steps: int, generators: int, replay: VersionedReplay, restarts: int,
                unit: str) -> dict[str, Any]:
        lags = np.array(self.lags) if self.lags else np.zeros(1)
        busy = self.learner_busy_s / max(wall, 1e-9)
        counters = {k.replace("slice", unit): v for k, v in replay.counters().items()}
        return {"learner_steps": steps, "pipeline_wall_s": wall, "learner_steps_per_s": steps / max(wall, 1e-9),
                "learner_busy_fraction": busy, "learner_idle_fraction": 1 - busy,
                "generator_utilisation": self.generate_s / max(wall * max(generators, 1), 1e-9),
                f"{unit}s_generated": self.generated, f"{unit}s_per_s": self.generated / max(wall, 1e-9),
                "queue_depth_mean": float(np.mean(self.queue_depths)) if self.queue_depths else 0.0,
                "queue_depth_max": max(self.queue_depths, default=0), "buffer_max": replay.max_size,
                "policy_lag_min": float(lags.min()), "policy_lag_mean": float(lags.mean()),
                "policy_lag_max": float(lags.max()), "generator_restarts": restarts, "events": self.events,
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
        self.weights = self.algo.flat_weights()

    def train(self, on_step: Any = None) -> dict[str, Any]:
        cfg, pool = self.cfg, self.pool
        per_call = cfg.slices_per_call
        queue_size = self.strategy.queue_size or DEFAULT_QUEUE_SLICES
        startup = pool.ready(self.scorer)  # the clock starts once every actor is up
        start = time.perf_counter()
        while self.algo.version < cfg.learner_steps:
            for _, scored in pool.finished():
                self._store([scored])
            # generators go again while the queue has room: slices requested, being scored, or
            # buffered but not trained on yet; the learner's pace sets the generators' pace
            ahead = len(pool.in_flight) * per_call + self.replay.untrained()
            pool.submit(self.algo.version, lambda: self.engine.weights(self.algo.version, self.weights),
                        limit=(queue_size - ahead) // per_call)
            self.stats.queue_depths.append(ahead)
            # the learner steps whenever the buffer holds a batch
            batch = self.replay.sample(cfg.slices_per_step, self.algo.version)
            if batch is None:
                pool.wait_any("generators and scorer", self.algo.version, len(self.replay))
                continue
            step_start = time.perf_counter()
            metrics = self.algo.update(stack(batch))
            self.weights = self.algo.flat_weights()  # published: the next request carries it
            self.stats.learner_busy_s += time.perf_counter() - step_start
            self.stats.lags.append(metrics["lag_mean"])
            if on_step is not None:
                on_step(self.algo.version, metrics)
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
    with actor_engine(strategy, run_dir) as engine:
        pipeline = Pipeline(engine, task, cfg, run, strategy)
        try:
            return pipeline.train(on_step), pipeline.algo
        finally:
            pipeline.close()


@contextmanager
def actor_engine(strategy: StrategyConfig, run_dir: Path | None = None, num_cpus: int | None = None) -> Iterator[Any]:
    """The engine ``strategy.engine`` names, started for the run and stopped after it."""
    if strategy.engine == "monarch":
        from distrl.strategies.monarch_engine import monarch_session

        with monarch_session() as engine:
            yield engine
        return
    from distrl.strategies.ray_engine import ray_session

    with ray_session(strategy.ray_address, run_dir, num_cpus=num_cpus) as ray:
        yield RayActors(ray)
