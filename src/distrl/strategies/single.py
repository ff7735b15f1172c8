"""``single``: one process collects with vectorised environments and updates."""

from __future__ import annotations

import numpy as np
import torch


class LocalSync:
    """The ``Sync`` of a single process: nothing to agree with."""

    rank = 0
    world_size = 1

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
