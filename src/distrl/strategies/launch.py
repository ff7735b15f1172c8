"""Launchers: they only start worker processes; :mod:`distrl.strategies.ddp` does the rest.

- local (default): N processes on this machine, each the same ``distrl`` command with
  torch.distributed's ``env://`` variables set, exactly as torchrun would start them.
- torchrun: nothing to do here; the command sees the variables and runs as a worker.
- Ray: N actors on a Ray cluster (or an embedded local instance) form the group
  (:mod:`distrl.strategies.ray_launch`).

A worker that fails ends the whole job: the launcher stops the others and reports the
failed rank with the last lines it printed.
"""

from __future__ import annotations

import collections
import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, Any

from distrl.run import preemption
from distrl.run.rundir import HELD_BY_LAUNCHER
from distrl.strategies.rendezvous import STORE_FD, store_socket

STOPPED_STATUSES = {128 + int(signum) for signum in preemption.STOP_SIGNALS}
PEERS_GRACE_S = 2.0
"""After the first rank fails, how long to wait for the others' own errors before choosing whom to name."""

PEER_FAILURE = re.compile(
    r"gloo|nccl|connection (closed|reset) by peer|timed out|remote worker crashing", re.IGNORECASE
)
"""An error that a rank reports because a peer died; the rank that died first is the news."""


class WorkerFailed(RuntimeError):
    """A worker process exited with an error; the message names its rank."""


def check_before_launch(run: Any, strategy: Any, cfg: Any, resume_path: Path | None) -> None:
    """Every check that can fail before any worker starts: run directory, layout or scaling, env."""
    from distrl.config import ConfigError, check_decoupled, scaled
    from distrl.run import checkpoint
    from distrl.training import TRAINERS

    checkpoint.check_new_run_dir(Path(run.run_dir), resume_path)
    check_gpus_per_rank(run.device, strategy)
    if strategy.strategy == "decoupled":
        from distrl.strategies.decoupled import check_layout

        check_decoupled(run.algo)
        check_layout(cfg, strategy, strategy.workers)
    else:
        scaled(cfg, strategy, strategy.workers)
    if strategy.actors_per_rank and run.algo not in ("ppo", "appo", "impala"):
        raise ConfigError(
            f"actors_per_rank={strategy.actors_per_rank} is not available for {run.algo}: use ppo, appo or impala"
        )
    TRAINERS[run.algo].check_env(run, cfg)


def check_gpus_per_rank(device: str, strategy: Any) -> None:
    """Ranks started on this machine on CUDA each need a GPU of their own (NCCL refuses two ranks on one)."""
    import torch

    from distrl.config import ConfigError

    local = strategy.launcher in ("auto", "local") and not strategy.uses_ray
    if strategy.strategy != "ddp" or not local or device not in ("cuda", "auto") or not torch.cuda.is_available():
        return
    gpus = torch.cuda.device_count()
    if strategy.workers > gpus:
        raise ConfigError(
            f"workers={strategy.workers} is not allowed with --device {device} here: NCCL needs one GPU per rank "
            f"and {gpus} is visible; use --workers {gpus}, or --device cpu (gloo)"
        )


def _load_prctl() -> Callable[..., int] | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl
    except OSError:
        return None


_PRCTL = _load_prctl() if sys.platform.startswith("linux") else None
"""libc's prctl, looked up here in the launcher: a child between fork and exec must not load a library (a lock
another thread of the parent held at the fork, the loader's among them, stays held in the child)."""


def _start_worker() -> None:  # pragma: no cover - runs in the child between fork and exec
    """A process group of its own, so that a terminal's Ctrl-C reaches the launcher alone (which passes it on
    once); on Linux, SIGKILL to this worker if the launcher dies, so no worker is orphaned."""
    os.setpgrp()
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class ForkedRank:
    """A rank forked from the launcher (see :func:`launch_local`), with the part of ``subprocess.Popen``'s interface
    the launcher uses: ``stderr``, ``poll``, ``wait``, ``send_signal``, ``kill`` and ``returncode``."""

    def __init__(self, pid: int, stderr: IO[str]):
        self.pid, self.stderr = pid, stderr
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is None:
            _, status = os.waitpid(self.pid, 0)
            self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def fork_rank(
    entry: Callable[[list[str]], int], argv: list[str], env: dict[str, str], drop_fd: int | None = None
) -> ForkedRank:
    """Start a rank as a fork of this process, which has imported torch and distrl already: the rank runs
    ``entry(argv)`` (the command's own entry point, ``distrl.cli.main``) with ``env`` as its environment and its
    stderr on a pipe, as ``python -m distrl`` would, without a second interpreter's start-up (about a second of
    imports a rank). Fork before any thread starts (the launcher's readers start after every rank is forked).
    ``drop_fd``: a descriptor of the launcher's that the rank must not hold (the store's socket, rank 0's alone)."""
    sys.stdout.flush()
    sys.stderr.flush()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write_end)
        return ForkedRank(pid, os.fdopen(read_end, "r", encoding="utf-8", errors="replace"))
    code = 1  # pragma: no cover - the rank's side, in the forked child
    try:
        os.close(read_end)
        if drop_fd is not None:
            os.close(drop_fd)
        os.dup2(write_end, 2)
        os.close(write_end)
        if sys.platform.startswith("linux"):
            _start_worker()
        else:
            os.setpgrp()
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as a fresh interpreter starts; the rank installs its own
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.environ.clear()
        os.environ.update(env)
        code = entry(argv)
    except SystemExit as stop:
        if isinstance(stop.code, str):
            print(stop.code, file=sys.stderr)
        code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except BaseException:  # noqa: BLE001 - the child must end here, never return into the launcher's code
                pass
        os._exit(code)


