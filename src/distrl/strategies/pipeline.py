"""``pipeline``: generators → queue → scorer → versioned replay → learner, all running at once.

N generator actors draw data with their copy of the policy while the learner (this process)
trains on what has already arrived. Two workloads share the machinery:

- GRPO (``grpo``): a generator draws the groups of ``slices_per_call`` slices of prompts per
  request (a language model's completions, or a numeric task's actions) and hands them to the
  scorer actor, which runs the reward functions, so that a reward that hangs or crashes ends the run
  with its name instead of stalling the learner; the learner takes ``slices_per_step`` scored slices
  per step (:class:`PipelineGroups`, the GRPO trainer's source).
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
- at most ``queue_size`` slices are requested, being scored, or buffered and not trained on yet:
  past that, generators idle (back-pressure) instead of filling memory, and data older than
  ``max_policy_lag`` versions is dropped;
- the learner steps whenever the buffer holds a batch, and otherwise waits on whichever stage
  can feed it, failing after ``starve_timeout_s`` with the name of that stage.

Request ``k`` covers prompt positions ``k * P .. (k + 1) * P - 1`` (``P`` prompts per request) and draws
them with the same position-keyed randomness as every strategy, so one generator one request ahead of
the learner reproduces ``single`` exactly. Every generated slice or fragment is trained on, evicted,
dropped for lag, or left in the buffer at the end (generations under way at the end are drained into
it), and summary.json's counters add up. A generator that dies is restarted; its lost request was
never counted.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.config import ConfigError, GRPOConfig, RunConfig, StrategyConfig
from distrl.data.groups import GroupSamples, draw_groups, score_groups
from distrl.data.versioned import VersionedReplay
from distrl.nets.factory import make_group_policy
from distrl.rewards import RewardError
from distrl.strategies.actors import ActorEngine, RayActors, as_array, placement, resolve_placements
from distrl.strategies.pool import GeneratorPool
from distrl.tasks import make_group_task
from distrl.training.group import train_grpo
from distrl.training.state import resolve_device


@dataclass(frozen=True)
class ScoringFailed:
    """What a generator returns when scoring its groups failed: the run ends with ``message``."""

    message: str


@dataclass(frozen=True)
class Generation:
    """One request's scored groups and what making them cost."""

    samples: GroupSamples
    generator: int
    generate_s: float
    score_s: float
    load_s: float
    """Loading the weights the request carried."""


def request_positions(request: int, cfg: GRPOConfig) -> np.ndarray:
    """The prompt positions of request ``request``: ``slices_per_call`` slices' worth, consecutive."""
    per = cfg.prompts_per_slice * cfg.slices_per_call
    return np.arange(request * per, (request + 1) * per, dtype=np.int64)


class Generator:
    """Actor: draws one request's groups with one policy version, then has the scorer score them."""

    def __init__(self, run: RunConfig, cfg: GRPOConfig, generator_id: int, scorer: Any = None):
        torch.set_num_threads(run.threads)
        self.run, self.cfg, self.id, self.scorer = run, cfg, generator_id, scorer
        self.task = make_group_task(run.env, cfg, run.seed)
        self.policy = make_group_policy(self.task, run, cfg, resolve_device(run.device), "generator")
        self.version = -1

    def generate(self, version: int, weights: Any, request: int) -> tuple[GroupSamples, float, float]:
        """(groups, seconds drawing, seconds loading weights); ``weights`` (flat, see ``as_array``) is None
        when this generator already holds ``version``."""
        start = time.perf_counter()
        if weights is not None:  # ready-to-update: load, then ready-to-generate
            self.policy.params.load_flat(as_array(weights))
            self.version = version
        if self.version != version:
            raise RuntimeError(f"generator {self.id} holds version {self.version}, asked for {version} without weights")
        loaded = time.perf_counter()
        samples = draw_groups(
            self.task, self.policy, request_positions(request, self.cfg), self.cfg.group_size, self.run.seed, version
        )
        return samples, time.perf_counter() - loaded, loaded - start

    def generate_scored(self, version: int, weights: Any, request: int) -> Generation | ScoringFailed:
        """:meth:`generate`, then the scorer's rewards (a client of the scorer actor)."""
        samples, generate_s, load_s = self.generate(version, weights, request)
        start = time.perf_counter()
        try:
            scored = self.scorer.score(samples)
        except Exception as exc:  # noqa: BLE001 - the scorer's process died or stopped answering
            return ScoringFailed(
                f"the scorer failed while scoring (rewards {', '.join(self.task.reward_names)}): "
                f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
            )
        if isinstance(scored, ScoringFailed):
            return scored
        return Generation(scored, self.id, generate_s, time.perf_counter() - start, load_s)

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        return placement()


