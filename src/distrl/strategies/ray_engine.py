"""Ray as an engine: one session per run and the actor that hosts a ddp rank.

With no address, an embedded local Ray instance starts with the run (bound to
127.0.0.1, no dashboard) and stops with it; with an address the run joins that cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrl.config import ConfigError
from distrl.run import preemption

INLINE_RESULT_BYTES = 512 * 1024
"""The embedded instance returns results up to this size inside the reply instead of through its
object store (Ray's default: 100 KB). Rollout fragments and episode batches of a few hundred KB
are the common case here, and the object store's put and fetch cost them milliseconds on small
machines. A cluster joined with ``--ray-address`` keeps its own setting."""


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise ConfigError("Ray is not installed: pip install 'distrl[ray]'") from None
    return ray


def free_port() -> int:
    """A TCP port free on this host now; another process may take it before it is bound again (see STORE_FD)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


STORE_FD = "DISTRL_STORE_FD"
"""Set on rank 0 by a launcher that bound the group's store socket itself: its file descriptor, which rank 0's store
listens on. A port found free and bound only later by rank 0 can be taken in between by any process on the host (an
outgoing connection draws its port from the same range), and the run then fails at its start on EADDRINUSE."""


def store_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to a free port of ``host`` and listening: rank 0's store serves on it (STORE_FD), so the
    port is held from the moment it is chosen; ranks that connect early wait in its backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


START_LOG = "ray-start.log"
"""What Ray prints while it starts (its token-authentication notice, its processes' start-up lines),
kept in the run directory instead of the user's terminal unless --debug."""


@contextmanager
def ray_session(
    address: str, run_dir: Path | None = None, num_cpus: int | None = None, debug: bool = False
) -> Iterator[Any]:
    """Yield the ``ray`` module with a connected session; shut it down after if this call started it."""
    ray = import_ray()
    started = embedded = False
    if not ray.is_initialized():
        kwargs: dict[str, Any] = {"logging_level": logging.WARNING, "log_to_driver": False}
        with contextlib.nullcontext() if debug else output_to(run_dir / START_LOG if run_dir else None):
            if address:
                _probe(address)
                try:
                    ray.init(address=address, **kwargs)
                except Exception as exc:  # noqa: BLE001 - Ray raises several types for an unreachable cluster
                    raise ConfigError(f"ray_address={address!r}: cannot connect to a Ray cluster ({exc})") from None
            else:
                # address="local": the run's own instance, whatever other cluster RAY_ADDRESS or an address file
                # left by an earlier `ray start` points at (without it Ray would try to join that one).
                with loopback_node_address():
                    ray.init(
                        address="local",
                        num_cpus=num_cpus or os.cpu_count(),
                        include_dashboard=False,
                        _node_ip_address="127.0.0.1",
                        _system_config={"max_direct_call_object_size": INLINE_RESULT_BYTES},
                        **kwargs,
                    )
                    embedded = True
        started = True
        preemption.reinstall()  # Ray's driver takes SIGTERM as it starts
        if run_dir is not None:
            _link_session_logs(ray, run_dir)
    try:
        yield ray
    finally:
        if embedded:
            stop_autoscaler_monitor()
        if started:
            ray.shutdown()


def stop_autoscaler_monitor() -> None:
    """Kill the embedded instance's autoscaler monitor before ``ray.shutdown``.

    An instance of one node has nothing to scale, and the monitor does not exit on the SIGTERM that
    ``ray.shutdown`` sends: Ray waits 1 s for it, then kills it, at the end of every run (measured on Ray 2.60:
    ``ray.shutdown`` took 1.3-1.6 s, and 0.6 s with the monitor gone). Ray names its processes in a private
    table; without it (another Ray version) the shutdown goes as before.
    """
    try:
        from ray._private import ray_constants, worker

        monitors = worker._global_node.all_processes.get(ray_constants.PROCESS_TYPE_MONITOR, [])
    except (ImportError, AttributeError):
        return
    for info in monitors:
        if info.process.poll() is None:
            info.process.kill()
            with contextlib.suppress(Exception):
                info.process.wait(timeout=1.0)


@contextmanager
def loopback_node_address() -> Iterator[None]:
    """Keep the embedded instance's node address at 127.0.0.1, so that every one of its servers listens on
    loopback only.

    On Linux Ray replaces a loopback ``_node_ip_address`` with the machine's outward address
    (``ray._private.services.resolve_ip_for_localhost``) unless ``ray_constants.ENABLE_RAY_CLUSTER`` is off,
    as it is by default on macOS and Windows; its GCS, raylet, workers and agents then listen on every
    interface. Ray reads the flag as the driver starts the instance only, so it is off for ``ray.init`` alone.
    """
    try:
        import ray._private.ray_constants as constants
    except ImportError:
        constants = None
    if constants is None or not hasattr(constants, "ENABLE_RAY_CLUSTER"):
        yield
        return
    saved = constants.ENABLE_RAY_CLUSTER
    constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        constants.ENABLE_RAY_CLUSTER = saved


@contextmanager
def output_to(path: Path | None) -> Iterator[None]:
    """Send this process's stdout and stderr, and those of the processes it starts meanwhile, to ``path``
    (appended), or to a scratch file shown on the terminal if the block fails when there is no path."""
    sys.stdout.flush()
    sys.stderr.flush()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
    sink = open(path, "ab") if path is not None else tempfile.TemporaryFile()  # noqa: SIM115 - closed below
    saved = os.dup(1), os.dup(2)
    failed = False
    try:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        yield
    except BaseException:
        failed = True
        raise
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])
        if failed and path is None:
            sink.seek(0)
            sys.stderr.write(sink.read().decode(errors="replace"))
        sink.close()


