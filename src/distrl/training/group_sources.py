"""Where GRPO's trainer gets its scored groups: the :class:`GroupSource` contract, :class:`LocalGroups` (drawn and
scored in this process), and DAPO's dynamic sampling (:class:`DynamicSampling`, :class:`StepFill`), which the local
source and the pipeline's (:class:`distrl.strategies.pipeline.PipelineGroups`) apply alike.

:class:`LocalGroups` sees the trainer it feeds (:class:`~distrl.training.group.GroupTrainer`) through
:class:`GroupLearner`, what it reads and records there, so this module never imports the trainer's.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from distrl.algos.protocols import Sync
from distrl.config import RunConfig
from distrl.data.groups import GroupSamples, draw_groups, score_groups
from distrl.nets.group_policy import GroupPolicy
from distrl.tasks.group import GroupTask


class GroupSource(Protocol):
    """Where a GRPO trainer's scored groups come from."""

    last_metrics: dict[str, float]
    """Figures of the last batch the trainer logs with its own (policy lag, queue depth, ...)."""

    def next_batch(self, version: int) -> GroupSamples:
        """This worker's scored groups for the learner step that makes ``version + 1``."""
        ...

    def timing(self) -> dict[str, float]:
        """Seconds spent so far by stage (generate, score, wait, weight_sync, ...)."""
        ...

    def resume(self, version: int) -> None:
        """Go on from a checkpoint taken after ``version`` learner steps."""
        ...

    def finish(self) -> dict[str, Any]:
        """Figures for summary.json at the end (a pipeline drains its generators first)."""
        ...

    def close(self) -> None: ...


def drop_flat_groups(samples: GroupSamples) -> tuple[GroupSamples | None, int]:
    """``samples`` without the groups whose rewards are all equal (None if that is every group), and how many
    those were: under group-relative advantages such a group has advantage 0 and no policy gradient."""
    assert samples.reward is not None
    rewards = samples.reward.reshape(-1, samples.group_size)
    flat = (rewards == rewards[:, :1]).all(axis=1)
    if not flat.any():
        return samples, 0
    kept = [group for group, is_flat in zip(samples.split(1), flat) if not is_flat]
    return (GroupSamples.concat(kept) if kept else None), int(flat.sum())


@dataclass
class DynamicSampling:
    """DAPO's dynamic sampling (Yu et al. 2025, arXiv:2503.14476, section 3.2): over a run's steps, what it
    dropped and drew, and where :class:`LocalGroups` draws its next prompts.

    A group whose rewards are all equal teaches nothing under group-relative advantages, and the more of
    them a batch holds, the smaller its gradient: with ``dynamic_sampling`` such groups are dropped and
    fresh prompts' groups drawn in their place until the step holds ``prompts_per_step`` informative groups,
    up to ``dynamic_sampling_max_draws`` draws per step (the first included); past it the step trains on
    what it has (a *short* step). Checkpoints record these figures and every worker receives them at
    start-up, so a resumed run draws the prompts the uninterrupted one draws.
    """

    cursor: int = 0
    """The next prompt position :class:`LocalGroups` draws (every draw advances it; the pipeline advances it by
    the prompts its learner takes, for a resumed run's generators to start after them)."""
    draws: int = 0
    """Draws of prompts over the run's steps (one per step without dynamic sampling)."""
    flat_groups_dropped: int = 0
    short_steps: int = 0
    """Steps that reached ``dynamic_sampling_max_draws`` without a full batch."""

    def record(self, draws: int, dropped: int, short: bool) -> dict[str, float]:
        """Count one step's draws and dropped groups; its figures for TensorBoard."""
        self.draws += draws
        self.flat_groups_dropped += dropped
        self.short_steps += short
        return {"dynamic_sampling/draws": float(draws), "dynamic_sampling/dropped_groups": float(dropped)}

    def values(self) -> list[float]:
        return [float(getattr(self, f.name)) for f in dataclasses.fields(self)]

    def load(self, values: Any) -> None:
        """From :meth:`values` (a checkpoint's list, or the start-up broadcast's tensor)."""
        for f, value in zip(dataclasses.fields(self), values):
            setattr(self, f.name, int(value))

    def summary(self, steps: int) -> dict[str, Any]:
        return {
            "dynamic_sampling_flat_groups_dropped": self.flat_groups_dropped,
            "dynamic_sampling_draws": self.draws / max(steps, 1),
            "dynamic_sampling_short_steps": self.short_steps,
        }


