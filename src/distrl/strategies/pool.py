"""Keeping a set of generator actors busy: requests, failures and restarts.

:class:`GeneratorPool` sends requests to N actors on any :class:`~distrl.strategies.actors.ActorEngine`
and replaces an actor that dies or raises; the pipeline's sources (GRPO's groups, PPO's fragments)
top it up from the learner's loop between steps.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from distrl.config import StrategyConfig
from distrl.strategies.actors import (
    ActorDied,
    ActorEngine,
    ActorRaised,
    failure_note,
    replace_actor,
    resolve_placements,
    spend_restart,
)


class PipelineStalled(RuntimeError):
    """A stage produced nothing for ``starve_timeout_s``; the message names it."""


class GeneratorFailed(RuntimeError):
    """A generator raised (or died) more often than allowed, or raised with ``on_worker_error=abort``."""


class GeneratorPool:
    """N generator actors, each with at most ``depth`` requests in flight; a failed one is replaced.

    ``spawn(i, restarts)`` starts actor ``i`` on the engine; ``request(actor, version, weights)``
    sends it one request and returns the pending result. The pool remembers which policy version
    each actor holds, so weights travel only to an actor whose copy is out of date. A second
    request queued behind the first (``depth=2``) hides the round trip: the actor starts it the
    moment it finishes the first.
    """

    def __init__(
        self,
        engine: ActorEngine,
        n: int,
        spawn: Callable[[int, int], Any],
        request: Callable[..., Any],
        strategy: StrategyConfig,
        report: Callable[[str], None],
        depth: int = 1,
    ):
        self.engine, self.spawn, self.request, self.strategy, self.report = engine, spawn, request, strategy, report
        self.actors = [spawn(i, 0) for i in range(n)]
        self.places = [[engine.call(actor, "where")] for actor in self.actors]
        """Per generator, a pending ``where`` for each actor it has had (see :meth:`placement`)."""
        self.depth = depth
        self.restarts = [0] * n
        self.held = [-1] * n  # the policy version each actor holds (or will, once its queue runs)
        self.busy = [0] * n  # requests in flight per actor
        self.in_flight: dict[Any, int] = {}  # pending request -> actor index
        self.version_of: dict[Any, int] = {}  # pending request -> the policy version it was sent with
        self.waits = 0
        self.longest_wait = 0.0
        """The longest the learner has waited for a result that came, its first wait (actors starting) aside: on a
        machine that slows down (other work on its cores) a generator takes longer without having stalled, and
        the learner waits ten times this before it gives up."""

    def submit(self, version: int, weights: Callable[[], Any], limit: int | None = None) -> None:
        """Top up every actor to ``depth`` requests (at most ``limit`` new ones in all), least busy first."""
        budget = len(self.actors) * self.depth if limit is None else limit
        for _ in range(self.depth):
            for i in sorted(range(len(self.actors)), key=lambda j: self.busy[j]):
                if budget <= 0 or self.busy[i] >= self.depth:
                    continue
                stale = self.held[i] != version
                pending = self.request(self.actors[i], version, weights() if stale else None)
                self.in_flight[pending] = i
                self.version_of[pending] = version
                self.held[i] = version
                self.busy[i] += 1
                budget -= 1

    def finished(self, timeout: float = 0) -> list[tuple[int, Any]]:
        """Results of the requests that are done (waiting up to ``timeout`` for the first); failures replaced."""
        if not self.in_flight:
            return []
        done = self.engine.wait(list(self.in_flight), 0)
        if not done and timeout > 0:
            done = self.engine.wait(list(self.in_flight), timeout, first=True)
        out = []
        for pending in done:
            i = self.in_flight.pop(pending, None)
            self.version_of.pop(pending, None)
            if i is None:  # a request of an actor replaced earlier in this loop
                continue
            self.busy[i] -= 1
            result = self._get(pending, i)
            if result is not None:
                out.append((i, result))
        return out

    def ready(self, others: dict[str, Any] | None = None, check: bool = True) -> float:
        """Wait up to ``timeout_s`` until every actor (and ``others``, actors by name) has started or failed to;
        returns the seconds it took. A start past it fails naming the actors that had not started. With ``check``
        an actor that failed to start ends the run here, named (:class:`GeneratorFailed`); without, its failure
        comes with its first call (where a generator's is restarted, as any failure of its requests)."""
        others = others or {}
        start = time.perf_counter()
        pending = [row[-1] for row in self.places] + [self.engine.call(a, "where") for a in others.values()]
        done = self.engine.wait(pending, self.strategy.timeout_s)
        names = [f"generator {i}" for i in range(len(self.actors))] + list(others)
        if len(done) < len(pending):
            late = [name for name, p in zip(names, pending) if p not in done]
            raise PipelineStalled(f"{', '.join(late)} did not start within {self.strategy.timeout_s:.0f} s")
        if check:
            for name, p in zip(names, pending):
                try:
                    self.engine.result(p, self.strategy.timeout_s)
                except (ActorDied, ActorRaised) as exc:
                    said = str(exc).strip().splitlines() or [type(exc).__name__]
                    raise GeneratorFailed(f"{name} failed to start: {said[0]}") from None
        return time.perf_counter() - start

    def drain(self) -> list[tuple[int, Any]]:
        """Wait for every request under way (up to ``timeout_s``) and return their results."""
        out = []
        while self.in_flight:
            if not self.engine.wait(list(self.in_flight), self.strategy.timeout_s, first=True):
                late = sorted(set(self.in_flight.values()))
                raise PipelineStalled(f"generator(s) {late} did not finish within {self.strategy.timeout_s:.0f} s")
            out += self.finished()
        return out

    def _get(self, pending: Any, i: int) -> Any:
        try:
            return self.engine.result(pending, self.strategy.timeout_s)
        except ActorDied as exc:
            reason = f"died ({exc})"
        except ActorRaised as exc:
            reason = f"raised {exc}"
            if self.strategy.on_worker_error == "abort":
                raise GeneratorFailed(f"generator {i} {reason}") from None
        reason = f"{reason.splitlines()[0]}{failure_note(self.engine, self.places, i)}"
        spend_restart(self.restarts, i, self.strategy.max_worker_restarts, "generator", reason, GeneratorFailed)
        self.report(f"generator {i} {reason}; restarted ({self.restarts[i]}/{self.strategy.max_worker_restarts})")
        replace_actor(self.engine, self.actors, self.places, i, self.spawn, self.restarts)
        self.held[i] = -1
        for p in [p for p, j in self.in_flight.items() if j == i]:  # lost with the old actor, never counted
            del self.in_flight[p]
            self.version_of.pop(p, None)
        self.busy[i] = 0
        return None

    def wait_any(self, stage: str, learner_version: int, buffered: int) -> None:
        """Block until some request finishes; fail naming ``stage`` after ``starve_timeout_s``, or ten times the
        longest wait for a result so far (the first aside) if that is longer."""
        if not self.in_flight:
            raise PipelineStalled(f"the learner has no data and no generation is under way ({stage})")
        timeout = max(self.strategy.starve_timeout_s, 10 * self.longest_wait)
        start = time.perf_counter()
        if not self.engine.wait(list(self.in_flight), timeout, first=True):
            raise PipelineStalled(
                f"the learner received no data for {timeout:.0f} s: the {stage} did not answer "
                f"(learner version {learner_version}, buffer {buffered}, "
                f"{len(self.in_flight)} generations in flight)"
            )
        self.waits += 1
        if self.waits > 1:  # the first wait is the actors' start
            self.longest_wait = max(self.longest_wait, time.perf_counter() - start)

    def in_flight_versions(self) -> list[int]:
        """The policy version of each request under way."""
        return [self.version_of[p] for p in self.in_flight]

    def restarted(self) -> int:
        return sum(self.restarts)

    def placement(self) -> list[list[dict[str, Any]]]:
        """Where each generator ran: host, pid and Ray node of every actor it has had, the replaced ones first."""
        return resolve_placements(self.engine, self.places)

    def close(self) -> None:
        for actor in self.actors:
            self.engine.kill(actor)