class Scorer:
    """Actor: runs the task's reward functions on the groups generators hand it."""

    def __init__(self, run: RunConfig, cfg: GRPOConfig):
        torch.set_num_threads(run.threads)
        self.task = make_group_task(run.env, cfg, run.seed)

    def score(self, samples: GroupSamples) -> GroupSamples | ScoringFailed:
        try:
            return score_groups(self.task, samples)
        except RewardError as exc:
            return ScoringFailed(str(exc))

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        return placement()


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
    lag_counts: Counter[int] = field(default_factory=Counter)
    """How many trained items had each lag (in versions): the distribution, in as many entries as lags seen."""
    events: list[str] = field(default_factory=list)

    def record_queue(self, depth: int) -> None:
        self.queue_depth = depth
        self.queue_depth_total += depth
        self.queue_depth_count += 1
        self.queue_depth_max = max(self.queue_depth_max, depth)

    def record_lag(self, lag: float) -> None:
        """One trained item's lag: the learner's version minus the version that drew it."""
        self.lag_counts[round(lag)] += 1
        self.lag_total += lag
        self.lag_count += 1
        self.lag_min = min(self.lag_min, lag)
        self.lag_max = max(self.lag_max, lag)

    def lag_quantile(self, q: float) -> float:
        """The ``q`` quantile of the recorded lags (the smallest lag with at least ``q`` of them at or below it)."""
        if not self.lag_counts:
            return 0.0
        lags = sorted(self.lag_counts)
        cumulative = np.cumsum([self.lag_counts[lag] for lag in lags])
        return float(lags[int(np.searchsorted(cumulative, q * cumulative[-1]))])

    def summary(
        self, wall: float, steps: int, generators: int, replay: VersionedReplay, restarts: int, unit: str
    ) -> dict[str, Any]:
        busy = self.learner_busy_s / max(wall, 1e-9)
        counters = {k.replace("slice", unit): v for k, v in replay.counters().items()}
        return {
            "learner_steps": steps,
            "pipeline_wall_s": wall,
            "learner_steps_per_s": steps / max(wall, 1e-9),
            "learner_busy_fraction": busy,
            "learner_idle_fraction": 1 - busy,
            "generator_utilisation": self.generate_s / max(wall * max(generators, 1), 1e-9),
            f"{unit}s_generated": self.generated,
            f"{unit}s_per_s": self.generated / max(wall, 1e-9),
            "queue_depth_mean": self.queue_depth_total / max(self.queue_depth_count, 1),
            "queue_depth_max": self.queue_depth_max,
            "buffer_max": replay.max_size,
            "policy_lag_min": self.lag_min if self.lag_count else 0.0,
            "policy_lag_mean": self.lag_total / max(self.lag_count, 1),
            "policy_lag_p95": self.lag_quantile(0.95),
            "policy_lag_max": self.lag_max,
            "policy_lag_counts": {str(lag): n for lag, n in sorted(self.lag_counts.items())},
            f"{unit}s_dropped_for_lag_fraction": replay.dropped_for_lag / max(replay.added, 1),
            "generator_restarts": restarts,
            "events": self.events,
            **counters,
        }


DEFAULT_QUEUE_SLICES = 16
"""GRPO's ``queue_size`` when it is left at 0: four learner steps of the default four slices."""


def check_pipeline(cfg: GRPOConfig, strategy: StrategyConfig) -> None:
    """Settings that only make sense together; checked before any actor starts."""
    if strategy.buffer_capacity < cfg.slices_per_step:
        raise ConfigError(
            f"buffer_capacity={strategy.buffer_capacity} is not allowed: must be >= slices_per_step "
            f"({cfg.slices_per_step})"
        )
    if 0 < strategy.queue_size < cfg.slices_per_call:
        raise ConfigError(
            f"queue_size={strategy.queue_size} is not allowed: must be >= slices_per_call "
            f"({cfg.slices_per_call}), or no generation would ever be queued"
        )


class RewardFailed(RuntimeError):
    """A reward function raised, returned the wrong thing or hung, or the scorer died; the message names it."""


