"""What a pipeline did, counted as it runs: GRPO's (:mod:`distrl.strategies.pipeline`) and PPO's
(:mod:`distrl.strategies.pipeline_ppo`), for summary.json and TensorBoard."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distrl.data.versioned import VersionedReplay


@dataclass
class PipelineStats:
    """What the pipeline did, for summary.json and TensorBoard."""

    learner_busy_s: float = 0.0
    generate_s: float = 0.0
    generated: int = 0
    queue_depth: int = 0
    """The latest queue depth. It and the policy lag are kept as running figures, not lists: the
    feeder records a depth every few milliseconds, and a run may last millions of steps."""
    queue_depth_total: int = 0
    queue_depth_count: int = 0
    queue_depth_max: int = 0
    lag_total: float = 0.0
    lag_count: int = 0
    lag_min: float = float("inf")
    lag_max: float = 0.0
    lag_counts: Counter[int] = field(default_factory=Counter)
    """How many trained items had each lag (in versions): the distribution, in as many entries as lags seen."""

    def record_queue(self, depth: int) -> None:
        self.queue_depth = depth
        self.queue_depth_total += depth
        self.queue_depth_count += 1
        self.queue_depth_max = max(self.queue_depth_max, depth)

    def record_lag(self, lag: float) -> None:
        """One trained item's lag: the learner's version minus the version that drew it."""
        self.lag_counts[round(lag)] += 1
        self.lag_total += lag
        self.lag_count += 1
        self.lag_min = min(self.lag_min, lag)
        self.lag_max = max(self.lag_max, lag)

    def lag_quantile(self, q: float) -> float:
        """The ``q`` quantile of the recorded lags (the smallest lag with at least ``q`` of them at or below it)."""
        if not self.lag_counts:
            return 0.0
        lags = sorted(self.lag_counts)
        cumulative = np.cumsum([self.lag_counts[lag] for lag in lags])
        return float(lags[int(np.searchsorted(cumulative, q * cumulative[-1]))])

    def summary(
        self, wall: float, steps: int, generators: int, replay: VersionedReplay, restarts: int, unit: str
    ) -> dict[str, Any]:
        busy = self.learner_busy_s / max(wall, 1e-9)
        counters = {k.replace("slice", unit): v for k, v in replay.counters().items()}
        return {
            "learner_steps": steps,
            "pipeline_wall_s": wall,
            "learner_steps_per_s": steps / max(wall, 1e-9),
            "learner_busy_fraction": busy,
            "learner_idle_fraction": 1 - busy,
            "generator_utilisation": self.generate_s / max(wall * max(generators, 1), 1e-9),
            f"{unit}s_generated": self.generated,
            f"{unit}s_per_s": self.generated / max(wall, 1e-9),
            "queue_depth_mean": self.queue_depth_total / max(self.queue_depth_count, 1),
            "queue_depth_max": self.queue_depth_max,
            "buffer_max": replay.max_size,
            "policy_lag_min": self.lag_min if self.lag_count else 0.0,
            "policy_lag_mean": self.lag_total / max(self.lag_count, 1),
            "policy_lag_p95": self.lag_quantile(0.95),
            "policy_lag_max": self.lag_max,
            "policy_lag_counts": {str(lag): n for lag, n in sorted(self.lag_counts.items())},
            f"{unit}s_dropped_for_lag_fraction": replay.dropped_for_lag / max(replay.added, 1),
            "generator_restarts": restarts,
            **counters,
        }


@dataclass
class LengthTally:
    """Completions counted by length (tokens): how many, their mean, and how many per power-of-two bucket."""

    count: int = 0
    total: int = 0
    buckets: Counter[int] = field(default_factory=Counter)

    def add(self, lengths: np.ndarray) -> None:
        self.count += len(lengths)
        self.total += int(lengths.sum())
        self.buckets.update((2 ** np.ceil(np.log2(np.maximum(lengths, 1)))).astype(int).tolist())

    def mean(self) -> float:
        return self.total / max(self.count, 1)

    def histogram(self) -> dict[str, int]:
        """Completions per bucket, keyed ``"<=N"``: lengths ``N/2 + 1 .. N``."""
        return {f"<={bound}": n for bound, n in sorted(self.buckets.items())}
