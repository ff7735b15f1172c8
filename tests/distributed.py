"""Run a function as the ranks of a gloo process group, in spawned processes (tests only)."""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import random
import socket
import traceback
from pathlib import Path

from distrl.strategies.rendezvous import STORE_FD, store_socket


def free_port() -> int:
    """A port for a server a test starts but cannot hand a socket to (torchrun's rendezvous, ``ray start``): one that
    binds now, below the range the kernel draws outgoing connections' ports from, so that none of them can take it
    before the server binds it (a port bound to 0 comes from that range)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    below = range(20000, max(low, 20000))
    for port in random.SystemRandom().sample(below, min(50, len(below))):  # not a test's seeded generator
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _entry(fn, rank, world_size, store, results, collected, timeout, args, env):
    os.environ.clear()  # the test's environment when it called run_ranks, not the fork server's from its start
    os.environ.update(
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(store.getsockname()[1]),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        **env,
    )
    if rank == 0:
        os.environ[STORE_FD] = str(store.detach())  # the store takes the descriptor over
    else:
        store.close()
    import torch
    import torch.distributed as dist

    from distrl.strategies.ddp import join_group

    torch.set_num_threads(1)
    try:
        join_group("gloo", 60.0)  # inside: a rank that cannot join says why at once, not at the parent's timeout
        results.put((rank, fn(rank, world_size, *args), None))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        results.put((rank, None, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        # A tensor in the queue travels as a file descriptor that this process hands over when the
        # parent reads it: exiting before then leaves the parent nothing to connect to.
        collected.wait(timeout=timeout)


# Ranks are forked from a server that has imported torch and distrl once (per test process): a spawned rank
# imported them again each time, seconds of CPU per rank on two cores (tests/strategies/test_ddp.py: 49 s spawned,
# 13 s forked, on a two-core Xeon). DISTRL_TEST_RANKS_START=spawn starts them the old way, to compare.
PRELOAD = ["torch", "torch.distributed", "numpy", "gymnasium", "distrl.training", "distrl.strategies.ddp"]


def _context() -> mp.context.BaseContext:
    method = os.environ.get("DISTRL_TEST_RANKS_START", "forkserver")
    ctx = mp.get_context(method)
    if method == "forkserver":
        ctx.set_forkserver_preload(PRELOAD)
    return ctx


def run_ranks(fn, world_size: int, *args, timeout: float = 120.0, env: dict[str, str] | None = None) -> list:
    """``fn(rank, world_size, *args)`` on every rank (one machine's ranks, with ``env`` set too); returns the
    results in rank order."""
    ctx = _context()
    results, collected = ctx.Queue(), ctx.Event()
    # Bound here and held until the ranks are done: rank 0's store must serve on it (a bind of its own would fail).
    store = store_socket()
    env = {**os.environ, **(env or {})}
    procs = [
        ctx.Process(target=_entry, args=(fn, r, world_size, store, results, collected, timeout, args, env))
        for r in range(world_size)
    ]
    try:
        for p in procs:
            p.start()
    except BaseException:
        store.close()
        raise
    out, errors = {}, []
    try:
        for _ in range(world_size):
            rank, value, error = results.get(timeout=timeout)
            if error:
                errors.append(f"rank {rank}:\n{error}")
            out[rank] = value
    except queue.Empty:
        errors.append(f"ranks {sorted(set(range(world_size)) - set(out))} did not answer within {timeout}s")
    finally:
        store.close()
        collected.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return [out[r] for r in range(world_size)]


def kill_processes_naming(text: str) -> None:
    """Kill every other process whose command line mentions ``text`` (a test's Ray temp dir: its clusters)."""
    import psutil

    for proc in psutil.process_iter(["cmdline"]):
        try:
            if proc.pid != os.getpid() and any(text in arg for arg in proc.info["cmdline"] or ()):
                proc.kill()
        except psutil.Error:
            pass
