"""A replay of versioned items for asynchronous learners: what the pipeline's learner samples scored slices
(GRPO) and rollout fragments (PPO) from."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from distrl.config import ConfigError


class VersionedReplay:
    """Scored slices tagged with the policy version that drew them, for an asynchronous learner.

    Oldest-first eviction past ``capacity``. A sample is ``k`` distinct slices, drawn uniformly
    or with probability proportional to version + 1; a slice leaves the buffer after
    ``max_reuse`` samples have included it (1: each slice is trained on once), and slices
    more than ``max_policy_lag`` versions behind the learner are dropped (``on_drop(item, trained)``
    hears of each). Nothing leaves unaccounted: ``added == retired + evicted + dropped_for_lag +
    len(self)``, and of the added slices ``trained`` were in at least one sample.

    A paced learner (``per_step`` in :meth:`sample`) takes first the slices that must be trained now for
    none to pass the lag cap later: each slice's *deadline* is its version + ``max_policy_lag``, the
    last learner step that may train it, and a learner taking ``per_step`` fresh slices a step meets
    every deadline if it takes the earliest-deadline ones whenever the rest would not fit (earliest
    deadline first, optimal for unit jobs). The remaining picks follow ``sampling``, so where nothing
    is due the sample is the unpaced one.
    """

    def __init__(
        self,
        capacity: int,
        max_policy_lag: int,
        sampling: str = "uniform",
        seed: int = 0,
        max_reuse: int = 1,
        on_drop: Callable[[object, bool], None] | None = None,
    ):
        if sampling not in ("uniform", "version"):
            raise ConfigError(f"sampling={sampling!r} is not allowed: must be uniform or version")
        self.capacity = capacity
        self.max_policy_lag = max_policy_lag
        self.sampling = sampling
        self.max_reuse = max_reuse
        self.on_drop = on_drop
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
        if dropped and self.on_drop is not None:
            kept = {id(entry) for entry in keep}
            for entry in self._slices:
                if id(entry) not in kept:
                    self.on_drop(entry[1], entry[2] > 0)
        self._slices = keep
        self.dropped_for_lag += dropped
        return dropped

    def due(self, learner_version: int, in_flight: Sequence[int], per_step: int) -> list[int]:
        """The slices the learner step of ``learner_version`` must take, earliest deadline first, for every
        untrained slice, held or in flight (``in_flight``: each such slice's version), to meet its deadline at
        ``per_step`` fresh slices a step: indices into the held slices, -1 for a slice still in flight.

        With ``N_t`` slices of deadline ``<= t``, the steps after this one train ``(t - learner_version) *
        per_step`` of them by step ``t``, so this step must take ``max_t N_t - (t - learner_version) * per_step``
        of the earliest-deadline slices, the held ones first among equal deadlines.
        """
        lag = self.max_policy_lag
        fresh = [(entry[0] + lag, 0, i) for i, entry in enumerate(self._slices) if entry[2] == 0]
        coming = [(version + lag, 1, -1) for version in in_flight if version + lag >= learner_version]
        order = sorted(fresh + coming)
        needed = max((n + 1 - (end - learner_version) * per_step for n, (end, _, _) in enumerate(order)), default=0)
        return [i for _, _, i in order[: max(needed, 0)]]

    def sample(
        self, k: int, learner_version: int, in_flight: Sequence[int] = (), per_step: int = 0
    ) -> list[tuple[int, object]] | None:
        """``k`` distinct (version, slice) pairs after dropping stale ones; None while fewer than ``k`` are held.

        With ``per_step`` > 0 the learner is paced (see :meth:`due`): the due slices come first (the ``k``
        earliest if more are due, when some deadline can no longer be met), and the sample is None while one
        of those is still in flight.
        """
        self.drop_stale(learner_version)
        if len(self._slices) < k:
            return None
        due = self.due(learner_version, in_flight, per_step)[:k] if per_step > 0 else []
        if -1 in due:
            return None
        chosen = set(due)
        rest = [i for i in range(len(self._slices)) if i not in chosen]
        picks = k - len(due)
        if picks == 0:
            drawn: list[int] = []
        elif self.sampling == "uniform":
            drawn = [rest[j] for j in self.rng.choice(len(rest), size=picks, replace=False)]
        else:  # distinct slices drawn one after another with probability ∝ version + 1 (Gumbel top-k)
            versions = np.fromiter((self._slices[i][0] for i in rest), dtype=np.float64, count=len(rest))
            keys = np.log(versions + 1) - np.log(-np.log(self.rng.random(len(versions))))
            drawn = [rest[j] for j in np.argpartition(-keys, picks - 1)[:picks]]
        taken = [self._slices[i] for i in sorted(due + drawn)]
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
