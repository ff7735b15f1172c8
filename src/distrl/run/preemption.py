"""Stopping a run on a signal: a cluster's preemption (SIGTERM, then SIGKILL some seconds later) or Ctrl-C.

``distrl train`` catches SIGTERM and SIGINT. The first asks the run to stop at its next checkpoint: the
training loops look at :func:`requested` once per iteration, every worker agrees on the iteration (the
flag travels in the all-reduce the iteration already makes), the checkpoint is written, the logs are
flushed and the process exits with 128 + the signal's number (143 for SIGTERM, 130 for SIGINT), as a
process killed by it would. A second signal stops at once, and so does the first while nothing in the
process can stop at a checkpoint (before its trainer exists, or a launcher that cannot pass the signal on):
what can is said by :func:`listen`. The Python API leaves signals alone.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType
from typing import Any

from distrl.run.rundir import HELD_BY_LAUNCHER

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)

_requested = 0
"""The first stop signal this process received, 0 while none has come."""
_catching = False
_listening = False


class Stopped(Exception):
    """The run wrote a checkpoint and stopped on a signal; the message (empty on workers that are not the
    main one) is printed as one line, and the exit status is 128 + the signal's number."""

    def __init__(self, signum: int, message: str = ""):
        super().__init__(message)
        self.signum = signum

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


@contextlib.contextmanager
def stop_signals_caught() -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT ask this process's run to stop at its next checkpoint; the
    handlers before it are put back after. Outside the main thread nothing changes."""
    global _catching, _requested, _listening
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _catching, _requested, _listening = True, 0, False
    try:
        with _handled_by(_on_signal):
            yield
    finally:
        _catching, _requested, _listening = False, 0, False


@contextlib.contextmanager
def stopped_at_once(what_is_lost: str) -> Iterator[None]:
    """While the block runs, SIGTERM and SIGINT stop at once by raising :class:`Stopped`, so that ``finally`` blocks
    run (killed outright, the process would leave what it was writing): for commands with nothing to checkpoint,
    such as ``distrl collect``. Its line: 'SIGTERM received: stopped; ' + ``what_is_lost``. Outside the main thread
    nothing changes."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise Stopped(signum, f"{name(signum)} received: stopped; {what_is_lost}")

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    with _handled_by(stop):
        yield


@contextlib.contextmanager
def _handled_by(handler: Any) -> Iterator[None]:
    """The stop signals go to ``handler`` while the block runs; the handlers before it are put back after."""
    before = {signum: signal.signal(signum, handler) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, previous in before.items():
            signal.signal(signum, previous)


def reinstall() -> None:
    """Put the handlers back if this process catches stop signals (after Ray or another library took them)."""
    if _catching and threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, _on_signal)


def listen() -> None:
    """Say that this process now acts on a stop request (a trainer's loop, a launcher that passes it on)."""
    global _listening
    _listening = True


def requested() -> int:
    """The stop signal received, or 0."""
    return _requested


def name(signum: int) -> str:
    return signal.Signals(signum).name


def _on_signal(signum: int, frame: FrameType | None) -> None:
    global _requested
    if _requested or not _listening:
        which = "second " if _requested else ""
        print(f"distrl: {which}{name(signum)}: stopping at once, without a checkpoint", file=sys.stderr)
        raise SystemExit(128 + signum)
    _requested = signum
    if not os.environ.get(HELD_BY_LAUNCHER):  # a rank of distrl's launcher: the launcher has said it
        print(
            f"distrl: {name(signum)} received: stopping at the next checkpoint (send it again to stop at once)",
            file=sys.stderr,
        )
