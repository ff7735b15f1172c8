"""What a trainer asks of whatever collects its experience.

A trainer holds one collector and only calls these methods: the local collectors
(:class:`~distrl.data.rollout.RolloutCollector`, :class:`~distrl.data.episodes.EpisodeCollector`),
actor-learner's remote workers and the pipeline's generators all implement them, so the trainer's
loop does not change with the strategy. Timings and counters come back as data
(:meth:`Collector.iteration_metrics`, :meth:`Collector.summary`), never as attributes to probe.
"""

from __future__ import annotations

from typing import Any, Protocol


class Collector(Protocol):
    """The lifecycle every collector shares; ``collect`` is :class:`~distrl.data.rollout.RolloutSource`'s
    (fixed-length rollouts) or :class:`~distrl.data.episodes.EpisodeSource`'s (whole episodes)."""

    n_workers: int
    """Rollouts of ``rollout_size`` steps that one ``collect`` returns (actor-learner: one per worker)."""

    def reset(self, seed: int, segment: int = 0) -> None:
        """Begin new episodes and restart the sampling streams from ``(seed, env index, segment)``."""
        ...

    def iteration_metrics(self) -> dict[str, float]:
        """Figures of the last ``collect`` for the trainer's log (``time/overhead_s``: transport beyond the
        environments' own time; a pipeline's lag and queue depth)."""
        ...

    def summary(self) -> dict[str, Any]:
        """What the run's summary shows of the collection so far (empty for a local collector)."""
        ...

    def finish(self) -> dict[str, Any]:
        """End collection (a pipeline drains its generators); what summary.json adds."""
        ...

    def close(self) -> None:
        """Release workers and actors (the trainer closes its own environments)."""
        ...


class LocalCollection:
    """The parts of :class:`Collector` that a collector stepping this process's environments has nothing to
    report for; the local collectors inherit them."""

    n_workers = 1

    def iteration_metrics(self) -> dict[str, float]:
        return {"time/overhead_s": 0.0}

    def summary(self) -> dict[str, Any]:
        return {}

    def finish(self) -> dict[str, Any]:
        return {}

    def close(self) -> None:
        return None
