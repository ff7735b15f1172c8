"""Monarch as the pipeline's actor engine: ``--engine monarch`` (``pip install 'distrl[monarch]'``).

Each actor runs in a process mesh of one process on this host, spawned with
``this_host().spawn_procs``; a generic host actor (:class:`Hosted`) holds the pipeline's plain
actor object and runs its methods, so the actors are the same classes Ray runs. Weights go out
through ``RDMABuffer``: every published version gets a buffer of its own that is never written
again (a generator can never read half of one version and half of the next), and the last
:data:`KEEP_VERSIONS` stay registered. Without RDMA hardware Monarch moves them over TCP.

Monarch's defaults are changed in two places: a crashed actor process would end the driver
(the default fault hook exits), so a hook that records the failure is installed and the
pipeline restarts the actor; and a dead process is noticed within half a second instead of ten.
"""

from __future__ import annotations

import os
import time
import warnings
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from distrl.config import ConfigError
from distrl.strategies.actors import ActorDied, ActorRaised, SyncClient

os.environ.setdefault("HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY", "500ms")

try:
    from monarch.actor import Actor as _MonarchActor
    from monarch.actor import endpoint as _endpoint
except ImportError:  # the extra is optional: require_monarch() says what to install
    _MonarchActor = None

KEEP_VERSIONS = 16
"""Published weight versions whose RDMA buffers stay registered."""

POLL_S = 0.0005


def require_monarch() -> Any:
    if _MonarchActor is None:
        raise ConfigError("engine='monarch' needs Monarch, which is not installed: pip install 'distrl[monarch]'")
    import monarch.actor

    return monarch.actor


if _MonarchActor is not None:

    class Hosted(_MonarchActor):
        """A Monarch actor that holds one plain pipeline actor and runs its methods."""

        def __init__(self, cls: type, args: tuple):
            self.obj = cls(*args)

        @_endpoint
        def invoke(self, method: str, *args: Any) -> Any:
            return getattr(self.obj, method)(*args)


class MonarchActor:
    """A handle: the one-process mesh and the host actor on it."""

    def __init__(self, procs: Any, mesh: Any, name: str):
        self.procs, self.mesh, self.name = procs, mesh, name


class Pending:
    """A Monarch future, polled without being consumed (``get(timeout=0)``); its outcome is kept."""

    __slots__ = ("future", "done", "value", "error")

    def __init__(self, future: Any):
        self.future, self.done, self.value, self.error = future, False, None, None

    def poll(self) -> bool:
        if not self.done:
            try:
                self.value = self.future.get(timeout=0)
                self.done = True
            except TimeoutError:
                pass
            except Exception as exc:  # noqa: BLE001 - the outcome is reported by MonarchActors.result
                self.error, self.done = exc, True
        return self.done


class MonarchClient(SyncClient):
    """Calls a Monarch-hosted actor (its mesh is the handle) from another actor."""

    def _call(self, method: str, args: tuple) -> Any:
        return self.handle.invoke.call_one(method, *args).get(timeout=self.timeout)


class RDMAWeights:
    """One published weight version, read by the generator that receives it (``as_array``)."""

    def __init__(self, buffer: Any, size: int, version: int):
        self.buffer, self.size, self.version = buffer, size, version

    def fetch(self) -> np.ndarray:
        import torch

        out = torch.empty(self.size, dtype=torch.float32)
        self.buffer.read_into(out.view(torch.uint8).flatten()).get()
        return out.numpy()


class MonarchActors:
    """The actor engine on Monarch (see the module docstring)."""

    name = "monarch"

    def __init__(self, stop_timeout_s: float = 30.0):
        self.actor_module = require_monarch()
        self.faults: list[str] = []
        self.actor_module.unhandled_fault_hook = self._on_fault
        self.stop_timeout_s = stop_timeout_s
        self.actors: list[MonarchActor] = []
        self._published: deque[tuple[int, Any, Any]] = deque(maxlen=KEEP_VERSIONS)

    def _on_fault(self, failure: Any) -> None:
        self.faults.append(str(failure).splitlines()[0][:300])

    def spawn(self, cls: type, *args: Any, cpus: float = 0.0, gpus: float = 0.0) -> MonarchActor:
        procs = self.actor_module.this_host().spawn_procs(per_host={"procs": 1})
        name = cls.__name__.lower()
        actor = MonarchActor(procs, procs.spawn(name, Hosted, cls, args), name)
        self.actors.append(actor)
        return actor

    def call(self, actor: MonarchActor, method: str, *args: Any) -> Pending:
        return Pending(actor.mesh.invoke.call_one(method, *args))

    def wait(self, pending: list[Pending], timeout: float, first: bool = False) -> list[Pending]:
        deadline = time.monotonic() + timeout
        while True:
            done = [p for p in pending if p.poll()]
            if (first and done) or len(done) == len(pending) or time.monotonic() >= deadline:
                return done
            time.sleep(POLL_S)

    def result(self, pending: Pending, timeout: float) -> Any:
        if not self.wait([pending], timeout):
            raise TimeoutError(f"no answer within {timeout:.0f} s")
        if pending.error is None:
            return pending.value
        if type(pending.error).__name__ == "SupervisionError":
            raise ActorDied(str(pending.error).splitlines()[0][:300]) from None
        raise ActorRaised(str(pending.error), type(pending.error).__name__) from None

    def client(self, actor: MonarchActor, timeout: float) -> MonarchClient:
        return MonarchClient(actor.mesh, timeout)

    def weights(self, version: int, flat: np.ndarray) -> RDMAWeights:
        import torch
        from monarch.rdma import RDMABuffer

        if self._published and self._published[-1][0] == version:
            return self._published[-1][2]
        tensor = torch.from_numpy(np.array(flat, dtype=np.float32))  # its own memory: never written again
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # no RDMA hardware: TCP, as the module docstring says
            buffer = RDMABuffer(tensor.view(torch.uint8).flatten())
        handle = RDMAWeights(buffer, tensor.numel(), version)
        self._published.append((version, tensor, handle))
        return handle

    def shared(self, payload: Any) -> Any:
        return payload  # each call carries its own copy

    def kill(self, actor: MonarchActor) -> None:
        try:
            actor.procs.stop().get(timeout=self.stop_timeout_s)
        except Exception:  # noqa: BLE001, S110 - it may already be gone
            pass

    def close(self) -> None:
        for actor in self.actors:
            self.kill(actor)
        self.actors.clear()
        self._published.clear()


@contextmanager
def monarch_session() -> Iterator[MonarchActors]:
    """An actor engine whose processes all stop on exit."""
    engine = MonarchActors()
    try:
        yield engine
    finally:
        engine.close()
