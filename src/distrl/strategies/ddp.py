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
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from distrl.config import ConfigError, RunConfig, StrategyConfig, scaled
from distrl.nets.core import checksum
from distrl.strategies.dist_sync import DistributedSync
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
    backend = "nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"backend": backend, "timeout": timedelta(seconds=strategy.timeout_s)}
    if device.type == "cuda":
        kwargs["device_id"] = device
    dist.init_process_group(**kwargs)
    return device


def run_worker(run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Path,
               resume_path: Path | None = None) -> dict[str, Any] | None:
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
        trainer = make_trainer(run.algo, run.replace(device=str(device.type)), effective, sync=sync,
                               run_dir=run_dir if sync.rank == 0 else None, strategy=strategy,
                               requested=cfg, device=device)
        try:
            if resume_path is not None and sync.rank == 0:
                trainer.load_checkpoint(resume_path)
            trainer.broadcast_state()
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
    finally:
        dist.destroy_process_group()


def _run_decoupled(run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Path, resume_path: Path | None,
                   start: float) -> dict[str, Any] | None:
    from distrl.strategies.decoupled import run_decoupled_rank

    # the world group carries batches and weights between player and trainers on the CPU
    dist.init_process_group(backend="gloo", timeout=timedelta(seconds=strategy.timeout_s))
    try:
        world = dist.get_world_size()
        if strategy.workers not in (1, world):
            raise ConfigError(f"workers={strategy.workers} differs from the process group's world size {world}")
        return run_decoupled_rank(run, dataclasses.replace(strategy, workers=world), cfg, run_dir, resume_path, start)
    finally:
        dist.destroy_process_group()
