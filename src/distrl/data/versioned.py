"""A replay of versioned items for asynchronous learners: what the pipeline's learner samples scored slices
(GRPO) and rollout fragments (PPO) from."""

from __future__ import annotations

import numpy as np

from distrl.config import ConfigError


class VersionedReplay:
    """Scored slices tagged with the policy version that drew them, for an asynchronous learner.

    Oldest-first eviction past ``capacity``. A sample is ``k`` distinct slices, drawn uniformly
    or with probability proportional to version + 1; a slice leaves the buffer after
    ``max_reuse`` samples have included it (1: each slice is trained on once), and slices
    more than ``max_policy_lag`` versions behind the learner are dropped. Nothing leaves
    unaccounted: ``added == retired + evicted + dropped_for_lag + len(self)``, and of the
    added slices ``trained`` were in at least one sample.
    """

    def __init__(
        self, capacity: int, max_policy_lag: int, sampling: str = "uniform", seed: int = 0, max_reuse: int = 1
    ):
        if sampling not in ("uniform", "version"):
            raise ConfigError(f"sampling={sampling!r} is not allowed: must be uniform or version")
        self.capacity = capacity
        self.max_policy_lag = max_policy_lag
        self.sampling = sampling
        self.max_reuse = max_reuse
        self.rng = np.random.default_rng(seed)
        self._slices: list[list] = []  # [version, slice, times sampled], oldest first
        self.added = self.trained = self.retired = self.evicted = self.dropped_for_lag = self.uses = 0
        self.max_size = 0

    def __len__(self) -> int:
        return len(self._slices)

    def untrained(self) -> int:
        """Slices held that no sample has included yet."""
        return sum(1 for entry in self._slices if entry[2] == 0)

    def add(self, version: int, item: object) -> None:
        self._slices.append([version, item, 0])
        self.added += 1
        if len(self._slices) > self.capacity:
            self._slices.pop(0)
            self.evicted += 1
        self.max_size = max(self.max_size, len(self._slices))

    def drop_stale(self, learner_version: int) -> int:
        """Drop slices drawn more than ``max_policy_lag`` versions before ``learner_version``; returns how many."""
        keep = [entry for entry in self._slices if learner_version - entry[0] <= self.max_policy_lag]
        dropped = len(self._slices) - len(keep)
        self._slices = keep
        self.dropped_for_lag += dropped
        return dropped

    def sample(self, k: int, learner_version: int) -> list[tuple[int, object]] | None:
        """``k`` distinct (version, slice) pairs after dropping stale ones; None while fewer than ``k`` are held."""
        self.drop_stale(learner_version)
        if len(self._slices) < k:
            return None
        if self.sampling == "uniform":
            chosen = np.sort(self.rng.choice(len(self._slices), size=k, replace=False))
        else:  # k distinct slices drawn one after another with probability ∝ version + 1 (Gumbel top-k)
            versions = np.fromiter((entry[0] for entry in self._slices), dtype=np.float64, count=len(self._slices))
            keys = np.log(versions + 1) - np.log(-np.log(self.rng.random(len(versions))))
            chosen = np.sort(np.argpartition(-keys, k - 1)[:k])
        taken = [self._slices[i] for i in chosen]
        for entry in taken:
            self.trained += entry[2] == 0
            entry[2] += 1
        self.uses += k
        spent = {id(entry) for entry in taken if entry[2] >= self.max_reuse}
        if spent:
            self._slices = [entry for entry in self._slices if id(entry) not in spent]
            self.retired += len(spent)
        return [(entry[0], entry[1]) for entry in taken]

    def counters(self) -> dict[str, int]:
        return {
            "slices_added": self.added,
            "slices_trained": self.trained,
            "slice_uses": self.uses,
            "slices_never_trained": self.added - self.trained,
            "slices_retired": self.retired,
            "slices_evicted": self.evicted,
            "slices_dropped_for_lag": self.dropped_for_lag,
            "slices_left_in_buffer": len(self._slices),
        }
