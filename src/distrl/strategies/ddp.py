"""``ddp``: every worker collects with its own environments and trains its own replica.

Gradients are summed over workers every minibatch, before clipping (DD-PPO,
arXiv:1911.00357; Horovod's distributed PPO; Lightning Fabric's DDP PPO). This module
is the one code path every launcher ends in: it receives torch.distributed's ``env://``
variables (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, LOCAL_RANK) from distrl's local
launcher, from torchrun or from a Ray actor, forms the process group and runs the
same trainer as ``single`` with a :class:`DistributedSync`.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distrl.config import ConfigError, RunConfig, StrategyConfig, scaled
from distrl.nets.core import checksum
from distrl.strategies.actors import placement
from distrl.strategies.dist_sync import DistributedSync
from distrl.strategies.rendezvous import STORE_FD
from distrl.training import make_trainer, resolve_device

ENV_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def in_distributed_env() -> bool:
    """Whether this process was started as one rank of a group (local launcher, torchrun, Ray)."""
    return all(name in os.environ for name in ENV_VARS)


def init_process_group(run: RunConfig, strategy: StrategyConfig) -> torch.device:
    """Join the group described by the ``env://`` variables; returns this rank's device."""
    device = resolve_device(run.device)
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        device = torch.device("cuda", local_rank % torch.cuda.device_count())
        torch.cuda.set_device(device)
    join_group(
        "nccl" if device.type == "cuda" else "gloo", strategy.timeout_s, device if device.type == "cuda" else None
    )
    return device


def join_group(backend: str, timeout_s: float, device: torch.device | None = None) -> None:
    """``init_process_group`` from the ``env://`` variables, on a store fresh for each torchrun restart.

    Outside torchrun's agent store rank 0 hosts the store, listening on the socket its launcher bound and handed
    down (STORE_FD) where there is one, so no other process can take the port between its choice and its use.

    Under torchrun the ranks share the agents' rendezvous store, and the keys the group forms from
    (each rank's address) outlive a restart (``--max-restarts``): a restarted rank would read its
    dead peer's address and fail to connect. With one agent its restart count names the attempt, so
    each attempt forms on keys of its own. Several agents count restarts apart (an agent whose own
    ranks did not fail restarts without counting), so there only torchrun's own per-round store
    (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``) is sound; without it a restartable run is refused.
    """
    kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=timeout_s)}
    if device is not None:
        kwargs["device_id"] = device
    env = os.environ
    agent_store = env.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    if agent_store and int(env.get("TORCHELASTIC_MAX_RESTARTS", "0")) > 0:
        if int(env.get("GROUP_WORLD_SIZE", "1")) > 1:
            raise ConfigError(
                f"max_restarts={env['TORCHELASTIC_MAX_RESTARTS']} on {env['GROUP_WORLD_SIZE']} torchrun "
                "nodes needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 in every agent's environment: "
                "restarted ranks would otherwise meet on the failed attempt's addresses"
            )
        store = dist.TCPStore(
            env["MASTER_ADDR"], int(env["MASTER_PORT"]), is_master=False, timeout=timedelta(seconds=timeout_s)
        )
        kwargs.update(
            store=dist.PrefixStore(f"distrl/attempt-{env.get('TORCHELASTIC_RESTART_COUNT', '0')}", store),
            rank=int(env["RANK"]),
            world_size=int(env["WORLD_SIZE"]),
        )
    elif not agent_store:  # rank 0 hosts the store, on the socket its launcher bound where there is one
        rank, world_size = int(env["RANK"]), int(env["WORLD_SIZE"])
        listen_fd = env.pop(STORE_FD, None) if rank == 0 else None
        store = dist.TCPStore(
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            world_size,
            is_master=rank == 0,
            timeout=timedelta(seconds=timeout_s),
            master_listen_fd=int(listen_fd) if listen_fd else None,
        )
        kwargs.update(store=store, rank=rank, world_size=world_size)
    dist.init_process_group(**kwargs)


