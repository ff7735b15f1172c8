"""``pipeline``: generators → queue → scorer → versioned replay → learner, all running at once.

N generator actors draw groups of samples with their copy of the policy; a scorer actor
rewards the queued slices in batches; the learner (this process) takes scored slices from a
:class:`~distrl.data.replay.VersionedReplay`, steps, and publishes ``(version, weights)``
through Ray's object store after every step. Nobody waits longer than the data demands:

- a generator is handed the newest weights with each generation request and loads them
  between generations (ready-to-update, then ready-to-generate), so one slice never mixes
  versions;
- at most ``queue_size`` slices wait for the scorer: past that, finished generators idle
  (back-pressure) instead of filling memory;
- the learner steps whenever the buffer holds a batch, and otherwise waits on whichever
  stage can feed it, failing after ``starve_timeout_s`` with the name of that stage.

Every generated slice ends trained on, evicted, dropped for lag, or left in the buffer at the
end, and summary.json's counters add up. A generator that dies is restarted; its lost
generation was never counted.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.algos.grpo import GroupBatch, GroupPolicy, GRPOAlgo
from distrl.config import GRPOConfig, RunConfig, StrategyConfig
from distrl.data.replay import VersionedReplay
from distrl.tasks import make_task


class PipelineStalled(RuntimeError):
    """A stage produced nothing for ``starve_timeout_s``; the message names it."""


class Generator:
    """Ray actor: draws ``states_per_slice`` groups of ``group_size`` samples with one policy version."""

    def __init__(self, task: str, cfg: GRPOConfig, seed: int, generator_id: int, restarts: int = 0):
        self.task = make_task(task, seed)
        self.cfg = cfg
        self.id = generator_id
        self.policy = GroupPolicy(self.task.obs_dim, self.task.n_actions, cfg.net_arch, seed)
        self.version = -1
        stream = (seed, generator_id, restarts)
        self.rng = np.random.default_rng(stream)
        self.torch_rng = torch.Generator().manual_seed(int(np.random.SeedSequence(stream).generate_state(1)[0]))
        torch.set_num_threads(1)

    def generate(self, version: int, weights: dict[str, torch.Tensor]) -> dict[str, Any]:
        start = time.perf_counter()
        if version != self.version:  # ready-to-update: load, then ready-to-generate
            self.policy.load_state_dict(weights)
            self.version = version
        states = self.task.states(self.cfg.states_per_slice, self.rng)
        actions, log_probs = self.policy.sample(torch.from_numpy(states), self.cfg.group_size, self.torch_rng)
        return {"obs": states, "actions": actions.numpy(), "log_probs": log_probs.numpy(), "version": self.version,
                "generator": self.id, "generate_s": time.perf_counter() - start}

    def pid(self) -> int:
        import os

        return os.getpid()


class Scorer:
    """Ray actor: rewards a batch of slices with one call of the task's reward function."""

    def __init__(self, task: str, seed: int):
        self.task = make_task(task, seed)
        torch.set_num_threads(1)

    def score(self, *slices: dict[str, Any]) -> list[dict[str, Any]]:
        states = np.concatenate([s["obs"] for s in slices])
        actions = np.concatenate([s["actions"] for s in slices])
        rewards = self.task.rewards(states, actions)
        out, at = [], 0
        for s in slices:
            n = len(s["obs"])
            out.append({**s, "rewards": rewards[at:at + n]})
            at += n
        return out


@dataclass
class PipelineStats:
    """What the pipeline did, for summary.json and TensorBoard."""

    learner_busy_s: float = 0.0
    generate_s: float = 0.0
    slices_generated: int = 0
    generator_restarts: int = 0
    queue_depths: list[int] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    events: list[str] = field(default_factory=list)


