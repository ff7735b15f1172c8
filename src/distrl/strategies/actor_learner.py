"""``actor-learner``: N rollout workers (Ray actors) collect; one learner updates.

The IMPALA-style / Flame-Runner pattern. Per iteration the learner sends its weights,
tagged with the policy version, to every worker: inside the call when they are small,
otherwise put into Ray's object store once and shared by reference (:data:`INLINE_BYTES`).
Each worker loads them into its policy replica and returns numpy data — whole
episodes (REINFORCE) or fixed-length fragments (PPO). The learner merges the results in
worker order (so runs are reproducible whatever order they arrive in) and updates.

:class:`RemoteCollector` has the interface of the local collectors, so the trainers run
unchanged: only where collection happens differs. A worker whose process dies is
replaced and its share collected again (up to ``max_worker_restarts`` times per worker);
an exception raised by an env inside a worker is reported with the worker id, the env id
and the traceback, and restarts the worker or aborts the run (``on_worker_error``).
"""

from __future__ import annotations

import os
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distrl.config import RunConfig, StrategyConfig
from distrl.data.episodes import EpisodeBatch, merge_episode_batches
from distrl.data.rollout import Rollout, merge_rollouts
from distrl.data.wire import pack, unpack
from distrl.strategies.actors import (
    ActorDied,
    ActorEngine,
    ActorRaised,
    Overheads,
    RayActors,
    as_array,
    ask_each,
    failure_note,
    replace_actor,
    resolve_placements,
    spend_restart,
)

INLINE_BYTES = 100_000
"""Weights smaller than this travel inside each worker's call (Ray's inline limit for arguments);
larger ones go into the object store once, shared by every worker. Measured on the 2-core
machines: an actor receives a small inline payload in about 2.7 ms round trip, but fetching a
put object costs it 4.7-12 ms, which doubled the per-iteration overhead.

Weights go out and batches come back packed into one ``bytes`` message (:mod:`distrl.data.wire`,
:meth:`RolloutWorker.collect_packed`): the learner serialises the weights once for all workers
instead of once per call, and Ray moves one buffer instead of a dozen small arrays. In a probe with
2 workers on CartPole (50 episodes each), one pickled buffer each way took the median time beyond
the slower worker's collection from 3.5-4.4 ms to 2.9-3.1 ms; the wire message, which cannot run
code when read, cost 0.36 ms more than pickle in an interleaved comparison (3.97 against 3.61 ms).

Ray's compiled graphs (one per worker, calls and results through shared-memory channels) were
tried and dropped: with 2 workers on CartPole they cut that time to 3.2-4.4 ms against 6.3-6.7 ms
for tasks, but a process waiting on a channel busy-waits (the learner showed 100% CPU while its
workers collected), which on 2 cores takes a core from the workers: episodes/s fell from 144-170
to 78-103."""

PACKED_RESULT_BYTES = 512 * 1024
"""Batches with fewer bytes of arrays than this come back packed; larger ones as they are."""

BATCH_TYPES = {cls.__name__: cls for cls in (Rollout, EpisodeBatch)}


