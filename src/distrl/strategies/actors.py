"""What the pipeline needs from an actor engine, and Ray's adapter for it.

The pipeline's actors (generators, scorer, rollout workers) are plain classes; an engine hosts
each in its own process and calls its methods. Everything the pipeline does with actors goes
through these few operations, so Ray (the default) and Monarch (``--engine monarch``,
:mod:`distrl.strategies.monarch_engine`) run the same actors and the same pipeline.
"""

from __future__ import annotations

import os
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import numpy as np


def placement() -> dict[str, Any]:
    """Where the calling process runs: its host and pid, and inside a Ray worker its Ray node's id."""
    where: dict[str, Any] = {"host": socket.gethostname(), "pid": os.getpid()}
    try:
        import ray
    except ImportError:
        return where
    if ray.is_initialized():
        where["node"] = ray.get_runtime_context().get_node_id()
    return where


def where_note(where: dict[str, Any] | None) -> str:
    """How an event line says where a failed actor ran: `` on node 1a2b3c4d (lost)`` on a Ray cluster
    (``lost`` once the cluster has marked the node dead), `` (pid N)`` elsewhere, nothing if unknown."""
    if not where or "lost" in where:
        return ""
    if "node" not in where:
        return f" (pid {where['pid']})"
    import ray

    nodes = node_table(ray)
    if nodes is None:  # the note is a courtesy: never fail the run over it
        return f" on node {where['node'][:8]}"
    alive = next((n["Alive"] for n in nodes if n["NodeID"] == where["node"]), False)
    return f" on node {where['node'][:8]}" + ("" if alive else " (lost)")


class RayNodeDown(RuntimeError):
    """The Ray node this process runs on went down: its raylet died (killed, or it exited because an agent it
    shares its fate with died), or Ray stopped hearing from it (a starved machine misses its heartbeats). Every
    actor on it is gone and no new one can start there, so the run stops; the message names the node and why."""


NODE_DEATH_REASONS = {1: "expected termination", 2: "unexpected termination", 3: "preempted", 4: "drained while idle"}
"""Ray's ``NodeDeathInfo.Reason`` codes (``DeathReason`` in :func:`ray.nodes`) as messages say them."""

CHECK_NODE_EVERY_S = 1.0
"""How often a wait on actors checks that this process's raylet still answers. It must not wait for Ray's own
verdict: Ray marks a node whose raylet was killed dead after 5 missed health checks 3 s apart (16 s, measured),
and a driver that holds objects in the node's object store is then ended by Ray itself within 0.1 s."""