def _probe(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast when HOST:PORT does not accept connections (Ray itself retries for minutes)."""
    if address == "auto" or address.startswith("ray://") or ":" not in address:
        return
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout_s):
            pass
    except (OSError, ValueError) as exc:
        raise ConfigError(f"ray_address={address!r}: cannot connect to a Ray cluster ({exc})") from None


def _link_session_logs(ray: Any, run_dir: Path) -> None:
    """Point ``run_dir/ray-logs`` at this Ray session's log directory."""
    try:
        session_dir = Path(
            ray.get_runtime_context().get_session_dir()
            if hasattr(ray.get_runtime_context(), "get_session_dir")
            else ray._private.worker._global_node.get_session_dir_path()
        )
    except Exception:  # noqa: BLE001 - logs are a convenience, never a reason to fail a run
        return
    run_dir.mkdir(parents=True, exist_ok=True)
    link = run_dir / "ray-logs"
    if not link.exists() and (session_dir / "logs").exists():
        link.symlink_to(session_dir / "logs")


@dataclass(frozen=True)
class RankStopped:
    """What a rank actor returns when its run stopped on a signal at a checkpoint."""

    signum: int
    message: str


class RankActor:
    """A Ray actor that runs one rank of a torch.distributed group; it catches stop signals as ``distrl train``
    does (the launcher passes one on to rank 0)."""

    def __init__(self, rank: int, world_size: int):
        self.rank = rank
        self.world_size = world_size
        self.store: socket.socket | None = None

    def where(self) -> dict[str, Any]:
        from distrl.strategies.actors import placement

        return placement()

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's address and the port of a socket this actor holds, which rank 0's store will serve on."""
        import ray

        self.store = store_socket("0.0.0.0")
        return ray.util.get_node_ip_address(), int(self.store.getsockname()[1])

    def run(self, host: str, port: int, fn: Any, *args: Any) -> Any:
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            MASTER_ADDR=host,
            MASTER_PORT=str(port),
            LOCAL_RANK="0",
            LOCAL_WORLD_SIZE="1",
        )
        if self.store is not None:  # the store takes the descriptor over and closes it
            os.environ[STORE_FD] = str(self.store.detach())
            self.store = None
        blocked = signal.pthread_sigmask(signal.SIG_UNBLOCK, preemption.STOP_SIGNALS)  # Ray's workers block SIGINT
        try:
            with preemption.stop_signals_caught():
                try:
                    return fn(*args)
                except preemption.Stopped as stopped:
                    return RankStopped(stopped.signum, str(stopped))
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