class WorkerError(RuntimeError):
    """A rollout worker failed; the message names the worker (and env, for env errors)."""


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a rollout worker needs to build its env, policy replica and collector."""

    algo: str
    run: RunConfig
    cfg: Any
    worker_id: int

    def env_offset(self, rows: int) -> int:
        """The global index of the worker's first env row (``rows`` per worker: n_envs, times the agents of a
        multi-agent env)."""
        return self.worker_id * rows


class RolloutWorker:
    """Runs in a Ray actor: an env, a policy replica and the same collector the learner would use."""

    def __init__(self, spec: WorkerSpec):
        import torch

        from distrl.envs.selfplay import attach_pool
        from distrl.envs.vector import make_run_env
        from distrl.nets import make_agent
        from distrl.nets.multiagent import agent_setup_for
        from distrl.training.state import set_cpu_options

        set_cpu_options(spec.run)  # as the learner and single do: threads, subnormal flushing
        self.spec = spec
        cfg, run = spec.cfg, spec.run
        self.env = make_run_env(run, cfg.n_envs)
        obs_space = self.env.single_observation_space
        setup = agent_setup_for(run, self.env.agents)  # no trainer here: the worker's own env gives the agents

        def build_agent() -> Any:
            return make_agent(
                obs_space,
                self.env.single_action_space,
                cfg,
                torch.device("cpu"),
                run.seed,
                run.policy,
                run.precision,
                run.network_mask,
                setup,
            )

        self.agent = build_agent()
        self.opponents = attach_pool(self.env, build_agent, run)  # self-play: snapshots of the weights received
        rows = self.env.n_envs
        self.first_row = spec.env_offset(rows)
        if spec.algo == "reinforce":
            from distrl.data.episodes import EpisodeCollector

            self.collector: Any = EpisodeCollector(
                self.env, self.agent, run.seed, self.first_row, cfg.max_episode_steps
            )
            self.obs_normalizer = self.reward_scaler = None
        else:
            from distrl.data.normalize import ObsNormalizer, RewardScaler
            from distrl.data.rollout import RolloutCollector

            self.obs_normalizer = ObsNormalizer.for_space(obs_space, cfg.normalize_obs, cfg.clip_obs)
            self.reward_scaler = RewardScaler(rows, cfg.gamma, cfg.normalize_reward)
            self.collector = RolloutCollector(
                self.env, self.agent, self.obs_normalizer, self.reward_scaler, cfg.n_steps, run.seed, self.first_row
            )

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        from distrl.strategies.actors import placement

        return placement()

    def reset(self, seed: int, segment: int) -> None:
        self.collector.reset(seed, segment)

    def _load(self, payload: dict[str, Any]) -> None:
        import torch

        if "params" not in payload:  # this worker already holds the version
            return
        self.agent.params.data.copy_(torch.from_numpy(as_array(payload["params"])))
        self.agent.refresh_acting_copy()
        if self.opponents is not None:
            self.opponents.observe(int(payload["version"]), self.agent.params.data)
        if self.obs_normalizer is not None and "obs_stats" in payload:
            self.obs_normalizer.stats.load(payload["obs_stats"])
            self.obs_normalizer.refresh()
            self.reward_scaler.stats.load(payload["reward_stats"])

    def collect(
        self, payload: dict[str, Any], episodes: int, behaviour_log_probs: bool = False
    ) -> Rollout | EpisodeBatch:
        """Load the weights in ``payload`` (if any) and collect; ``behaviour_log_probs`` records the
        log-probabilities of the actions taken, for a learner that may have moved on (pipeline)."""
        self._load(payload)
        start = time.perf_counter()
        try:
            if self.spec.algo == "reinforce":
                batch: Rollout | EpisodeBatch = self.collector.collect(episodes, payload["version"])
            else:
                batch = self.collector.collect(payload["version"])
                if behaviour_log_probs:  # the learner may have moved on: its own critic values the data
                    batch.values = None
                    if batch.log_probs is None:
                        batch.log_probs = self._log_probs(batch)
        except Exception as exc:  # noqa: BLE001 - reported with worker id, env id and traceback
            first, last = self.first_row, self.first_row + self.env.n_envs - 1
            raise WorkerError(
                f"worker {self.spec.worker_id}, env {self.spec.run.env} (global env indices {first}-{last}): "
                f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"
            ) from None
        # the worker's whole collection, with the collector freeing its per-step lists (0.4 ms for
        # 1,000 CartPole steps): what the learner waits for beyond this is transport overhead
        batch.collect_s = time.perf_counter() - start
        return batch

    def collect_packed(self, packed_payload: bytes, episodes: int) -> bytes | Rollout | EpisodeBatch:
        """:meth:`collect` with the payload packed, and the result too unless it is large: Ray passes
        large arrays through its object store without a copy. See :func:`unpack_batch`."""
        batch = self.collect(unpack(packed_payload), episodes)
        size = sum(v.nbytes for v in vars(batch).values() if isinstance(v, np.ndarray))
        return pack({"type": type(batch).__name__, **vars(batch)}) if size < PACKED_RESULT_BYTES else batch

    def self_play_table(self) -> dict[str, Any] | None:
        """Self-play: this worker's training games record, its learner Elo and its pool's opponents (None without
        self-play)."""
        from distrl.envs.selfplay import self_play_summary

        return self_play_summary(self.opponents, self.env) if self.opponents is not None else None

    def _log_probs(self, rollout: Rollout) -> np.ndarray:
        import torch

        T, N = rollout.rewards.shape
        with torch.no_grad():
            obs = torch.from_numpy(rollout.obs[:T].reshape(T * N, *rollout.obs.shape[2:]))
            actions = torch.from_numpy(rollout.actions.reshape(T * N, *rollout.actions.shape[2:]))
            return self.agent.log_prob(obs, actions).numpy().reshape(T, N)


def workers_self_play(engine: ActorEngine, actors: list[Any], timeout_s: float) -> dict[str, Any]:
    """summary.json's ``self_play`` where rollout workers play the training games, each against a pool of its own
    (actor-learner, pipeline): ``workers``, each worker's table in worker order (see
    :meth:`RolloutWorker.self_play_table`; ``{"lost": reason}`` for one that did not answer), and
    ``training_games``, the records of those that answered, summed. A worker restarted during the run reports
    its replacement's games only."""
    tables = ask_each(engine, actors, "self_play_table", timeout_s)
    records = [table["training_games"] for table in tables if "lost" not in table]
    summed = {outcome: sum(record[outcome] for record in records) for outcome in (records[0] if records else {})}
    return {"training_games": summed, "workers": tables}