def stack(slices: list[tuple[int, dict[str, Any]]]) -> GroupBatch:
    items = [s for _, s in slices]
    cat = lambda name: torch.from_numpy(np.concatenate([s[name] for s in items]))  # noqa: E731
    versions = torch.cat([torch.full((len(s["obs"]),), v, dtype=torch.long) for v, s in slices])
    return GroupBatch(obs=cat("obs"), actions=cat("actions"), behaviour_log_probs=cat("log_probs"),
                      rewards=cat("rewards"), versions=versions)


class Pipeline:
    """The learner's side: owns the actors, the queue, the replay buffer and the learner step."""

    def __init__(self, ray: Any, task: str, cfg: GRPOConfig, run: RunConfig, strategy: StrategyConfig):
        self.ray, self.task_name, self.cfg, self.run, self.strategy = ray, task, cfg, run, strategy
        task_obj = make_task(task, run.seed)
        self.algo = GRPOAlgo(task_obj.obs_dim, task_obj.n_actions, cfg, run.seed)
        self.replay = VersionedReplay(cfg.buffer_capacity, cfg.max_policy_lag, cfg.sampling, seed=run.seed)
        self.stats = PipelineStats()
        self._generator_cls = ray.remote(num_cpus=0)(Generator)
        self.generators = [self._spawn(i) for i in range(strategy.workers)]
        self.scorer = ray.remote(num_cpus=0)(Scorer).remote(task, run.seed)
        self.weights_ref = ray.put(self.algo.weights())
        self.restarts = [0] * strategy.workers

    def _spawn(self, i: int, restarts: int = 0) -> Any:
        return self._generator_cls.remote(self.task_name, self.cfg, self.run.seed, i, restarts)

    def train(self, on_step: Any = None) -> dict[str, Any]:
        ray, cfg = self.ray, self.cfg
        in_flight: dict[Any, int] = {}          # generation ref -> generator index
        idle: list[int] = []                    # generators held back by a full queue
        waiting: deque[Any] = deque()           # generated slices waiting for the scorer
        scoring: Any = None                     # the scorer's in-flight call
        start = time.perf_counter()
        for i in range(len(self.generators)):
            in_flight[self.generators[i].generate.remote(self.algo.version, self.weights_ref)] = i
        while self.algo.version < cfg.learner_steps:
            # finished generations join the queue; their generators go again while the queue has room
            done, _ = ray.wait(list(in_flight), num_returns=len(in_flight), timeout=0)
            for ref in done:
                i = in_flight.pop(ref)
                if self._harvest(ref, i):
                    waiting.append(ref)
                idle.append(i)
            while idle and len(waiting) < cfg.queue_size:
                i = idle.pop(0)
                in_flight[self.generators[i].generate.remote(self.algo.version, self.weights_ref)] = i
            self.stats.queue_depths.append(len(waiting))
            # the scorer takes everything queued, in one batch, when it is free
            if scoring is not None and ray.wait([scoring], timeout=0)[0]:
                for scored in ray.get(scoring):
                    self.replay.add(scored["version"], scored)
                scoring = None
            if scoring is None and waiting:
                scoring = self.scorer.score.remote(*waiting)
                waiting.clear()
            # the learner steps whenever the buffer holds a batch
            batch = self.replay.sample(cfg.slices_per_step, self.algo.version)
            if batch is None:
                self._wait_for_data(in_flight, scoring)
                continue
            step_start = time.perf_counter()
            metrics = self.algo.update(stack(batch))
            self.weights_ref = ray.put(self.algo.policy.state_dict())  # put copies; no clone first
            self.stats.learner_busy_s += time.perf_counter() - step_start
            self.stats.lags.append(metrics["lag_mean"])
            if on_step is not None:
                on_step(self.algo.version, metrics)
        wall = time.perf_counter() - start
        # drain: generations under way and queued slices are scored into the buffer, so that every
        # generated slice is accounted for (trained, evicted, dropped for lag, or left at the end)
        for ref in list(in_flight):
            if self._harvest(ref, in_flight.pop(ref)):
                waiting.append(ref)
        for call in [scoring, self.scorer.score.remote(*waiting) if waiting else None]:
            if call is not None:
                for scored in ray.get(call, timeout=self.strategy.timeout_s):
                    self.replay.add(scored["version"], scored)
        return self._summary(wall)

    def _harvest(self, ref: Any, i: int) -> bool:
        """Account for one finished generation; restart its generator if the process died."""
        from ray.exceptions import RayActorError

        try:
            out = self.ray.get(ref, timeout=self.strategy.timeout_s)
        except RayActorError as exc:
            self.restarts[i] += 1
            self.stats.generator_restarts += 1
            if self.restarts[i] > self.strategy.max_worker_restarts:
                raise RuntimeError(f"generator {i} died {self.restarts[i]} times (max_worker_restarts="
                                   f"{self.strategy.max_worker_restarts}): {exc}") from None
            self.stats.events.append(f"generator {i} died at learner version {self.algo.version}; restarted")
            self.generators[i] = self._spawn(i, self.restarts[i])
            return False
        self.stats.slices_generated += 1
        self.stats.generate_s += out["generate_s"]
        return True

    def _wait_for_data(self, in_flight: dict[Any, int], scoring: Any) -> None:
        refs = [scoring] if scoring is not None else list(in_flight)
        stage = "scorer" if scoring is not None else "generators"
        ready, _ = self.ray.wait(refs, num_returns=1, timeout=self.cfg.starve_timeout_s)
        if not ready:
            raise PipelineStalled(f"the learner received no data for {self.cfg.starve_timeout_s:.0f} s: the {stage} "
                                  f"did not answer (learner version {self.algo.version}, buffer {len(self.replay)} "
                                  f"slices, {len(in_flight)} generations in flight)")

    def _summary(self, wall: float) -> dict[str, Any]:
        counters = self.replay.counters()
        lags = np.array(self.stats.lags) if self.stats.lags else np.zeros(1)
        generators = max(len(self.generators), 1)
        return {"learner_steps": self.algo.version, "wall_s": wall,
                "learner_steps_per_s": self.algo.version / max(wall, 1e-9),
                "learner_busy_fraction": self.stats.learner_busy_s / max(wall, 1e-9),
                "learner_idle_fraction": 1 - self.stats.learner_busy_s / max(wall, 1e-9),
                "generator_utilisation": self.stats.generate_s / max(wall * generators, 1e-9),
                "slices_generated": self.stats.slices_generated,
                "slices_per_s": self.stats.slices_generated / max(wall, 1e-9),
                "queue_depth_mean": float(np.mean(self.stats.queue_depths)) if self.stats.queue_depths else 0.0,
                "queue_depth_max": max(self.stats.queue_depths, default=0),
                "buffer_max": self.replay.max_size,
                "policy_lag_min": float(lags.min()), "policy_lag_mean": float(lags.mean()),
                "policy_lag_max": float(lags.max()), "generator_restarts": self.stats.generator_restarts,
                "events": self.stats.events, **counters}

    def close(self) -> None:
        for actor in [*self.generators, self.scorer]:
            try:
                self.ray.kill(actor)
            except Exception:  # noqa: BLE001, S110 - it may already be gone
                pass


def run_pipeline(task: str, cfg: GRPOConfig, run: RunConfig, strategy: StrategyConfig,
                 run_dir: Path | None = None, on_step: Any = None) -> tuple[dict[str, Any], GRPOAlgo]:
    """Train GRPO on a group task with ``strategy.workers`` generators; returns (summary, learner)."""
    from distrl.strategies.ray_engine import ray_session

    with ray_session(strategy.ray_address, run_dir) as ray:
        pipeline = Pipeline(ray, task, cfg, run, strategy)
        try:
            return pipeline.train(on_step), pipeline.algo
        finally:
            pipeline.close()