class StepFill:
    """One learner step's batch under dynamic sampling: the informative groups of every draw, until ``target``."""

    def __init__(self, target: int):
        self.target = target
        self.kept: list[GroupSamples] = []
        self.groups = self.flat = 0
        self.last: GroupSamples | None = None

    def add(self, samples: GroupSamples | None) -> None:
        if samples is None:
            return
        informative, flat = drop_flat_groups(samples)
        self.last, self.flat = samples, self.flat + flat
        if informative is not None:
            self.kept.append(informative)
            self.groups += informative.prompts

    @property
    def missing(self) -> int:
        return max(self.target - self.groups, 0)

    @property
    def dropped(self) -> int:
        """Flat groups left out of :meth:`batch`."""
        return self.flat - (self.last.prompts if not self.kept and self.last is not None else 0)

    def batch(self) -> GroupSamples:
        """The informative groups; with none at all, the last draw's (all flat: no policy gradient, as a step
        without dynamic sampling has on such a batch)."""
        if self.kept:
            return GroupSamples.concat(self.kept)
        assert self.last is not None
        return self.last


class GroupLearner(Protocol):
    """What :class:`LocalGroups` reads and records on the GRPO trainer it feeds."""

    run: RunConfig
    cfg: Any
    """The run's GRPOConfig."""
    sync: Sync
    task: GroupTask
    policy: GroupPolicy
    sampling: DynamicSampling
    """The run's prompt cursor and dynamic-sampling figures (checkpointed with the trainer)."""

    def record_scoring(self, samples: GroupSamples) -> None:
        """Count freshly scored ``samples``' reward calls (once per scored batch)."""
        ...


class LocalGroups:
    """Draw and score this worker's share of each step's prompts, in this process.

    Each draw takes the next positions from the trainer's cursor (:class:`DynamicSampling`), worker ``r`` of
    ``N`` the ``r``-th share, so the first draw of a step is the step's consecutive ``prompts_per_step * N``
    prompts, split as :func:`~distrl.data.groups.step_positions` splits them. With dynamic sampling every
    worker then says how many informative groups it still misses (one ``all_sum`` per draw, on every worker
    alike, so all take the same number of draws), and the next draw gives each exactly that many fresh
    prompts, in worker order: the workers of ``ddp`` draw, keep and train on exactly the prompts one process
    with the global batch does (its missing groups are theirs summed). A worker left with no informative
    group at all trains on its last draw's groups (see :class:`StepFill`); only then does ``ddp`` differ.
    """

    def __init__(self, trainer: GroupLearner):
        self.trainer = trainer
        self.generate_s = self.score_s = 0.0
        self.last_metrics: dict[str, float] = {}

    def next_batch(self, version: int) -> GroupSamples:
        t = self.trainer
        cfg, sync, world = t.cfg, t.sync, t.sync.world_size
        counts = np.full(world, cfg.prompts_per_step, dtype=np.int64)  # prompts each worker draws
        if not cfg.dynamic_sampling:
            scored = self._draw(counts, version)
            assert scored is not None
            return scored
        fill, draws = StepFill(cfg.prompts_per_step), 0
        while True:
            fill.add(self._draw(counts, version))
            draws += 1
            mine = np.zeros(world + 1)
            mine[sync.rank], mine[world] = fill.missing, fill.dropped
            totals = sync.all_sum(mine) if world > 1 else mine
            counts = totals[:world].round().astype(np.int64)
            if not counts.any() or draws == cfg.dynamic_sampling_max_draws:
                break
        self.last_metrics = t.sampling.record(draws, int(round(totals[world])), bool(counts.any()))
        return fill.batch()

    def _draw(self, counts: np.ndarray, version: int) -> GroupSamples | None:
        """This worker's scored share of one draw (None if it has none): ``counts[r]`` prompts for worker ``r``,
        from the cursor on, in worker order."""
        t = self.trainer
        first = t.sampling.cursor + int(counts[: t.sync.rank].sum())
        t.sampling.cursor += int(counts.sum())
        if counts[t.sync.rank] == 0:
            return None
        positions = np.arange(first, first + int(counts[t.sync.rank]), dtype=np.int64)
        start = time.perf_counter()
        samples = draw_groups(t.task, t.policy, positions, t.cfg.group_size, t.run.seed, version)
        drawn = time.perf_counter()
        scored = score_groups(t.task, samples)
        t.record_scoring(scored)
        self.generate_s += drawn - start
        self.score_s += time.perf_counter() - drawn
        return scored

    def timing(self) -> dict[str, float]:
        return {"generate_s": self.generate_s, "score_s": self.score_s}

    def resume(self, version: int) -> None:
        """Nothing to do: the trainer's cursor, restored with the checkpoint, says where the prompts go on."""

    def finish(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        pass
