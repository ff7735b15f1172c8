"""``pipeline``: generators → queue → scorer → versioned replay → learner, all running at once.

N generator actors draw data with their copy of the policy while the learner (this process)
trains on what has already arrived. Two workloads share the machinery:

- GRPO (``grpo``): a generator draws the groups of ``slices_per_call`` slices of prompts per
  request (a language model's completions, or a numeric task's actions) and hands them to the
  scorer actor (both in :mod:`distrl.strategies.group_actors`), which runs the reward functions (in
  reward workers: :mod:`distrl.tasks.rewards`), so that a reward that hangs or crashes is scored or ends the
  run with its name, never stalls the learner; the learner takes ``slices_per_step`` scored slices per
  step (:class:`PipelineGroups`, the GRPO trainer's source).
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
- GRPO's generators are paced by ``max_policy_lag`` (Sample Factory's and AReaL's staleness bound):
  a request is handed out only if it can be trained on in time, so nothing is drawn to be dropped
  (see :class:`PipelineGroups`);
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

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from distrl.config import ConfigError, GRPOConfig, RunConfig, StrategyConfig
from distrl.data.groups import GroupSamples
from distrl.data.versioned import VersionedReplay
from distrl.strategies.actors import ActorEngine, RayActors, resolve_placements
from distrl.strategies.group_actors import Generation, Generator, Scorer, ScoringFailed
from distrl.strategies.pipeline_stats import LengthTally, PipelineStats
from distrl.strategies.pool import GeneratorPool
from distrl.tasks.reward_workers import longest_run_s
from distrl.training.group import train_grpo
from distrl.training.group_sources import StepFill

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
    paced = (strategy.max_policy_lag + 1) * cfg.slices_per_step
    if cfg.slices_per_call > paced:
        raise ConfigError(
            f"slices_per_call={cfg.slices_per_call} is not allowed with max_policy_lag={strategy.max_policy_lag}: "
            f"must be <= (max_policy_lag + 1) * slices_per_step ({paced}), or a request's last slices would be "
            "trained past the lag cap; lower slices_per_call or raise max_policy_lag"
        )


SCORER_CLOSE_S = 2.0
"""Longest the end waits for the scorer to stop its reward workers before it is killed."""


def scoring_bound_s(cfg: GRPOConfig) -> float:
    """The longest the scorer may take on one request's groups: in reward workers, one call per completion and
    reward, each timing out at worst; in the scorer's process, one call per reward."""
    if cfg.reward_workers == 0:
        return cfg.reward_timeout_s * max(1, len(cfg.rewards))
    calls = len(cfg.rewards) * cfg.group_size * cfg.prompts_per_slice * cfg.slices_per_call
    return longest_run_s(calls, cfg.reward_workers, cfg.reward_timeout_s)


class RewardFailed(RuntimeError):
    """A reward function raised, returned the wrong thing or hung, or the scorer died; the message names it."""