def run_worker(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Path, resume_path: Path | None = None
) -> dict[str, Any] | None:
    """Train as one rank of an already described group; rank 0 returns the run's summary."""
    start = time.perf_counter()
    if strategy.strategy == "decoupled":
        return _run_decoupled(run, strategy, cfg, run_dir, resume_path, start)
    device = init_process_group(run, strategy)
    try:
        sync = DistributedSync(device, strategy.timeout_s)
        world = sync.world_size
        if strategy.workers not in (1, world):
            raise ConfigError(f"workers={strategy.workers} differs from the process group's world size {world}")
        strategy = dataclasses.replace(strategy, workers=world)
        effective = scaled(cfg, strategy, world)
        fed = own_actors(run, strategy, run_dir) if strategy.actors_per_rank else nullcontext(None)
        with fed as collector_factory:
            extra = {"collector_factory": collector_factory} if collector_factory is not None else {}
            trainer = make_trainer(
                run.algo,
                run.replace(device=str(device.type)),
                effective,
                sync=sync,
                run_dir=run_dir,
                strategy=strategy,
                requested=cfg,
                device=device,
                **extra,
            )
            return _train_rank(trainer, sync, resume_path, start)
    finally:
        dist.destroy_process_group()


@contextmanager
def own_actors(run: RunConfig, strategy: StrategyConfig, run_dir: Path) -> Iterator[Any]:
    """``--actors-per-rank N``: a collector factory whose collector is fed by N asynchronous actors of this rank's
    own, as the pipeline's learner is (on an embedded Ray instance per rank, or the cluster at ``--ray-address``)."""
    from distrl.strategies.pipeline import actor_engine
    from distrl.strategies.pipeline_ppo import AsyncCollector

    actors = dataclasses.replace(strategy, workers=strategy.actors_per_rank)
    cpus = max(1, int(np.ceil(actors.workers * actors.worker_cpus)))
    with actor_engine(actors, run_dir, num_cpus=cpus, debug=run.debug) as engine:
        yield lambda trainer: AsyncCollector(trainer, actors, engine)


def _train_rank(trainer: Any, sync: DistributedSync, resume_path: Path | None, start: float) -> dict[str, Any] | None:
    """Train this rank's replica to the end; rank 0 returns the run's summary."""
    world = sync.world_size
    try:
        places: list[dict[str, Any] | None] = [None] * world
        dist.all_gather_object(places, placement())
        trainer.extra_summary["placement"] = {"ranks": places}
        if sync.rank == 0:
            trainer.begin(resume_path)
        trainer.broadcast_state()
        if sync.rank != 0 and resume_path is not None and trainer.keeps_worker_state:
            trainer.load_worker_state(resume_path)  # each rank's own part of the checkpoint (SAC's replay)
        for i, tensor in enumerate(trainer.broadcast_tensors()):
            sync.verify_identical(tensor, f"start-up tensor {i} (parameters or optimizer state)")
        trainer.train()
        checksums: list[str | None] = [None] * world
        dist.all_gather_object(checksums, checksum(trainer.broadcast_tensors()[0]))
        trainer.extra_summary["param_checksums"] = checksums
    except BaseException:
        trainer.close()
        raise
    summary = trainer.finish(time.perf_counter() - start)
    return summary if sync.rank == 0 else None


def _run_decoupled(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Path, resume_path: Path | None, start: float
) -> dict[str, Any] | None:
    from distrl.strategies.decoupled import run_decoupled_rank

    # the world group carries batches and weights between player and trainers on the CPU
    join_group("gloo", strategy.timeout_s)
    try:
        world = dist.get_world_size()
        if strategy.workers not in (1, world):
            raise ConfigError(f"workers={strategy.workers} differs from the process group's world size {world}")
        return run_decoupled_rank(run, dataclasses.replace(strategy, workers=world), cfg, run_dir, resume_path, start)
    finally:
        dist.destroy_process_group()
