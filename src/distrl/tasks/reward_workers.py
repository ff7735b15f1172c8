"""Functions called in worker processes of their own, one call per worker at a time, each with a timeout.

:class:`WorkerPool` is how :class:`distrl.tasks.rewards.RewardSet` runs reward functions so that none can hang
or kill a run: ``workers`` processes import the functions by name and take one call each, in parallel.
A call past ``timeout_s`` has its worker killed *with every process the call started*: each worker
leads a process group (a session) of its own, and the whole group gets SIGKILL. A fresh worker takes
its place. Nothing is left behind: :meth:`WorkerPool.close` kills every worker's group, and a worker
whose parent is gone (killed, crashed) kills its own within a fifth of a second.

Workers are fresh interpreters (``python -c ...``, then :func:`serve`), never forks of this process: it
holds torch's threads, and a fork copies the locks other threads held. Unlike multiprocessing's spawn,
they do not re-import the parent's main script, which in a Ray actor is Ray's worker script and in a
user's script without ``if __name__ == "__main__":`` would start the run again. Calls and answers
travel pickled over a socket pair, so what the functions print still reaches this process's terminal.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

START_TIMEOUT_S = 60.0
"""Longest a worker may take to start and import the functions (an interpreter, torch, the user's module)."""
KILL_WAIT_S = 5.0
"""Longest to wait for a killed worker to be reaped (SIGKILL cannot be caught: only a process stuck in
the kernel takes this long)."""
PARENT_POLL_S = 0.2
"""How often a worker checks that its parent still lives (one getppid call)."""
ANSWER_EVERY_S = 0.005
"""A worker sends the answers it holds this often (and at once at the end of a chunk): a message per answer
would cost a cheap reward most of its time, and the parent's clock for the next call starts at the last
message, so a call's timeout stretches by about this much at most."""
CHUNKS_PER_WORKER = 4
"""A run's calls go out in chunks, about this many per worker: one message carries a chunk, and the worker
answers each call as it ends. A message per call would cost a round trip per sample (most of the time of a
cheap reward); a chunk per worker would leave a worker idle behind one slow call."""
_BOOT = (
    "import json, sys; sys.path[:] = json.loads(sys.argv[1]); "
    "import distrl.tasks.reward_workers as w; w.serve(int(sys.argv[2]), int(sys.argv[3]))"
)
"""A worker's program: this process's module path (as multiprocessing's spawn sets it) before any import,
so that the worker imports distrl and the functions' modules from where this process does."""


def longest_run_s(calls: int, workers: int, timeout_s: float) -> float:
    """The longest :meth:`WorkerPool.run` of ``calls`` calls can take: every call timing out, its worker replaced."""
    return -(-calls // max(workers, 1)) * (timeout_s + START_TIMEOUT_S)


class WorkersFailed(RuntimeError):
    """A worker could not start or import the functions: no call can run."""


@dataclass(frozen=True)
class Outcome:
    """What one call came to: a value, an error, or a timeout."""

    value: Any = None
    error: str = ""
    """What went wrong, to follow the function's name: ``raised ValueError: ...``, ``ended its worker process
    (exit status 3)``; empty if it returned (or timed out)."""
    timed_out: bool = False
    seconds: float = 0.0
    """How long the call took (one that timed out: until it was killed)."""


Job = tuple[int, dict[str, Any]]
"""A call: the index of the function among the pool's names, and its keyword arguments."""


class WorkerPool:
    """Up to ``workers`` processes calling the functions ``load(name)`` gives for each of ``names``.

    Workers start on the first :meth:`run` (a process that never calls starts none), stay up between runs,
    and are replaced when one is killed. Close the pool when done (it is also closed when garbage collected
    and at interpreter exit).
    """

    def __init__(
        self,
        load: Callable[[str], Callable[..., Any]],
        names: Sequence[str],
        workers: int,
        timeout_s: float,
        start_timeout_s: float = START_TIMEOUT_S,
    ):
        if workers < 1:
            raise ValueError(f"workers={workers}: a pool needs at least one")
        self.load, self.names, self.size = load, tuple(names), workers
        self.timeout_s, self.start_timeout_s = timeout_s, start_timeout_s
        self.workers: list[_Worker] = []
        self._finalizer = weakref.finalize(self, _kill_all, self.workers)

    def run(self, jobs: Sequence[Job], on_outcome: Callable[[int, Outcome], None]) -> None:
        """Make every call of ``jobs`` on the ``workers`` in parallel, and hand each one's outcome to
        ``on_outcome(index, outcome)`` as it comes. Each call has ``timeout_s`` of its own: a worker's deadline
        moves on with every answer, and a call past it is killed with its worker, whose calls not yet begun go
        to the others. If ``on_outcome`` (or anything else, Ctrl-C included) raises, the calls under way are
        killed, since their answers would be read as later calls', and the exception goes on. Raises
        :class:`WorkersFailed` if a worker cannot start."""
        pending = deque(range(len(jobs)))
        remaining = len(jobs)
        chunk = max(1, -(-len(jobs) // (self.size * CHUNKS_PER_WORKER)))
        try:
            while remaining:
                busy = sum(worker.job is not None for worker in self.workers)
                while len(self.workers) < min(self.size, busy + len(pending)):
                    self.workers.append(_Worker(self.load, self.names, self.start_timeout_s))
                for worker in self.workers:
                    if pending and worker.ready and worker.job is None:
                        taken = [pending.popleft() for _ in range(min(chunk, len(pending)))]
                        worker.call([(j, jobs[j]) for j in taken], self.timeout_s)
                for j, outcome in self._collect(pending):
                    remaining -= 1
                    on_outcome(j, outcome)
                if remaining and not pending and all(worker.job is None for worker in self.workers):
                    raise RuntimeError(f"reward worker pool: {remaining} calls neither made nor queued")
        except BaseException:
            for worker in [w for w in self.workers if w.job is not None]:
                self._discard(worker)
            raise

    def _collect(self, pending: deque[int]) -> list[tuple[int, Outcome]]:
        """Wait for an answer, a worker ready, a death or the first deadline; the calls that ended. The calls
        a killed worker had not begun go back to the front of ``pending``."""
        deadline = min((worker.deadline for worker in self.workers), default=time.monotonic())
        wait([worker.conn for worker in self.workers], timeout=max(0.0, min(deadline - time.monotonic(), 1.0)))
        ended: list[tuple[int, Outcome]] = []
        for worker in list(self.workers):
            if not worker.conn.poll():
                continue
            try:
                message = worker.conn.recv()
            except (EOFError, OSError):
                status = self._discard(worker)
                pending.extendleft(reversed(worker.queued()))
                if worker.job is not None:
                    error = f"ended its worker process ({status})"
                    ended.append((worker.job, Outcome(error=error, seconds=time.monotonic() - worker.sent)))
                elif not worker.ready:
                    raise WorkersFailed(
                        f"a reward worker ended ({status}) while importing {', '.join(self.names)}"
                    ) from None
                continue
            if not worker.ready:
                kind, text = message
                if kind != "ready":
                    self._discard(worker)
                    raise WorkersFailed(f"a reward worker could not import {', '.join(self.names)}: {text}")
                worker.ready, worker.deadline = True, float("inf")
                continue
            for returned, value, seconds in message:  # the answers to one or more calls, in order
                outcome = Outcome(value=value, seconds=seconds) if returned else Outcome(error=value, seconds=seconds)
                ended.append((worker.done(), outcome))
        now = time.monotonic()
        for worker in list(self.workers):
            if now < worker.deadline:
                continue
            if not worker.ready:
                self._discard(worker)
                raise WorkersFailed(
                    f"a reward worker did not import {', '.join(self.names)} within {self.start_timeout_s:g} s"
                )
            assert worker.job is not None
            ended.append((worker.job, Outcome(timed_out=True, seconds=now - worker.sent)))
            self._discard(worker)
            pending.extendleft(reversed(worker.queued()))
        return ended

    def _discard(self, worker: _Worker) -> str:
        self.workers.remove(worker)
        return worker.kill()

    def close(self) -> None:
        """Kill every worker with everything it started."""
        _kill_all(self.workers)


class _Worker:
    """One worker process, seen from the parent: its connection, the call it is making and those it holds next."""

    def __init__(self, load: Callable[[str], Callable[..., Any]], names: Sequence[str], start_timeout_s: float):
        ours, theirs = socket.socketpair()
        command = [sys.executable, "-c", _BOOT, json.dumps(sys.path), str(theirs.fileno()), str(os.getpid())]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # what a function prints survives a SIGKILL
        try:
            # a session of its own (setsid before exec): killpg reaches whatever a call starts, and a
            # terminal's Ctrl-C reaches this process alone, which then closes the pool
            self.process = subprocess.Popen(
                command, pass_fds=(theirs.fileno(),), start_new_session=True, stdin=subprocess.DEVNULL, env=env
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send((load, tuple(names)))
        self.ready = False
        self.calls: deque[int] = deque()
        """The calls sent and not answered, in order: the first is under way (since ``sent``)."""
        self.sent, self.timeout_s = 0.0, 0.0
        self.deadline = time.monotonic() + start_timeout_s
        """When the worker must be ready by (starting) or its call must end (busy); inf when idle."""

    @property
    def job(self) -> int | None:
        """The call under way, if any."""
        return self.calls[0] if self.calls else None

    def call(self, chunk: list[tuple[int, Job]], timeout_s: float) -> None:
        self.conn.send([job for _, job in chunk])
        self.calls.extend(j for j, _ in chunk)
        self.timeout_s, self.sent = timeout_s, time.monotonic()
        self.deadline = self.sent + timeout_s

    def done(self) -> int:
        """The call just answered; the next one starts now, with a deadline of its own."""
        j = self.calls.popleft()
        self.sent = time.monotonic()
        self.deadline = self.sent + self.timeout_s if self.calls else float("inf")
        return j

    def queued(self) -> list[int]:
        """The calls sent but not begun (all but the one under way)."""
        return list(self.calls)[1:]

    def kill(self) -> str:
        """SIGKILL to the worker's process group; how the worker ended."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):  # the group is gone already
            pass
        try:
            self.process.wait(KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            pass
        self.conn.close()
        code = self.process.returncode
        if code is None:
            return "not reaped"
        if code < 0:
            return f"killed by {signal.Signals(-code).name}"
        return f"exit status {code}"


def _kill_all(workers: list[_Worker]) -> None:
    while workers:
        workers.pop().kill()


# ---- the worker process ----


def serve(fd: int, parent: int) -> None:
    """A worker's life: import the functions, then answer chunks of calls until the parent closes the connection."""
    _exit_with_parent(parent)
    conn = Connection(fd)
    try:
        try:
            load, names = conn.recv()
            functions = [load(name) for name in names]
        except BaseException as exc:  # noqa: BLE001 - the parent reports it
            conn.send(("failed", f"{type(exc).__name__}: {exc}"))
            return
        conn.send(("ready", ""))
        outbox = _Outbox(conn)
        while True:
            try:
                chunk = conn.recv()
            except EOFError:
                return
            for k, kwargs in chunk:
                outbox.put(_call(functions[k], kwargs))
            outbox.flush()
    finally:
        _kill_group()


class _Outbox:
    """A worker's answers on their way to the parent: a thread sends what has accumulated every
    :data:`ANSWER_EVERY_S` (and at once on :meth:`flush`), so an answer held back never waits on the next call,
    which may hang; the parent times that call from the answers it got last."""

    def __init__(self, conn: Connection):
        self.conn, self.held = conn, []
        self.lock, self.wake = threading.Lock(), threading.Event()
        threading.Thread(target=self._send_forever, daemon=True, name="answers").start()

    def put(self, answer: tuple[bool, Any, float]) -> None:
        with self.lock:
            self.held.append(answer)

    def flush(self) -> None:
        self.wake.set()

    def _send_forever(self) -> None:
        while True:
            self.wake.wait(ANSWER_EVERY_S)
            self.wake.clear()
            with self.lock:  # held while sending: answers leave in the order they were made
                if self.held:
                    _send_answers(self.conn, self.held)
                    self.held = []


def _send_answers(conn: Connection, answers: list[tuple[bool, Any, float]]) -> None:
    try:
        conn.send(answers)
    except Exception:  # noqa: BLE001 - pickling a value failed before anything was sent: find it, send the rest
        for returned, value, seconds in answers:
            try:
                conn.send([(returned, value, seconds)])
            except Exception as exc:  # noqa: BLE001
                why = f"returned a {type(value).__name__} that cannot be sent back: {exc}"
                conn.send([(False, why, seconds)])


def _call(fn: Callable[..., Any], kwargs: dict[str, Any]) -> tuple[bool, Any, float]:
    start = time.perf_counter()
    try:
        value = fn(**kwargs)
    except BaseException as exc:  # noqa: BLE001 - sys.exit and the like included: the parent reports it
        return False, f"raised {type(exc).__name__}: {exc}", time.perf_counter() - start
    return True, value, time.perf_counter() - start


def _exit_with_parent(parent: int) -> None:
    """Kill this worker's group once its parent is gone: no one would read its answers. A watching thread,
    not PR_SET_PDEATHSIG, which fires when the parent *thread* that started the worker ends."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        _kill_group()

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _kill_group() -> None:
    """SIGKILL to this worker's process group: itself and whatever its calls started."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os.killpg(os.getpgrp(), signal.SIGKILL)