def fork_ranks(device: str) -> bool:
    """Whether the ranks of a run on ``device`` may be forked from the launcher: not where CUDA may be used (a CUDA
    runtime does not survive a fork, and NCCL ranks each need their own), nor where ``os.fork`` does not exist, nor
    from a process running threads of its own (a notebook's kernel, a test runner's worker, a Ray driver): a lock
    one of them holds at the fork stays held in the child, which would wait on it forever."""
    if not hasattr(os, "fork") or device.startswith("cuda") or threading.active_count() > 1:
        return False
    if device == "auto":
        import torch

        return not torch.cuda.is_available()
    return True


class _Worker:
    def __init__(self, rank: int, process: subprocess.Popen | ForkedRank):
        self.rank = rank
        self.process = process
        self.tail: collections.deque[str] = collections.deque(maxlen=30)
        self.reader = threading.Thread(target=self._pump, daemon=True)
        self.reader.start()

    def _pump(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self.tail.append(line.rstrip("\n"))
            if self.rank == 0:
                sys.stderr.write(line)
            else:
                sys.stderr.write(f"[rank {self.rank}] {line}")
            sys.stderr.flush()


def describe_exit(code: int) -> str:
    """A process's end as a person reads it: its exit status, or the signal that killed it."""
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit status {code}"


def error_line(tail: Iterable[str]) -> str:
    """The line of a process's last output that says what went wrong (else its last line)."""
    lines = [line for line in tail if line.strip()]
    for line in reversed(lines):
        if line.startswith("distrl: error:") or "Error" in line or "Exception" in line:
            return line.strip()
    return lines[-1].strip() if lines else "no output"


def launch_local(
    argv: list[str], workers: int, timeout_s: float, entry: Callable[[list[str]], int] | None = None
) -> None:
    """Run ``python -m distrl *argv`` as ``workers`` ranks on this machine; raise WorkerFailed on failure.

    ``entry``: the command's entry point (``distrl.cli.main``) to run in ranks forked from this process, warm
    (:func:`fork_rank`); None starts each rank as a new interpreter.
    The launcher holds the run directory's lock for its ranks. A stop signal it receives goes to rank 0, which
    makes every rank stop at the same checkpoint; then the launcher raises Stopped. A second one kills them."""
    store = store_socket()  # held from here: rank 0's store serves on it
    base = dict(
        os.environ,
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.getsockname()[1]),
        WORLD_SIZE=str(workers),
        LOCAL_WORLD_SIZE=str(workers),
        PYTHONUNBUFFERED="1",
        **{HELD_BY_LAUNCHER: "1"},
    )
    procs: list[_Worker] = []
    preexec = _start_worker if sys.platform.startswith("linux") else os.setpgrp
    preemption.listen()
    try:
        started: list[subprocess.Popen | ForkedRank] = []
        for rank in range(workers):
            env = dict(base, RANK=str(rank), LOCAL_RANK=str(rank))
            if rank == 0:
                env[STORE_FD] = str(store.fileno())
            if entry is not None:
                started.append(fork_rank(entry, argv, env, None if rank == 0 else store.fileno()))
            else:
                started.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "distrl", *argv],
                        env=env,
                        stderr=subprocess.PIPE,
                        text=True,
                        preexec_fn=preexec,
                        pass_fds=(store.fileno(),) if rank == 0 else (),
                    )
                )
        store.close()  # rank 0 holds it now
        procs.extend(_Worker(rank, process) for rank, process in enumerate(started))
        _wait_all(procs)
    finally:
        store.close()
        _stop_all(procs)


def _wait_all(procs: list[_Worker]) -> None:
    running = list(procs)
    passed_on = 0
    while running:
        if preemption.requested() and not passed_on:
            passed_on = preemption.requested()
            procs[0].process.send_signal(passed_on)  # rank 0 tells the others in its next all-reduce
        for worker in list(running):
            code = worker.process.poll()
            if code is None:
                continue
            running.remove(worker)
            if code != 0 and not (passed_on and code in STOPPED_STATUSES):
                raise WorkerFailed(_root_cause(procs))
        time.sleep(0.05)
    if passed_on:
        raise preemption.Stopped(passed_on)  # rank 0 has said where it stopped


def _root_cause(procs: list[_Worker]) -> str:
    """Name the rank that failed first in substance, not the peers that then lost it in a collective.

    Ranks exit within milliseconds of each other when one dies, often inside one poll, so
    the order of exit says little; a rank whose error is a lost peer is named only if no
    rank has another error.
    """
    deadline = time.monotonic() + PEERS_GRACE_S
    while time.monotonic() < deadline and any(w.process.poll() is None for w in procs):
        time.sleep(0.05)
    failed = [w for w in procs if w.process.poll() not in (0, None)]  # on their own, not stopped by us
    _stop_all(procs)
    for worker in failed:
        worker.reader.join(timeout=2.0)
    return blame({w.rank: f"failed ({describe_exit(w.process.returncode)}): {error_line(w.tail)}" for w in failed})


def blame(errors: dict[int, str]) -> str:
    """One line from each failed rank's ``failed …: error``: a rank whose error is a lost peer is named last."""
    ranks = sorted(errors)
    first = next((r for r in ranks if not PEER_FAILURE.search(errors[r])), ranks[0])
    others = [r for r in ranks if r != first]
    also = f" (then failed too: rank {', '.join(map(str, others))})" if others else ""
    return f"rank {first} {errors[first]}{also}"


def _stop_all(procs: list[_Worker]) -> None:
    """Kill the workers still running: a rank catches SIGTERM to stop at a checkpoint, not at once."""
    alive = [w for w in procs if w.process.poll() is None]
    for worker in alive:
        worker.process.kill()
    for worker in alive:
        worker.process.wait()