def unpack_batch(result: bytes | Rollout | EpisodeBatch) -> Rollout | EpisodeBatch:
    """A worker's batch from what :meth:`RolloutWorker.collect_packed` returned."""
    if not isinstance(result, bytes):
        return result
    fields = unpack(result)
    return BATCH_TYPES[fields.pop("type")](**fields)


@dataclass
class Failure:
    worker: int
    iteration: int
    reason: str
    at: float = field(default_factory=time.time)


class RemoteCollector:
    """Fans collection out to rollout-worker actors on an :class:`~distrl.strategies.actors.ActorEngine` and merges
    their results; a collector like the local ones (``RolloutSource`` for PPO, ``EpisodeSource`` for REINFORCE)."""

    def __init__(self, trainer: Any, strategy: StrategyConfig, engine: ActorEngine):
        self.trainer = trainer
        self.strategy = strategy
        self.engine = engine
        self.n_workers = strategy.workers
        self.algo = trainer.algo_name
        self.restarts = [0] * self.n_workers
        self.failures: list[Failure] = []
        self.seed, self.segment = trainer.run.seed, 0
        self.last_overhead_s = 0.0
        self.overheads = Overheads()
        self.actors = [self._spawn(i, 0) for i in range(self.n_workers)]
        self.places = [[engine.call(actor, "where")] for actor in self.actors]
        """Per worker, a pending ``where`` for each actor it has had (see :meth:`finish`)."""

    def _spawn(self, worker: int, restarts: int) -> Any:
        spec = WorkerSpec(self.algo, self.trainer.run, self.trainer.cfg, worker)
        actor = self.engine.spawn(RolloutWorker, spec, cpus=self.strategy.worker_cpus, gpus=self.strategy.worker_gpus)
        if restarts:  # a replacement starts new episodes: seeds depend on the restart count, not on chance
            self._wait_all(
                [self.engine.call(actor, "reset", self.seed, self.segment + 1_000_003 * restarts)], "reset", [worker]
            )
        return actor

    def worker_pids(self) -> list[int]:
        return self._wait_all([self.engine.call(a, "pid") for a in self.actors], "pid")

    def reset(self, seed: int, segment: int = 0) -> None:
        self.seed, self.segment = seed, segment
        self._wait_all([self.engine.call(a, "reset", seed, segment) for a in self.actors], "reset")

    def _wait_all(self, pending: list[Any], what: str, workers: list[int] | None = None) -> list[Any]:
        done = self.engine.wait(pending, self.strategy.timeout_s)
        if len(done) < len(pending):
            late = [(workers or list(range(len(pending))))[i] for i, p in enumerate(pending) if p not in done]
            raise WorkerError(f"rollout worker(s) {late} did not answer {what} within {self.strategy.timeout_s:g}s")
        return [self.engine.result(p, self.strategy.timeout_s) for p in pending]

    def _shares(self, total: int) -> list[int]:
        base, extra = divmod(total, self.n_workers)
        return [base + (1 if i < extra else 0) for i in range(self.n_workers)]

    def collect(self, *args: Any) -> Rollout | EpisodeBatch:
        """PPO: ``collect(policy_version, ...)``; REINFORCE: ``collect(n_episodes, policy_version)``."""
        start = time.perf_counter()
        shares = self._shares(args[0]) if self.algo == "reinforce" else [0] * self.n_workers
        payload: Any = pack(self.trainer.weights())
        if len(payload) >= INLINE_BYTES:
            payload = self.engine.shared(payload)  # one object for every worker
        pending = {
            self.engine.call(self.actors[i], "collect_packed", payload, shares[i]): i for i in range(self.n_workers)
        }
        results: dict[int, Any] = {}
        while pending:
            # a failed or dead worker's result is ready at once (as an error): only a hung worker is late
            done = self.engine.wait(list(pending), self.strategy.timeout_s)
            late = sorted(worker for call, worker in pending.items() if call not in done)
            if late:
                raise WorkerError(
                    f"rollout worker(s) {late} did not return a batch within {self.strategy.timeout_s:g}s"
                )
            for call in done:
                worker = pending.pop(call)
                try:
                    results[worker] = self.engine.result(call, self.strategy.timeout_s)
                except (ActorDied, ActorRaised) as exc:  # every failure is either retried or reported
                    self._replace(worker, exc)
                    pending[self.engine.call(self.actors[worker], "collect_packed", payload, shares[worker])] = worker
        parts = [unpack_batch(results[i]) for i in range(self.n_workers)]
        merged = merge_episode_batches(parts) if self.algo == "reinforce" else merge_rollouts(parts)
        self.last_overhead_s = max(0.0, time.perf_counter() - start - merged.collect_s)
        self.overheads.add(self.last_overhead_s)
        return merged

    def _replace(self, worker: int, exc: ActorDied | ActorRaised) -> None:
        env_error = isinstance(exc, ActorRaised) and exc.kind == WorkerError.__name__
        reason = str(exc) if isinstance(exc, ActorRaised) else f"{type(exc).__name__}: {exc}"
        first_line = reason.strip().splitlines()[0] if reason.strip() else type(exc).__name__
        where = failure_note(self.engine, self.places, worker)
        self.failures.append(Failure(worker, self.trainer.iteration, first_line))
        if env_error and self.strategy.on_worker_error == "abort":
            raise WorkerError(reason) from None
        spend_restart(self.restarts, worker, self.strategy.max_worker_restarts, "worker", first_line, WorkerError)
        self.trainer.report(
            f"worker {worker}{where} failed at iteration {self.trainer.iteration}: {first_line}; "
            f"restarting it ({self.restarts[worker]}/{self.strategy.max_worker_restarts})"
        )
        replace_actor(self.engine, self.actors, self.places, worker, self._spawn, self.restarts)

    def iteration_metrics(self) -> dict[str, float]:
        return {"time/overhead_s": self.last_overhead_s}

    def summary(self) -> dict[str, Any]:
        """Per-iteration transport overhead (weights out, scheduling, results back)."""
        return self.overheads.summary()

    def finish(self) -> dict[str, Any]:
        """For summary.json: where each rollout worker ran (every actor it has had, the replaced ones first) and,
        with self-play, each worker's games and pool (:func:`workers_self_play`)."""
        figures: dict[str, Any] = {"placement": {"workers": resolve_placements(self.engine, self.places)}}
        if self.trainer.run.self_play:
            figures["self_play"] = workers_self_play(self.engine, self.actors, self.strategy.timeout_s)
        return figures

    def close(self) -> None:
        for actor in self.actors:
            self.engine.kill(actor)


