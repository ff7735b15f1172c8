"""``actor-learner`` for dqn and sac: the learner's side of distributed prioritised replay (Ape-X, Horgan et al.
2018, arXiv:1803.00933).

:class:`ApexSource` is the :class:`~distrl.training.replay_learner.ReplaySource` the trainer learns from: it keeps
every replay actor (:class:`~distrl.strategies.replay_actors.ReplayActor`) with two requests queued, counts what
they pushed into the :class:`~distrl.strategies.replay_actors.ReplayHolder`, fetches sampled batches one call
ahead of the learner (the next batches are on their way while it trains on these), sends priorities back without
waiting, and measures the lag of what the learner trains on (versions of the sampled transitions) and the insert
and sample rates.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.config import RunConfig, StrategyConfig
from distrl.data.replay import Transitions
from distrl.data.wire import pack, unpack
from distrl.strategies.actors import ActorDied, ActorEngine, ActorRaised, resolve_placements
from distrl.strategies.pool import GeneratorPool, PipelineStalled
from distrl.strategies.replay_actors import PUSH_STEPS, ActorSpec, ReplayActor, ReplayHolder, ReplayHolderLost
from distrl.training.replay_learner import Arrivals


class RemoteReplay:
    """The holder's replay as the trainer's checkpoint hooks see it (``size``, ``save``, ``load``). The holder
    writes and reads the file itself: on a cluster, the run directory must be where its node can reach it."""

    def __init__(self, source: ApexSource):
        self.source = source

    @property
    def size(self) -> int:
        return self.source.replay_size

    def save(self, path: Path) -> None:
        self.source.holder_call("save", str(path))

    def load(self, path: Path) -> None:
        self.source.replay_size = self.source.inserted = int(self.source.holder_call("load", str(path)))


class ApexSource:
    """Replay actors and the replay's holder, seen from the learner (see the module docstring)."""

    def __init__(self, trainer: Any, strategy: StrategyConfig, engine: ActorEngine):
        self.trainer, self.strategy, self.engine = trainer, strategy, engine
        run, cfg, algo = trainer.run, trainer.cfg, trainer.algo_name
        self.holder = engine.spawn(ReplayHolder, trainer.replay_recipe(), run.seed)
        self.holder_place = engine.call(self.holder, "where")
        self.seed, self.segment = run.seed, 0

        def spawn(i: int, restarts: int) -> Any:
            spec = ActorSpec(algo, run, cfg, i, strategy.workers, strategy.timeout_s)
            actor = engine.spawn(ReplayActor, spec, self.holder, cpus=strategy.worker_cpus, gpus=strategy.worker_gpus)
            if restarts:  # a replacement starts new episodes, seeded by its restart count
                engine.call(actor, "reset", self.seed, self.segment + 1_000_003 * restarts)
            return actor

        def request(actor: Any, version: int, weights: dict[str, Any] | None) -> Any:
            payload = {"version": version, "uniform": self.inserted < cfg.learning_starts, **(weights or {})}
            return engine.call(actor, "collect", payload, PUSH_STEPS)

        self.pool = GeneratorPool(engine, strategy.workers, spawn, request, strategy, trainer.report, depth=2)
        self.replay = RemoteReplay(self)
        self.inserted = self.replay_size = self.sampled = 0
        self.published = 0
        self.ahead: tuple[tuple[int, int], Any] | None = None  # the sample call under way: ((n, batch), pending)
        self.lags = np.zeros(1, dtype=np.int64)  # transitions trained on, by lag in policy versions
        self.last_metrics: dict[str, float] = {}
        self.actor_lag = 0
        """Versions the newest push's weights were behind the learner's when it arrived."""
        # the actors' start (imports, envs) is bounded by timeout_s, as the pipeline's is, so that the starve
        # timeout measures waits for data alone: on a loaded machine the start alone can pass it. An actor that
        # failed to start is restarted at its first request, the holder's loss named at its first call.
        self.startup_s = self.pool.ready({"replay holder": self.holder}, check=False)
        self.started = time.perf_counter()

    # ---- the holder ----

    def holder_call(self, method: str, *args: Any) -> Any:
        """Call the holder and wait (up to ``timeout_s``); its loss is a :class:`ReplayHolderLost` naming it."""
        return self._holder_result(self.engine.call(self.holder, method, *args), method)

    def _holder_result(self, pending: Any, method: str) -> Any:
        try:
            if not self.engine.wait([pending], self.strategy.timeout_s):
                raise ReplayHolderLost(
                    f"the replay holder did not answer {method} within {self.strategy.timeout_s:g}s{self._where()}"
                )
            return self.engine.result(pending, self.strategy.timeout_s)
        except (ActorDied, ActorRaised) as exc:
            raise self._lost(f"{type(exc).__name__}: {exc}") from None

    def _where(self) -> str:
        places = resolve_placements(self.engine, [[self.holder_place]])[0]
        return f" (pid {places[0].get('pid')} on {places[0].get('host')})" if places and places[0] else ""

    def _lost(self, reason: str) -> ReplayHolderLost:
        return ReplayHolderLost(
            f"the replay holder{self._where()} failed: {reason.strip().splitlines()[0] if reason.strip() else reason}; "
            f"the run stops at {self.trainer.steps:,} steps: distrl train --resume RUN continues from its last checkpoint "
            "(with --save-replay, the replay saved in it comes back too)"
        )

    # ---- ReplaySource ----

    def arrivals(self, wait: bool, hold: bool) -> Arrivals:
        if not hold:
            self.pool.submit(self.published, self._weights)
        if wait and not self.pool.in_flight:
            raise PipelineStalled("the learner waits for data and no replay actor has a request under way")
        while True:
            restarts = self.pool.restarted()
            got = self.pool.finished(self.strategy.starve_timeout_s if wait else 0)
            if got or not wait or hold or self.pool.restarted() == restarts:
                break
            self.pool.submit(self.published, self._weights)  # a replaced actor's requests went with the old one
        if wait and not got:
            raise PipelineStalled(
                f"no replay actor pushed anything for {self.strategy.starve_timeout_s:.0f} s "
                f"({len(self.pool.in_flight)} requests under way, replay size {self.replay_size:,})"
            )
        arrived = Arrivals()
        for _, receipt in got:
            if receipt["replay_lost"]:
                raise self._lost(receipt["replay_lost"])
            arrived.steps += receipt["steps"]
            self.actor_lag = max(0, self.trainer.policy_version - receipt["version"])
            arrived.returns += receipt["returns"]
            arrived.lengths += receipt["lengths"]
            self.inserted += receipt["added"]
        self.replay_size = min(self.inserted, self.trainer.cfg.buffer_size)
        return arrived

    def _weights(self) -> dict[str, Any]:
        payload = self.trainer.weights()
        return {"params": self.engine.weights(payload["version"], payload["params"])}

    def batches(self, n: int, batch_size: int, beta: float) -> list[Transitions]:
        shape = (n, batch_size)
        if self.ahead is None or self.ahead[0] != shape:
            self.ahead = (shape, self.engine.call(self.holder, "sample", n, batch_size, beta))
        pending = self.ahead[1]
        self.ahead = (shape, self.engine.call(self.holder, "sample", n, batch_size, beta))  # the next, under way
        data = unpack(self._holder_result(pending, "sample"))
        self.sampled += n * batch_size
        lag = np.maximum(self.trainer.policy_version - data.pop("versions").reshape(-1), 0)
        counts = np.bincount(lag)
        if len(counts) > len(self.lags):
            self.lags = np.concatenate([self.lags, np.zeros(len(counts) - len(self.lags), np.int64)])
        self.lags[: len(counts)] += counts
        self.last_metrics = {
            "replay/lag_mean": float(lag.mean()),
            "replay/lag_p95": float(np.percentile(lag, 95)),
            "replay/lag_max": float(lag.max()),
        }
        rows = data.pop("rows")
        device = self.trainer.device
        return [
            Transitions(
                **{k: torch.from_numpy(np.ascontiguousarray(v[i])).to(device) for k, v in data.items()}, rows=rows[i]
            )
            for i in range(n)
        ]

    def update_priorities(self, rows: list[np.ndarray], errors: list[np.ndarray]) -> None:
        message = pack({"rows": np.concatenate(rows), "errors": np.concatenate(errors).astype(np.float64)})
        self.engine.call(
            self.holder, "update_priorities", message
        )  # not waited for: a lost holder shows at the next sample

    def publish(self, version: int) -> None:
        self.published = version

    def iteration_metrics(self) -> dict[str, float]:
        elapsed = max(time.perf_counter() - self.started, 1e-9)
        return {
            **self.last_metrics,
            "replay/size": float(self.replay_size),
            "replay/insert_rate": self.inserted / elapsed,
            "replay/sample_rate": self.sampled / elapsed,
            "replay/actor_restarts": float(self.pool.restarted()),
            "replay/actor_lag": float(self.actor_lag),
        }

    # ---- Collector lifecycle ----

    def reset(self, seed: int, segment: int = 0) -> None:
        self.seed, self.segment = seed, segment

    def _lag_summary(self) -> dict[str, float | None]:
        total = int(self.lags.sum())
        if not total:
            return {"lag_mean": None, "lag_p95": None, "lag_max": None}
        cumulative = np.cumsum(self.lags)
        return {
            "lag_mean": float((np.arange(len(self.lags)) * self.lags).sum() / total),
            "lag_p95": int(np.searchsorted(cumulative, 0.95 * total)),
            "lag_max": int(np.flatnonzero(self.lags)[-1]),
        }

    def summary(self) -> dict[str, Any]:
        train_s = max(self.trainer.train_s, 1e-9)
        return {
            "replay_inserted": self.inserted,
            "replay_sampled": self.sampled,
            "insert_rate": self.inserted / train_s,
            "sample_rate": self.sampled / train_s,
            "replay_ratio_measured": self.sampled / max(self.inserted, 1),
            "actor_restarts": self.pool.restarted(),
            "startup_s": self.startup_s,
            **self._lag_summary(),
        }

    def finish(self) -> dict[str, Any]:
        """Let the pushes under way land (their steps are not counted); where each actor and the holder ran."""
        for _, receipt in self.pool.drain():
            if not receipt["replay_lost"]:
                self.inserted += receipt["added"]
        holder = resolve_placements(self.engine, [[self.holder_place]])
        return {"placement": {"actors": self.pool.placement(), "replay_holder": holder[0]}}

    def close(self) -> None:
        self.pool.close()
        self.engine.kill(self.holder)


def run_apex(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Path, resume_path: Path | None = None
) -> dict[str, Any]:
    """DQN or SAC with ``strategy.workers`` replay actors feeding a shared replay and this process's learner (its
    config unscaled: the learner samples its batches from the replay whatever the number of actors)."""
    from distrl.strategies.actor_learner import train_with_ray_actors

    return train_with_ray_actors(run, strategy, cfg, cfg, run_dir, resume_path, ApexSource)
