"""GRPO's pipeline actors: the generators that draw groups of completions, and the scorer that rewards them.

Each runs in a process of its own, started by an actor engine (Ray's, or Monarch's) from its class, and builds
its task and policy from the run's configs: a generator its own copy of the policy, loaded with the weights a
request carries; the scorer the task's reward functions (in reward workers: :mod:`distrl.tasks.rewards`).
:class:`~distrl.strategies.pipeline.PipelineGroups` hands them their requests and takes their results.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distrl.config import GRPOConfig, RunConfig
from distrl.data.groups import GroupSamples, draw_groups, score_groups
from distrl.nets.group_factory import make_group_policy
from distrl.strategies.actors import as_array, placement
from distrl.tasks.group import make_group_task
from distrl.tasks.rewards import RewardError
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
        self.task = make_group_task(run.env, cfg, run.seed, run.env_kwargs)
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
        self.task = make_group_task(run.env, cfg, run.seed, run.env_kwargs)

    def score(self, samples: GroupSamples) -> GroupSamples | ScoringFailed:
        try:
            return score_groups(self.task, samples)
        except RewardError as exc:
            return ScoringFailed(str(exc))

    def close(self) -> None:
        """Stop the task's reward workers (they also end within a fifth of a second of this process)."""
        self.task.close()

    def pid(self) -> int:
        return os.getpid()

    def where(self) -> dict[str, Any]:
        return placement()