class PipelineGroups:
    """GRPO's pipeline as the trainer's source of groups: generators → scorer → versioned replay.

    ``next_batch`` tops the generators up (at most ``queue_size`` slices ahead of the learner), then
    returns ``slices_per_step`` scored slices from the buffer, waiting only while it holds too few.

    Pacing by ``max_policy_lag`` (``L``), with ``S`` = ``slices_per_step`` and ``C`` = ``slices_per_call``:
    a request handed out at learner version ``v`` is drawn with version ``v``, and the ``A`` untrained
    slices ahead of it (buffered or in flight) are trained first: ``O`` of them by the take the learner is
    waiting on (``S``, a step's first; a dynamic-sampling draw's own), the rest ``S`` a step after it. Its
    last slice is trained at ``consume_step = v + ceil((A + C - O) / S)``, and it is handed out only if
    ``consume_step - v <= L``, that is ``A + C <= L * S + O``. (Before a step's first take and without
    restarts, ``A`` is ``k * C - v * S`` for request ``k``, and the rule reads
    ``((k + 1) * C - 1) // S - v <= L``.) The learner then takes first the slices whose deadline
    (version + ``L``) the later steps could not meet,
    waiting for one still in flight (:meth:`VersionedReplay.due`, earliest deadline first), so no slice
    passes the cap untrained. What is dropped for lag all the same is counted (``slices_dropped_for_lag``:
    with ``max_reuse`` > 1, slices already trained on), and the completions of slices dropped before any
    step trained on them with their lengths, beside those of the completions trained on: a bias towards
    short completions would show there.

    With ``dynamic_sampling`` the learner drops the flat groups of the slices it takes and takes more
    slices, ``ceil(missing / prompts_per_slice)`` a draw, until the step holds ``prompts_per_step``
    informative groups (each slice kept whole: up to ``prompts_per_slice - 1`` more) or
    ``dynamic_sampling_max_draws`` draws are made; the generators keep drawing meanwhile.
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
            on_drop=self._dropped,
        )
        self.stats = PipelineStats()
        self.trained_lengths, self.dropped_lengths = LengthTally(), LengthTally()
        self.scorer = engine.spawn(Scorer, run, cfg)
        self.scorer_place = engine.call(self.scorer, "where")
        scorer = engine.client(self.scorer, strategy.timeout_s + scoring_bound_s(cfg))
        self.requests = 0
        self.per_call = cfg.slices_per_call
        self.queue_size = strategy.queue_size or DEFAULT_QUEUE_SLICES
        self.lag_room = strategy.max_policy_lag * cfg.slices_per_step
        """Untrained slices the steps after the current one train before the lag cap: with those the current take
        trains, the bound on the slices ahead of the learner after a new request (see the class docstring)."""
        self.score_s = self.wait_s = self.load_s = self.weights_s = 0.0
        self.weight_bytes_sent = 0
        """Bytes of weights sent to generators: one flat vector per out-of-date generator per version."""
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
            trainer.report,
            depth=2,
        )
        self.startup_s = self.pool.ready({"scorer": self.scorer})

    def resume(self, version: int) -> None:
        """Go on with the prompts after those the learner took before the checkpoint (the trainer's cursor:
        ``version * prompts_per_step`` without dynamic sampling)."""
        self.requests = -(-self.trainer.sampling.cursor // (self.cfg.prompts_per_slice * self.per_call))

    def _weights(self) -> Any:
        start = time.perf_counter()
        vector = self.trainer.policy.params.flat()
        flat = self.engine.weights(self.trainer.version, vector)
        self.weights_s += time.perf_counter() - start
        self.weight_bytes_sent += vector.nbytes
        return flat

    def _harvest(self, timeout: float = 0) -> None:
        for _, result in self.pool.finished(timeout):
            if isinstance(result, ScoringFailed):
                raise RewardFailed(result.message)
            self.trainer.record_scoring(result.samples)
            self.stats.generated += result.samples.prompts // self.cfg.prompts_per_slice
            self.stats.generate_s += result.generate_s
            self.score_s += result.score_s
            self.load_s += result.load_s
            for piece in result.samples.split(self.cfg.prompts_per_slice):
                self.replay.add(int(piece.version[0]), piece)

    def _submit(self, version: int, owed: int) -> None:
        """Hand out the requests the queue and the lag cap allow while the learner waits to take ``owed`` slices
        (see the class docstring)."""
        self.replay.drop_stale(version)  # a slice past the cap is no longer ahead of the learner
        ahead = len(self.pool.in_flight) * self.per_call + self.replay.untrained()
        self.stats.record_queue(ahead)
        room = (min(self.queue_size, self.lag_room + owed) - ahead) // self.per_call
        if room > 0:
            self.pool.submit(version, self._weights, limit=room)

    def _dropped(self, piece: Any, trained: bool) -> None:
        if not trained:
            self.dropped_lengths.add(piece.lengths())

    def _take(self, k: int, version: int) -> GroupSamples:
        """``k`` scored slices for the learner step of ``version``, the due ones first, waiting for the generators
        while the buffer cannot give them."""
        self._harvest()
        self._submit(version, k)
        in_flight = self.pool.in_flight_versions
        per_step = self.cfg.slices_per_step
        while (taken := self.replay.sample(k, version, in_flight() * self.per_call, per_step)) is None:
            self.pool.wait_any("generators and scorer", version, len(self.replay))
            self._harvest()
            self._submit(version, k)
        for drawn_by, _ in taken:  # one lag per slice trained on
            self.stats.record_lag(float(version - drawn_by))
        self.trainer.sampling.cursor += k * self.cfg.prompts_per_slice
        return GroupSamples.concat([piece for _, piece in taken])

    def next_batch(self, version: int) -> GroupSamples:
        start = time.perf_counter()
        cfg = self.cfg
        batch = self._take(cfg.slices_per_step, version)
        sampling: dict[str, float] = {}
        if cfg.dynamic_sampling:
            fill, draws = StepFill(cfg.prompts_per_step), 1
            fill.add(batch)
            while fill.missing and draws < cfg.dynamic_sampling_max_draws:
                fill.add(self._take(-(-fill.missing // cfg.prompts_per_slice), version))
                draws += 1
            batch = fill.batch()
            sampling = self.trainer.sampling.record(draws, fill.dropped, fill.missing > 0)
        self.trained_lengths.add(batch.lengths())
        lags = version - batch.version
        self.wait_s += time.perf_counter() - start
        self.last_metrics = {
            "pipeline/policy_lag_max": float(lags.max()),
            "pipeline/policy_lag_p95": self.stats.lag_quantile(0.95),
            "pipeline/dropped_for_lag": float(self.replay.dropped_for_lag),
            "pipeline/queue_depth": float(self.stats.queue_depth),
            "pipeline/buffer_size": float(len(self.replay)),
            "pipeline/generator_restarts": float(self.pool.restarted()),
            **sampling,
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
                self.trainer.record_scoring(result.samples)
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
        return {
            **summary,
            "completions_dropped_for_lag": self.dropped_lengths.count,
            "dropped_for_lag_mean_length": self.dropped_lengths.mean(),
            "trained_mean_length": self.trained_lengths.mean(),
            "completion_length_counts": {
                "trained": self.trained_lengths.histogram(),
                "dropped_for_lag": self.dropped_lengths.histogram(),
            },
            "startup_s": self.startup_s,
            "weight_sync_bytes_total": self.weight_bytes_sent,
            "placement": where,
        }

    def close(self) -> None:
        self.pool.close()
        try:  # its reward workers would notice it gone anyway: this spares them the wait
            self.engine.result(self.engine.call(self.scorer, "close"), SCORER_CLOSE_S)
        except Exception:  # noqa: BLE001 - dead, or busy with a call that hangs: killed next
            pass
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
