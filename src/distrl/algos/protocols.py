"""The seam between algorithms and strategies: how an update agrees with the other workers (``Sync``),
and the no-op agreement of a single process (``LocalSync``)."""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch


class Sync(Protocol):
    """How an update agrees with the other workers; a no-op for a single process.

    Algorithms backpropagate a loss *summed* over their samples and count the samples;
    ``gradients`` sums gradient and counts over workers in place, and the algorithm
    divides by the global count. This is the global-mean gradient even when workers
    hold different numbers of samples, and it happens before gradient clipping.
    """

    rank: int
    world_size: int
    sync_s: float
    """Seconds spent in collectives so far (the run's summary reports it)."""

    def gradients(self, grad: torch.Tensor, stats: torch.Tensor) -> None:
        """Sum a flat gradient and a small vector of summed statistics over workers, in place."""
        ...

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        """Element-wise sum of a small float64 array over workers."""
        ...

    def gather(self, values: np.ndarray, counts: list[int] | None = None) -> list[np.ndarray]:
        """Every worker's float64 array [n_r, ...] (lengths may differ, ``counts`` when known), in rank order."""
        ...

    def broadcast_(self, tensor: torch.Tensor) -> None:
        """Overwrite ``tensor`` with the main worker's (rank 0) values."""
        ...

    def mark_finished(self, tag: int) -> None:
        """Tell the others this worker finished the rollout ``tag`` (straggler preemption)."""
        ...

    def count_finished(self, tag: int) -> int:
        """How many workers have finished the rollout ``tag``."""
        ...


class LocalSync:
    """The ``Sync`` of a single process (``--strategy single``, the Python API): nothing to agree with."""

    rank = 0
    world_size = 1
    sync_s = 0.0

    def gradients(self, grad: torch.Tensor, stats: torch.Tensor) -> None:
        return None

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        return values

    def gather(self, values: np.ndarray, counts: list[int] | None = None) -> list[np.ndarray]:
        return [values]

    def broadcast_(self, tensor: torch.Tensor) -> None:
        return None

    def mark_finished(self, tag: int) -> None:
        return None

    def count_finished(self, tag: int) -> int:
        return 1
