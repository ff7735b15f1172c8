"""The learner of an off-policy run whose actors collect elsewhere (``--strategy actor-learner`` for dqn and sac):
Ape-X's learner (Horgan et al. 2018, arXiv:1803.00933).

Actors step their own environments, each with its own exploration, and push transitions into a replay that one
process holds; this loop reads what they reported, samples that replay, takes the algorithm's gradient steps,
sends the new priorities back and publishes its weights, which the actors pick up between pushes. The trainer is
the one a single process runs (its algorithm, logs, evaluation and checkpoints); a :class:`ReplaySource` is the
transport the strategy provides.

Pacing: with ``replay_ratio`` 0 the learner never waits once learning has started (each iteration takes the
trainer's ``gradient_steps`` and looks at what has arrived without waiting) and the actors never wait for it.
With a ratio, the learner takes the gradient steps that keep ``samples drawn / transitions inserted`` at it:
it waits for data when ahead, and holds back the actors' next requests when behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from distrl.data.replay import Transitions


@dataclass
class Arrivals:
    """What the actors reported since the last look: env steps pushed into the replay, finished episodes."""

    steps: int = 0
    returns: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)


class ReplaySource(Protocol):
    """The strategy's side of the loop: actors, the replay's holder, and the weights they receive."""

    inserted: int
    """Transitions the replay has received so far (over every actor)."""
    replay: Any
    """The shared replay as the trainer's checkpoint hooks see it: ``size``, ``save(path)``, ``load(path)``."""

    def arrivals(self, wait: bool, hold: bool) -> Arrivals:
        """The actors' reports that have come in; with ``wait``, block until one does. Idle actors get a new
        request (with the newest published weights) unless ``hold``."""
        ...

    def batches(self, n: int, batch_size: int, beta: float) -> list[Transitions]:
        """``n`` sampled batches, on the learner's device (``beta``: prioritised replay's importance exponent)."""
        ...

    def update_priorities(self, rows: list[np.ndarray], errors: list[np.ndarray]) -> None:
        """New TD errors of the rows of the batches trained on (without waiting for the replay)."""
        ...

    def publish(self, version: int) -> None:
        """The learner's weights changed: actors get ``version`` with their next request."""
        ...

    def iteration_metrics(self) -> dict[str, float]: ...


class ReplayLearner(Protocol):
    """What the loop asks of a trainer (DQN's and SAC's implement it)."""

    cfg: Any
    steps: int
    policy_version: int

    def learner_step(self, batch: Transitions, progress: float) -> tuple[dict[str, float], np.ndarray | None]:
        """One gradient step on a sampled batch: the metrics and, for prioritised replay, the batch's TD errors."""
        ...

    def beta(self, progress: float) -> float: ...

    def after_steps(self, new_steps: int) -> None:
        """``new_steps`` env steps have reached the replay (DQN's target network counts them)."""
        ...


def updates_due(inserted: int, learning_starts: int, ratio: float, batch_size: int, done: int) -> int:
    """Gradient steps that bring ``samples / transitions inserted since learning started`` up to ``ratio``."""
    return max(0, int((inserted - learning_starts) * ratio // batch_size) - done)


def learn_from_actors(trainer: Any, source: ReplaySource, total: int, limit: int) -> dict[str, Any]:
    """Train ``trainer`` on what ``source``'s actors collect until ``limit`` env steps (of ``total``) have arrived."""
    cfg = trainer.cfg
    ratio = trainer.strategy.replay_ratio
    starts = max(cfg.learning_starts, cfg.batch_size)
    per_iteration = cfg.gradient_steps_per_phase()
    done = 0  # gradient steps since learning started, for the ratio
    while trainer.steps < limit:
        start = time.perf_counter()
        learning = source.inserted >= starts
        due = updates_due(source.inserted, starts, ratio, cfg.batch_size, done) if ratio > 0 else per_iteration
        behind = ratio > 0 and due > 4 * per_iteration  # hold the actors back until the learner catches up
        arrived = source.arrivals(wait=not learning or due == 0, hold=behind)
        trainer.steps += arrived.steps
        trainer.after_steps(arrived.steps)
        episodes, votes = trainer.count_episodes(len(arrived.returns))
        update_start = time.perf_counter()
        metrics: dict[str, float] = {}
        n = min(due, 4 * per_iteration) if learning else 0
        if n > 0:
            progress = trainer.steps / max(total, 1)
            rows, errors = [], []
            for batch in source.batches(n, cfg.batch_size, trainer.beta(progress)):
                metrics, batch_errors = trainer.learner_step(batch, progress)
                if batch_errors is not None and batch.rows is not None:
                    rows.append(batch.rows)
                    errors.append(batch_errors)
            if rows:
                source.update_priorities(rows, errors)
            done += n
        trainer._end_iteration(start, update_start, updated=n > 0)
        if n > 0:
            source.publish(trainer.policy_version)
        metrics.update(source.iteration_metrics())
        trainer._log(arrived.returns, arrived.lengths, episodes, metrics)
        if trainer.end_of_iteration(arrived.steps, votes, trainer.steps < total):
            break
    return trainer.summary()