def run_actor_learner(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Any, resume_path: Any = None
) -> dict[str, Any]:
    """Train with ``strategy.workers`` Ray rollout workers and this process as the learner."""
    from distrl.config import ConfigError, scaled

    if run.algo not in ("ppo", "appo", "impala", "reinforce"):
        raise ConfigError(
            f"algo={run.algo!r} is not available here: run_actor_learner trains ppo, appo, impala or reinforce "
            "(dqn and sac: run_apex)"
        )
    effective = scaled(cfg, strategy, strategy.workers)
    return train_with_ray_actors(run, strategy, cfg, effective, run_dir, resume_path, RemoteCollector)


def train_with_ray_actors(
    run: RunConfig,
    strategy: StrategyConfig,
    cfg: Any,
    effective: Any,
    run_dir: Any,
    resume_path: Any,
    source: Callable[[Any, StrategyConfig, ActorEngine], Any],
) -> dict[str, Any]:
    """Run ``run.algo``'s trainer here on ``effective`` (``cfg`` as asked for), collecting through
    ``source(trainer, strategy, engine)``: Ray actors on an embedded instance or the cluster at ``--ray-address``."""
    from distrl.strategies.ray_engine import ray_session
    from distrl.training import make_trainer

    start = time.perf_counter()
    cpus = max(os.cpu_count() or 1, int(np.ceil(strategy.workers * strategy.worker_cpus)))
    with ray_session(strategy.ray_address, run_dir, num_cpus=cpus, debug=run.debug) as ray:
        _check_resources(ray, strategy)
        trainer = make_trainer(
            run.algo,
            run,
            effective,
            run_dir=run_dir,
            strategy=strategy,
            requested=cfg,
            collector_factory=lambda t: source(t, strategy, RayActors(ray)),
        )
        return trainer.run_to_end(resume_path, start)


def _check_resources(ray: Any, strategy: StrategyConfig) -> None:
    """Fail clearly, instead of waiting forever, when the cluster cannot place every worker."""
    from distrl.config import ConfigError

    free = ray.available_resources()
    for name, per_worker in (("CPU", strategy.worker_cpus), ("GPU", strategy.worker_gpus)):
        need = per_worker * strategy.workers
        if need > free.get(name, 0.0) + 1e-9:
            flag = "--worker-cpus" if name == "CPU" else "--worker-gpus"
            raise ConfigError(
                f"workers={strategy.workers} x {flag} {per_worker} needs {need:g} {name}s; "
                f"the Ray cluster has {free.get(name, 0.0):g} free"
            )
