"""ddp ranks as Ray actors: the actor that hosts a rank, and the launcher that starts one per rank and waits on them.

A stop signal goes to rank 0 when it runs on this node; a rank that fails ends the job, named by rank (or by the
node it was lost with), as the local launcher names its processes.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrl.run import preemption
from distrl.strategies.launch import PEERS_GRACE_S, WorkerFailed, blame
from distrl.strategies.ray_engine import ray_session
from distrl.strategies.rendezvous import STORE_FD, store_socket


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


def launch_ray(
    worker_fn: Any,
    args: tuple,
    workers: int,
    ray_address: str,
    run_dir: Path,
    timeout_s: float,
    worker_cpus: float = 1.0,
    worker_gpus: float = 0.0,
    debug: bool = False,
) -> Any:
    """Run ``worker_fn(*args)`` as ``workers`` Ray actors forming one process group; returns rank 0's result.

    A stop signal goes to rank 0 when it runs on this node (every rank then stops at the same checkpoint and
    this raises Stopped); with rank 0 on another node it stops the job at once."""
    with ray_session(ray_address, run_dir, debug=debug) as ray:
        actor_cls = ray.remote(RankActor)
        actors = [
            actor_cls.options(num_cpus=worker_cpus, num_gpus=worker_gpus).remote(rank, workers)
            for rank in range(workers)
        ]
        places = [actor.where.remote() for actor in actors]
        try:
            host, port = ray.get(actors[0].rendezvous_address.remote(), timeout=timeout_s)
            refs = [actor.run.remote(host, port, worker_fn, *args) for actor in actors]
            preemption.listen()
            results = _wait_ray(ray, refs, places)
        finally:
            for actor in actors:
                ray.kill(actor)
        if isinstance(results[0], RankStopped):
            raise preemption.Stopped(results[0].signum, results[0].message)
        return results[0]


def _wait_ray(ray: Any, refs: list, places: list | None = None) -> list:
    from distrl.strategies.actors import CHECK_NODE_EVERY_S, OwnNode, RayNodeDown

    node, checked = OwnNode(ray), time.monotonic()
    pending = list(refs)
    results: dict[int, Any] = {}
    passed_on = False
    try:
        while pending:
            if preemption.requested() and not passed_on and places:
                _pass_on_to_rank_0(ray, places[0], preemption.requested())
                passed_on = True
            try:
                done, pending = ray.wait(pending, num_returns=1, timeout=0.1)
            except OSError:  # the raylet's socket closed under the call ("Broken pipe")
                node.check(ask_ray=True)
                raise
            if not done:
                if time.monotonic() - checked >= CHECK_NODE_EVERY_S:
                    node.check()
                    checked = time.monotonic()
                continue
            try:
                results[refs.index(done[0])] = ray.get(done[0])
            except Exception:  # noqa: BLE001 - any actor failure ends the job, named by rank (or by its lost node)
                node.check(ask_ray=True)
                raise WorkerFailed(_ray_root_cause(ray, refs, places)) from None
    except RayNodeDown as exc:
        raise WorkerFailed(str(exc)) from None
    return [results[r] for r in range(len(refs))]


def _pass_on_to_rank_0(ray: Any, place: Any, signum: int) -> None:
    """Send the stop signal to rank 0's process if it runs on this node; else stop the job at once."""
    try:
        where = ray.get(place, timeout=5.0)
        here = where.get("node") == ray.get_runtime_context().get_node_id()
    except Exception:  # noqa: BLE001 - rank 0 cannot say where it runs: no checkpoint can be asked of it
        here = False
    if not here:
        print(f"distrl: rank 0 runs on another node: {preemption.name(signum)} stops the job at once", file=sys.stderr)
        raise SystemExit(128 + signum)
    os.kill(where["pid"], signum)


def _ray_root_cause(ray: Any, refs: list, places: list | None) -> str:
    """As the local launcher's ``_root_cause``, for ranks running as Ray actors; a rank whose node was lost names it."""
    from distrl.strategies.actors import RayActors, resolve_placements, where_note

    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=PEERS_GRACE_S)
    errors: dict[int, str] = {}
    for ref in ready:
        try:
            ray.get(ref)
        except Exception as exc:  # noqa: BLE001 - any actor failure is reported
            rank = refs.index(ref)
            cause = getattr(exc, "cause", None) or exc
            where = (
                where_note(resolve_placements(RayActors(ray), [places[rank : rank + 1]], 0.5)[0][0]) if places else ""
            )
            detail = str(cause).strip().splitlines()[:1]
            errors[rank] = f"failed{where}: " + ": ".join([type(cause).__name__, *detail])
    return blame(errors)