class PipelineGroups:
    """GRPO's pipeline as the trainer's source of groups: generators → scorer → versioned replay.

    ``next_batch`` tops the generators up (at most ``queue_size`` slices ahead of the learner), then
    returns ``slices_per_step`` scored slices from the buffer, waiting only while it holds too few.
    """

    def __init__(self, trainer: Any, strategy: StrategyConfig, engine: ActorEngine):
        run, cfg = trainer.run, trainer.cfg
        check_pipeline(cfg, strategy)
        self.trainer, self.cfg, self.strategy, self.engine = trainer, cfg, strategy, engine
        self.replay = VersionedReplay(
            strategy.buffer_capacity,
            strategy.max_policy_lag,
            strategy.replay_sampling,
            seed=run.seed,
            max_reuse=strategy.max_reuse,
        )
        self.stats = PipelineStats()
        self.events = self.stats.events
        self.scorer = engine.spawn(Scorer, run, cfg)
        self.scorer_place = engine.call(self.scorer, "where")
        scorer = engine.client(self.scorer, strategy.timeout_s + cfg.reward_timeout_s * max(1, len(cfg.rewards)))
        self.requests = 0
        self.per_call = cfg.slices_per_call
        self.queue_size = strategy.queue_size or DEFAULT_QUEUE_SLICES
        self.score_s = self.wait_s = self.load_s = self.weights_s = 0.0
        self.last_metrics: dict[str, float] = {}

        def request(actor: Any, version: int, weights: Any) -> Any:
            self.requests += 1
            return engine.call(actor, "generate_scored", version, weights, self.requests - 1)

        self.pool = GeneratorPool(
            engine,
            strategy.workers,
            lambda i, restarts: engine.spawn(Generator, run, cfg, i, scorer),
            request,
            strategy,
            self.events,
            depth=2,
        )
        self.startup_s = self.pool.ready(self.scorer)

    def resume(self, version: int) -> None:
        """Go on with the prompts after those the first ``version`` steps trained on."""
        per_step = self.cfg.prompts_per_step
        self.requests = -(-version * per_step // (self.cfg.prompts_per_slice * self.per_call))

    def _weights(self) -> Any:
        start = time.perf_counter()
        flat = self.engine.weights(self.trainer.version, self.trainer.policy.params.flat())
        self.weights_s += time.perf_counter() - start
        return flat

    def _harvest(self, timeout: float = 0) -> None:
        for _, result in self.pool.finished(timeout):
            if isinstance(result, ScoringFailed):
                raise RewardFailed(result.message)
            self.stats.generated += result.samples.prompts // self.cfg.prompts_per_slice
            self.stats.generate_s += result.generate_s
            self.score_s += result.score_s
            self.load_s += result.load_s
            for piece in result.samples.split(self.cfg.prompts_per_slice):
                self.replay.add(int(piece.version[0]), piece)

    def _submit(self, version: int) -> None:
        ahead = len(self.pool.in_flight) * self.per_call + self.replay.untrained()
        self.stats.record_queue(ahead)
        room = (self.queue_size - ahead) // self.per_call
        if room > 0:
            self.pool.submit(version, self._weights, limit=room)

    def next_batch(self, version: int) -> GroupSamples:
        start = time.perf_counter()
        self._harvest()
        self._submit(version)
        while (taken := self.replay.sample(self.cfg.slices_per_step, version)) is None:
            self.pool.wait_any("generators and scorer", version, len(self.replay))
            self._harvest()
            self._submit(version)
        batch = GroupSamples.concat([piece for _, piece in taken])
        lags = version - batch.version
        for drawn_by, _ in taken:  # one lag per slice trained on
            self.stats.record_lag(float(version - drawn_by))
        self.wait_s += time.perf_counter() - start
        self.last_metrics = {
            "pipeline/policy_lag_max": float(lags.max()),
            "pipeline/queue_depth": float(self.stats.queue_depth),
            "pipeline/buffer_size": float(len(self.replay)),
            "pipeline/generator_restarts": float(self.pool.restarted()),
        }
        return batch

    def timing(self) -> dict[str, float]:
        return {
            "generate_s": self.stats.generate_s,
            "score_s": self.score_s,
            "learner_wait_s": self.wait_s,
            "weight_sync_s": self.weights_s + self.load_s,
        }

    def finish(self) -> dict[str, Any]:
        """Drain the generations under way into the buffer; the pipeline's counters for summary.json."""
        for _, result in self.pool.drain():
            if isinstance(result, Generation):
                self.stats.generated += result.samples.prompts // self.cfg.prompts_per_slice
                for piece in result.samples.split(self.cfg.prompts_per_slice):
                    self.replay.add(int(piece.version[0]), piece)
        self.stats.learner_busy_s = self.trainer.update_s
        summary = self.stats.summary(
            self.trainer.train_s,
            self.trainer.version,
            len(self.pool.actors),
            self.replay,
            self.pool.restarted(),
            "slice",
        )
        where = {
            "generators": self.pool.placement(),
            "scorer": resolve_placements(self.engine, [[self.scorer_place]])[0],
        }
        return {**summary, "startup_s": self.startup_s, "placement": where}

    def close(self) -> None:
        self.pool.close()
        self.engine.kill(self.scorer)


def run_pipeline(
    run: RunConfig, strategy: StrategyConfig, cfg: GRPOConfig, run_dir: Path, resume_path: Path | None = None
) -> dict[str, Any]:
    """Train GRPO with ``strategy.workers`` generators and a scorer feeding this process's learner."""
    check_pipeline(cfg, strategy)
    with actor_engine(strategy, run_dir, debug=run.debug) as engine:
        return train_grpo(
            run,
            cfg,
            run_dir,
            resume_path,
            strategy=strategy,
            source_factory=lambda trainer: PipelineGroups(trainer, strategy, engine),
        )


@contextmanager
def actor_engine(
    strategy: StrategyConfig, run_dir: Path | None = None, num_cpus: int | None = None, debug: bool = False
) -> Iterator[Any]:
    """The engine ``strategy.engine`` names, started for the run and stopped after it."""
    if strategy.engine == "monarch":
        from distrl.strategies.monarch_engine import monarch_session

        with monarch_session() as engine:
            yield engine
        return
    from distrl.strategies.ray_engine import ray_session

    with ray_session(strategy.ray_address, run_dir, num_cpus=num_cpus, debug=debug) as ray:
        yield RayActors(ray)
