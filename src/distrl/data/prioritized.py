"""Prioritised experience replay (Schaul et al. 2016, arXiv:1511.05952): which rows of a replay buffer to sample.

A :class:`PrioritizedSampler` sits beside a ring buffer of ``capacity`` rows (``ReplayBuffer`` or
``CompactReplayBuffer``) and holds one priority per row in a :class:`SumTree`. Row ``i`` is drawn with probability
``p_i^alpha / sum_k p_k^alpha`` (the proportional variant), where ``p_i = |td_error_i| + eps``; a row just written
gets the largest priority seen so far, so that it is sampled at least once soon. Each draw comes with the
importance weight ``(N P(i))^-beta``, divided by the batch's largest, that corrects the bias of sampling by
priority (``beta`` annealed towards 1 by the caller). A batch is drawn stratified: the total is cut into ``batch`` equal
segments and one prefix sum is drawn uniformly in each, as the paper's Appendix B.2.1 does.
:class:`PrioritizedReplay` puts a buffer and its sampler together behind the buffers' own ``add``/``sample``.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.config import ConfigError, require
from distrl.data.replay import RingBuffer, Transitions


class SumTree:
    """Non-negative values over ``capacity`` leaves, with their total and prefix-sum search in O(log capacity).

    A complete binary tree in one array: node ``k``'s children are ``2k`` and ``2k + 1``, the root is node 1, and
    the leaves start at ``size`` (the smallest power of two >= capacity). Updates and searches are vectorised over
    a batch of leaves: one numpy operation per level of the tree.
    """

    def __init__(self, capacity: int):
        require(capacity > 0, "capacity", capacity, "> 0")
        self.capacity = capacity
        self.size = 1 << max(0, (capacity - 1).bit_length())
        self.nodes = np.zeros(2 * self.size, dtype=np.float64)

    @property
    def total(self) -> float:
        return float(self.nodes[1])

    def values(self, leaves: np.ndarray) -> np.ndarray:
        return self.nodes[self.size + np.asarray(leaves, dtype=np.int64)]

    def update(self, leaves: np.ndarray, values: np.ndarray) -> None:
        """Set ``values`` at ``leaves`` (the last one wins where a leaf repeats) and every sum above them."""
        leaves = np.asarray(leaves, dtype=np.int64)
        values = np.broadcast_to(np.asarray(values, dtype=np.float64), leaves.shape)
        if np.any(values < 0) or not np.all(np.isfinite(values)):
            raise ValueError("SumTree values must be finite and >= 0")
        if leaves.size == 0:  # an add of reset steps alone writes no row
            return
        nodes = self.size + leaves
        self.nodes[nodes] = values
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:  # one level at a time, each parent from its two children
            self.nodes[nodes] = self.nodes[2 * nodes] + self.nodes[2 * nodes + 1]
            if nodes[0] == 1:
                break
            nodes = np.unique(nodes // 2)

    def find(self, prefix: np.ndarray) -> np.ndarray:
        """The leaf of each prefix sum: the first leaf whose cumulative value exceeds it, for ``0 <= prefix <
        total``; leaves of value 0 are never returned."""
        prefix = np.array(prefix, dtype=np.float64, copy=True)
        nodes = np.ones(prefix.shape, dtype=np.int64)
        for _ in range(self.size.bit_length() - 1):  # from the root down to the leaves, a level at a time
            left = 2 * nodes
            go_right = prefix >= self.nodes[left]
            prefix -= np.where(go_right, self.nodes[left], 0.0)
            nodes = left + go_right
        leaves = nodes - self.size
        # Rounding can carry a prefix just past the last leaf of positive value: step back to a positive one.
        stray = (leaves >= self.capacity) | (self.nodes[nodes] <= 0)
        if stray.any():
            positive = np.flatnonzero(self.nodes[self.size : self.size + self.capacity] > 0)
            leaves[stray] = positive[np.clip(np.searchsorted(positive, leaves[stray]) - 1, 0, len(positive) - 1)]
        return leaves


class PrioritizedSampler:
    """Which rows of a ring buffer of ``capacity`` rows to draw, by priority; see the module docstring.

    Args:
        capacity: the buffer's rows.
        alpha: how much the priorities count (0: uniform sampling; the paper's proportional variant: 0.6).
        eps: added to every ``|td_error|`` so that no row's probability becomes 0.
    """

    def __init__(self, capacity: int, alpha: float = 0.6, eps: float = 1e-6):
        require(alpha >= 0, "alpha", alpha, ">= 0")
        require(eps > 0, "eps", eps, "> 0")
        self.tree = SumTree(capacity)
        self.alpha, self.eps = alpha, eps
        self.max_priority = 1.0
        """The largest priority given so far (before ``alpha``): a new row's."""

    def added(self, rows: np.ndarray) -> None:
        """Rows the buffer has just written: each takes the largest priority so far."""
        self.tree.update(rows, self.max_priority**self.alpha)

    def removed(self, rows: np.ndarray) -> None:
        """Rows that no longer begin a transition (a compact buffer's observation-only rows): never drawn."""
        self.tree.update(rows, 0.0)

    def sample(self, batch: int, rng: np.random.Generator, beta: float) -> tuple[np.ndarray, np.ndarray]:
        """``batch`` rows (stratified by priority) and their importance weights [batch] float32, divided by the
        batch's largest so that they only scale updates down.

        The batch's largest weight, not the buffer's: finding the smallest probability among a million rows
        at every step would cost more than the step (the paper's ``max_i w_i`` can be read either way;
        Dopamine's prioritised replay reads it so too)."""
        total = self.tree.total
        require(total > 0, "priorities", total, "> 0 in total: sample after the buffer holds a row")
        bounds = np.arange(batch, dtype=np.float64) * (total / batch)
        prefix = np.minimum(bounds + rng.random(batch) * (total / batch), np.nextafter(total, 0.0))
        rows = self.tree.find(prefix)
        weights = (self.tree.values(rows) / total) ** -beta  # (N P(i))^-beta: N cancels in the ratio below
        return rows, (weights / weights.max()).astype(np.float32)

    def update(self, rows: np.ndarray, td_errors: np.ndarray) -> None:
        """New priorities ``|td_error| + eps`` of sampled rows (after the learner's step on them)."""
        priorities = np.abs(np.asarray(td_errors, dtype=np.float64)) + self.eps
        self.max_priority = max(self.max_priority, float(priorities.max(initial=0.0)))
        self.tree.update(rows, priorities**self.alpha)

    def state(self) -> dict[str, np.ndarray]:
        """The priorities of every row and the largest so far, as arrays (saved with the buffer, no pickle)."""
        leaves = self.tree.nodes[self.tree.size : self.tree.size + self.tree.capacity].copy()
        return {"priorities": leaves, "max_priority": np.array([self.max_priority])}

    def load(self, state: dict[str, np.ndarray]) -> None:
        leaves = np.asarray(state["priorities"], dtype=np.float64)
        if leaves.shape != (self.tree.capacity,):
            raise ValueError(f"priorities of shape {leaves.shape} for a buffer of {self.tree.capacity} rows")
        self.tree.nodes[:] = 0.0
        self.tree.update(np.arange(self.tree.capacity), leaves)
        self.max_priority = float(np.asarray(state["max_priority"]).reshape(-1)[0])


class PrioritizedReplay:
    """A replay buffer (:class:`~distrl.data.replay.ReplayBuffer` or :class:`~distrl.data.replay.CompactReplayBuffer`)
    sampled by priority; see the module docstring.

    Called as the buffers are (``add``, ``sample``, ``save``, ``load``, ``size``), so that a trainer takes either;
    its batches carry ``weights`` and ``rows``, and the learner hands the rows' new TD errors back to
    :meth:`update_priorities`.

    Args:
        buffer: the buffer, empty; its rows are the sampler's.
        alpha: how much the priorities count (0: uniform).
        eps: added to every ``|td_error|`` so that no transition's probability becomes 0.
    """

    def __init__(self, buffer: RingBuffer, alpha: float = 0.6, eps: float = 1e-6):
        self.buffer = buffer
        self.sampler = PrioritizedSampler(buffer.capacity, alpha, eps)

    @property
    def size(self) -> int:
        return self.buffer.size

    @property
    def capacity(self) -> int:
        return self.buffer.capacity

    def add(self, *args: Any, priorities: np.ndarray | None = None, **kwargs: Any) -> np.ndarray:
        """The buffer's ``add``; of the rows it wrote, those that begin a transition take the largest priority so
        far (or, with ``priorities``, one |TD error| per transition added, in order: an actor's initial
        priorities, Ape-X) and those that hold only an observation priority 0. Returns the rows."""
        rows = self.buffer.add(*args, **kwargs)
        live = self.buffer.live(rows)
        self.sampler.added(rows[live])
        self.sampler.removed(rows[~live])
        if priorities is not None and len(priorities):
            self.sampler.update(rows[: len(priorities)], priorities)  # a buffer returns transition rows first
        return rows

    def sample(
        self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu", beta: float = 1.0
    ) -> Transitions:
        """``batch_size`` transitions drawn by priority, with their ``rows`` and importance ``weights`` [B] float32
        on ``device`` (``beta``: how fully the weights correct the bias, annealed towards 1 by the caller)."""
        rows, weights = self.sampler.sample(batch_size, rng, beta)
        batch = self.buffer.take(rows, device)
        return dataclasses.replace(batch, weights=torch.from_numpy(weights).to(device))

    def update_priorities(self, rows: np.ndarray, td_errors: np.ndarray | torch.Tensor) -> None:
        """New priorities ``|td_error| + eps`` for sampled ``rows`` [B] from the learner's TD errors [B].

        A row that has since come to hold only an observation keeps priority 0: it must never be drawn. One
        rewritten with a newer transition since it was drawn (actors add while a learner learns) takes the old
        one's error until it is drawn again: telling rewritten rows apart would take a version per row."""
        if isinstance(td_errors, torch.Tensor):
            td_errors = td_errors.detach().cpu().numpy()
        rows, td_errors = np.asarray(rows), np.asarray(td_errors)
        live = self.buffer.live(rows)
        self.sampler.update(rows[live], td_errors[live])

    def save(self, path: Path) -> None:
        """The buffer's file, with every row's priority in it."""
        self.buffer.save(path, extra=self.sampler.state())

    def load(self, path: Path) -> None:
        """Restore a buffer saved by :meth:`save` with its priorities; a plain buffer's file is refused."""
        state = self.buffer.load(path)
        if "priorities" not in state:
            raise ConfigError(
                f"replay buffer {str(path)!r} was saved without prioritized replay: resume with the same setting"
            )
        if len(state["priorities"]) != self.capacity:
            raise ConfigError(
                f"replay buffer {str(path)!r} holds priorities for {len(state['priorities']):,} rows; this run's "
                f"buffer_size is {self.capacity:,}: resume with the same buffer_size"
            )
        self.sampler.load(state)