def node_table(ray: Any, timeout_s: float = 5.0) -> list[dict[str, Any]] | None:
    """``ray.nodes()``, or None when the cluster's control store does not answer within ``timeout_s`` (a
    ``ray.nodes()`` on a control store that has gone blocks for a minute)."""
    answer: list[list[dict[str, Any]]] = []

    def ask() -> None:
        try:
            answer.append(ray.nodes())
        except Exception:  # noqa: BLE001, S110 - no answer is the answer
            pass

    thread = threading.Thread(target=ask, name="distrl-ray-nodes", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return answer[0] if answer else None


def node_down_line(node: dict[str, Any]) -> str:
    """The one line for this process's node as its entry in Ray's node table (one of :func:`ray.nodes`) stands
    when its raylet stopped answering: Ray's reason once it has marked the node dead."""
    raylet = f"{node.get('NodeManagerAddress', '?')}:{node.get('NodeManagerPort', '?')}"
    if node.get("Alive", True):
        why = f"its raylet at {raylet} refuses connections (killed or crashed; Ray has not marked the node dead yet)"
    else:
        code = NODE_DEATH_REASONS.get(node.get("DeathReason", 0))
        why = f"{node.get('DeathReasonMessage') or 'Ray gave no reason'}{f' ({code})' if code else ''}"
    return (
        f"the Ray node {node['NodeID'][:8]} ({node.get('NodeManagerAddress', '?')}) this process runs on went down: "
        f"{why}; every actor on it is gone: Ray's logs are in the run directory's ray-logs/, and "
        "distrl train --resume RUN continues from the last checkpoint"
    )


def raylet_answers(address: str, port: int, timeout_s: float = 1.0) -> bool:
    """Whether a raylet listens at ``address:port`` (a busy one still accepts: the kernel completes the handshake)."""
    try:
        socket.create_connection((address, port), timeout=timeout_s).close()
    except OSError:
        return False
    return True


class OwnNode:
    """This process's Ray node as the engine checks it while it waits on actors: one local connection to its
    raylet each time, and Ray's node table only when that fails or an actor is lost."""

    def __init__(self, ray: Any):
        self.ray = ray
        self.node_id: str = ray.get_runtime_context().get_node_id()
        self.raylet: tuple[str, int] | None = None  # its address and port, read from the node table once

    def entry(self) -> dict[str, Any] | None:
        return next((n for n in node_table(self.ray) or [] if n["NodeID"] == self.node_id), None)

    def check(self, ask_ray: bool = False) -> None:
        """Raise :class:`RayNodeDown` when the node's raylet refuses connections or (``ask_ray``) Ray has marked
        the node dead; a node table that does not answer proves nothing."""
        entry = self.entry() if ask_ray or self.raylet is None else None
        if entry is not None:
            self.raylet = (entry["NodeManagerAddress"], int(entry["NodeManagerPort"]))
            if not entry["Alive"]:
                raise RayNodeDown(node_down_line(entry))
        if self.raylet is None or raylet_answers(*self.raylet):
            return
        entry = self.entry() or {"NodeID": self.node_id, "NodeManagerAddress": self.raylet[0]}
        raise RayNodeDown(node_down_line({**entry, "NodeManagerPort": self.raylet[1]}))


def resolve_placements(engine: Any, pending: list[list[Any]], timeout_s: float = 2.0) -> list[list[dict[str, Any]]]:
    """The answers to ``where`` calls, one list per actor slot (an entry for each actor it has had, the
    replaced ones first); an actor lost before it answered is ``{"lost": reason}``."""
    out = []
    for calls in pending:
        row = []
        for call in calls:
            try:
                row.append(engine.result(call, timeout_s))
            except Exception as exc:  # noqa: BLE001 - dead, or never started: say so, it is a record
                detail = str(exc).strip().splitlines()[:1]
                row.append({"lost": ": ".join([type(exc).__name__, *detail])})
        out.append(row)
    return out


class ActorDied(RuntimeError):
    """The actor's process is gone (killed, crashed); its pending calls never finish."""


class ActorRaised(RuntimeError):
    """The actor's method raised; the message carries the remote error, ``kind`` its type's name."""

    def __init__(self, message: str, kind: str = ""):
        super().__init__(message)
        self.kind = kind


class ActorEngine(Protocol):
    name: str

    def spawn(self, cls: type, *args: Any, cpus: float = 0.0, gpus: float = 0.0) -> Any:
        """Start ``cls(*args)`` in a process of its own; returns a handle."""
        ...

    def call(self, actor: Any, method: str, *args: Any) -> Any:
        """Call ``actor.method(*args)`` without waiting; returns a pending result."""
        ...

    def wait(self, pending: list[Any], timeout: float, first: bool = False) -> list[Any]:
        """Those of ``pending`` that are done: after up to ``timeout`` seconds for all (or, with ``first``, for one)."""
        ...

    def result(self, pending: Any, timeout: float) -> Any:
        """The value of a pending result; raises :class:`ActorDied` or :class:`ActorRaised`."""
        ...

    def client(self, actor: Any, timeout: float) -> Any:
        """A picklable stand-in for ``actor`` that another actor calls synchronously: ``client.method(*args)``."""
        ...

    def weights(self, version: int, flat: np.ndarray) -> Any:
        """``flat`` (the policy's parameters, float32) in the form this engine sends best; see :func:`as_array`."""
        ...

    def shared(self, payload: Any) -> Any:
        """``payload`` as an argument that many calls take without each carrying a copy (Ray's object store)."""
        ...

    def kill(self, actor: Any) -> None: ...


def as_array(weights: Any) -> np.ndarray:
    """Flat weights as they arrive at an actor: a numpy array, or a handle that fetches one."""
    return weights if isinstance(weights, np.ndarray) else weights.fetch()


def spend_restart(restarts: list[int], i: int, limit: int, who: str, last: str, error: type[Exception]) -> None:
    """Count a restart of actor ``i``; raise ``error`` once it has failed more than ``limit`` times."""
    restarts[i] += 1
    if restarts[i] > limit:
        raise error(f"{who} {i} failed {restarts[i]} times (max_worker_restarts={limit}); last: {last}")


def replace_actor(
    engine: ActorEngine,
    actors: list[Any],
    places: list[list[Any]],
    i: int,
    spawn: Callable[[int, int], Any],
    restarts: list[int],
) -> None:
    """The one restart policy of every actor pool (rollout workers, generators): kill actor ``i``, start its
    replacement with ``spawn(i, restarts[i])`` (which seeds it by its restart count), and ask where it runs."""
    engine.kill(actors[i])
    actors[i] = spawn(i, restarts[i])
    places[i].append(engine.call(actors[i], "where"))


def ask_each(engine: ActorEngine, actors: list[Any], method: str, timeout_s: float) -> list[Any]:
    """Call ``method`` on every actor at once and return the answers in actor order, waiting up to ``timeout_s``
    for them all; an actor that died, raised or did not answer gives ``{"lost": reason}``. For the records
    summary.json keeps: the end of a run never fails over one of them."""
    pending = [engine.call(actor, method) for actor in actors]
    engine.wait(pending, timeout_s)
    answers = []
    for call in pending:
        try:
            answers.append(engine.result(call, 0.5))
        except Exception as exc:  # noqa: BLE001 - dead, failed or late: say so, it is a record
            detail = str(exc).strip().splitlines()[:1]
            answers.append({"lost": ": ".join([type(exc).__name__, *detail])})
    return answers


def failure_note(engine: ActorEngine, places: list[list[Any]], i: int) -> str:
    """Where actor ``i`` ran, for the line that reports its failure (see :func:`where_note`)."""
    return where_note(resolve_placements(engine, [places[i][-1:]], 0.5)[0][0])


class SyncClient:
    """A picklable stand-in for an actor, for another actor to call synchronously: ``client.method(*args)``."""

    def __init__(self, handle: Any, timeout: float):
        self.handle, self.timeout = handle, timeout

    def __getattr__(self, method: str) -> Any:
        if method.startswith("__"):  # pickling looks these up before the instance has its fields
            raise AttributeError(method)
        return lambda *args: self._call(method, args)

    def _call(self, method: str, args: tuple) -> Any:
        raise NotImplementedError


class RayClient(SyncClient):
    def _call(self, method: str, args: tuple) -> Any:
        import ray

        return ray.get(getattr(self.handle, method).remote(*args), timeout=self.timeout)


class RayActors:
    """The actor engine on Ray: actors are Ray actors, pending results are object references."""

    name = "ray"

    def __init__(self, ray: Any):
        self.ray = ray
        self.node = OwnNode(ray)
        self._classes: dict[type, Any] = {}

    def spawn(self, cls: type, *args: Any, cpus: float = 0.0, gpus: float = 0.0) -> Any:
        remote_cls = self._classes.setdefault(cls, self.ray.remote(cls))
        return remote_cls.options(num_cpus=cpus, num_gpus=gpus).remote(*args)

    def call(self, actor: Any, method: str, *args: Any) -> Any:
        return getattr(actor, method).remote(*args)

    def wait(self, pending: list[Any], timeout: float, first: bool = False) -> list[Any]:
        """As :meth:`ActorEngine.wait`, checking every :data:`CHECK_NODE_EVERY_S` that this process's node is up."""
        if not pending:
            return []
        wanted = 1 if first else len(pending)
        deadline = time.monotonic() + timeout
        while True:
            left = max(0.0, deadline - time.monotonic())
            try:
                done, _ = self.ray.wait(pending, num_returns=wanted, timeout=min(left, CHECK_NODE_EVERY_S))
            except OSError:  # the raylet's socket closed under the call ("Broken pipe")
                self.node.check(ask_ray=True)
                raise
            if len(done) >= wanted or left <= CHECK_NODE_EVERY_S:
                return done
            self.node.check()

    def result(self, pending: Any, timeout: float) -> Any:
        """As :meth:`ActorEngine.result`; an actor lost with this process's node is :class:`RayNodeDown`, not
        :class:`ActorDied`: no replacement could start."""
        from ray.exceptions import (
            LocalRayletDiedError,
            NodeDiedError,
            ObjectLostError,
            RayActorError,
            RaySystemError,
            RayTaskError,
        )

        try:
            return self.ray.get(pending, timeout=timeout)
        except RayActorError as exc:
            self.node.check(ask_ray=True)
            if getattr(exc, "actor_init_failed", False):  # its __init__ raised: the traceback's last line says what
                raised = [line.strip() for line in str(getattr(exc, "error_msg", "")).splitlines() if line.strip()]
                raise ActorDied(f"{type(exc).__name__}, its start raised {raised[-1] if raised else '?'}") from None
            raise ActorDied(type(exc).__name__) from None
        except RayTaskError as exc:
            cause = exc.cause
            raise ActorRaised(str(cause) if cause is not None else str(exc), type(cause).__name__) from None
        except (OSError, LocalRayletDiedError, NodeDiedError, ObjectLostError, RaySystemError):
            self.node.check(ask_ray=True)  # the loss of this process's node, if it is one; else the error as it is
            raise

    def client(self, actor: Any, timeout: float) -> RayClient:
        return RayClient(actor, timeout)

    def weights(self, version: int, flat: np.ndarray) -> np.ndarray:
        return flat  # small enough to travel inside the call; a put object costs an extra fetch per actor

    def shared(self, payload: Any) -> Any:
        return self.ray.put(payload)

    def kill(self, actor: Any) -> None:
        try:
            self.ray.kill(actor)
        except Exception:  # noqa: BLE001, S110 - it may already be gone
            pass


class Overheads:
    """Per-iteration overheads of remote collection, in memory that stays flat however long the run: the largest
    exactly, the median over a uniform sample of at most ``keep`` of them (every one, in runs of fewer
    iterations). A list of every one grows by 32 bytes an iteration: 2.5 to 6 MB an hour in the soak benchmark's
    learners, which run 40,000 to 100,000 iterations in half an hour."""

    def __init__(self, keep: int = 10_000):
        self.keep, self.count, self.largest = keep, 0, 0.0
        self.sample: list[float] = []
        self._rng = random.Random(0)  # its own stream: training's randomness is untouched

    def add(self, seconds: float) -> None:
        self.count += 1
        self.largest = max(self.largest, seconds)
        if len(self.sample) < self.keep:
            self.sample.append(seconds)
        elif (slot := self._rng.randrange(self.count)) < self.keep:  # each one seen is kept with chance keep/count
            self.sample[slot] = seconds

    def summary(self) -> dict[str, float]:
        """Median and largest, in milliseconds (nothing before the first)."""
        if not self.count:
            return {}
        return {"overhead_ms_median": 1000 * float(np.median(self.sample)), "overhead_ms_max": 1000 * self.largest}
