"""Ray as an engine: one session per run (ddp ranks as Ray actors: :mod:`distrl.strategies.ray_launch`).

With no address, an embedded local Ray instance starts with the run (bound to
127.0.0.1, no dashboard) and stops with it; with an address the run joins that cluster.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
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
