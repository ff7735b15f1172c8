"""Strategy configuration: how the work is spread over processes, and how an algorithm's settings scale with
the number of workers."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from distrl.config.algos import REINFORCEConfig, SACConfig
from distrl.config.base import (
    ConfigError,
    Device,
    Engine,
    Launcher,
    OnWorkerError,
    ReplaySampling,
    Scaling,
    Strategy,
    require,
    require_fraction,
    require_positive,
)
from distrl.config.dqn import DQNConfig
from distrl.config.grpo import GRPOConfig
from distrl.config.offline import OfflineConfig

DECOUPLED_ALGOS = ("ppo",)
"""The algorithms ``--strategy decoupled`` trains: its player runs PPO's rollouts for trainers that update together."""


def check_decoupled(algo: str) -> None:
    """Refuse ``--strategy decoupled`` for an algorithm it does not train (before its other settings are checked:
    this is the reason a user needs first)."""
    if algo not in DECOUPLED_ALGOS:
        raise ConfigError(
            f"algo={algo!r} is not available with --strategy decoupled: use {' or '.join(DECOUPLED_ALGOS)}"
        )


@dataclass(frozen=True)
class StrategyConfig:
    """How the work is spread over processes."""

    strategy: Strategy = "single"
    """How the work is spread. single: this process, vectorised envs. ddp: every worker collects and
    trains, gradients summed before clipping. actor-learner: Ray workers collect with broadcast
    weights, this process updates. decoupled: one player process runs the envs, the other workers
    train together. pipeline: generators run ahead of the learner through a queue and a versioned
    buffer."""
    workers: int = 1
    """Processes besides single's one: ddp ranks, actor-learner rollout workers, pipeline generators,
    or decoupled's player and trainers together. Under torchrun the world size comes from torchrun."""
    scaling: Scaling = "per-worker"
    """per-worker: each worker keeps n_steps (the global batch grows with workers, as in DD-PPO);
    equivalent: ddp scales n_steps / workers and learning_rate * workers, actor-learner n_steps /
    workers, so runs with different worker counts are comparable. REINFORCE's rollout workers always
    share episodes_per_iter; decoupled and pipeline learners train on single's batch whatever the
    worker count: only per-worker applies."""
    sync_frac: float = 1.0
    """Straggler preemption (DD-PPO): once this fraction of workers has finished its rollout, the
    others stop collecting (keeping at least min_rollout_frac of theirs). 1.0 turns it off."""
    min_rollout_frac: float = 0.25
    """The share of its rollout a preempted worker collects at least."""
    launcher: Launcher = "auto"
    """Who starts the ddp workers: local processes, Ray actors (auto: ray when --ray-address is set), or
    Spark's TorchDistributor (distrl[spark])."""
    ray_address: str = ""
    """Ray cluster to join ('auto' or HOST:PORT); empty starts an embedded local instance when needed."""
    spark_master: str = ""
    """--launcher spark: the Spark master URL (empty: local[workers], a Spark inside this process)."""
    spark_local_mode: bool = True
    """--launcher spark: start the ranks on the Spark driver (True) or as Spark tasks on executors (False)."""
    timeout_s: float = 120.0
    """Longest wait on another worker (collectives, start-up) before the run fails naming it."""
    worker_cpus: float = 1.0
    """CPUs Ray reserves for each rollout worker (actor-learner), actor (pipeline) or rank (ddp on Ray): below 1,
    more actors than cores fit, as for environments that wait on a remote simulator."""
    worker_gpus: float = 0.0
    """GPUs Ray reserves for each rollout worker or rank."""
    max_worker_restarts: int = 3
    """actor-learner: how many times each rollout worker may be restarted after dying or failing."""
    on_worker_error: OnWorkerError = "restart"
    """actor-learner: what an exception raised inside a worker's env does: restart the worker, or abort the run."""
    share_data: bool = False
    """decoupled: send every trainer the whole rollout (each trains on its own part of every minibatch),
    instead of scattering equal shards."""
    player_device: Device = "cpu"
    """decoupled: where the player (rank 0) acts and computes values."""
    trainer_device: Device = "auto"
    """decoupled: where the trainers (ranks 1..N-1) update; cuda uses NCCL among them."""
    max_policy_lag: int = 4
    """pipeline: data drawn by a policy more than this many versions behind the learner is dropped."""
    buffer_capacity: int = 64
    """pipeline: scored slices (grpo) or rollout fragments (ppo) the replay buffer holds; the oldest is
    evicted past it."""
    replay_sampling: ReplaySampling = "version"
    """pipeline: replay sampling, uniform or weighted by policy version + 1 (newer data more often)."""
    fragments_per_step: int = 0
    """pipeline on Gymnasium envs: the generators' fragments each learner step trains on, merged along the env
    axis (several actors' data per batch, as IMPALA's learner batches them). 0: one for ppo, one per generator
    for appo and impala."""
    actors_per_rank: int = 0
    """ddp with ppo, appo or impala: feed each rank's learner from this many asynchronous Ray actors of its own (as
    the pipeline feeds its learner) instead of its own environments; gradients are summed over ranks as always.
    With 0 every rank collects itself."""
    max_reuse: int = 1
    """pipeline: learner steps that may train on one slice or fragment before it leaves the buffer."""
    queue_size: int = 0
    """pipeline: how far the generators may run ahead of the learner, in slices (grpo) or fragments (ppo)
    requested, being scored, or buffered and not trained on yet; past it they idle (back-pressure).
    With 0: 16 slices for grpo; for ppo one fragment per generator (and fragments_per_step - 1 more); for appo and
    impala two per actor (each keeps its next request queued) and one batch of fragments_per_step besides."""
    starve_timeout_s: float = 60.0
    """pipeline, and actor-learner with dqn or sac: the learner fails, naming the stage it waits on, when no data
    arrives for this long once the actors have started (their start is bounded by timeout_s). The pipeline waits ten
    times its longest wait for data so far where that is longer (a machine whose cores other work takes slows the
    generators down without stalling them)."""
    replay_ratio: float = 0.0
    """actor-learner with dqn or sac (Ape-X): samples the learner draws per transition the actors insert. 0 lets
    both run free (actors never wait; the learner takes gradient_steps per iteration without waiting); a ratio
    paces them to it (the learner waits for data when ahead and holds the actors back when behind)."""
    engine: Engine = "ray"
    """pipeline: the actor engine: Ray (embedded, or --ray-address), or Monarch process meshes on this
    host (distrl[monarch])."""

    def __post_init__(self) -> None:
        require_positive(self, "workers", "timeout_s", "buffer_capacity", "max_reuse", "starve_timeout_s")
        require(
            self.actors_per_rank >= 0, "actors_per_rank", self.actors_per_rank, ">= 0 (0: ranks collect themselves)"
        )
        if self.actors_per_rank:
            require(
                self.strategy == "ddp", "actors_per_rank", self.actors_per_rank, "0 with --strategy " + self.strategy
            )
        require(self.fragments_per_step >= 0, "fragments_per_step", self.fragments_per_step, ">= 0 (0: the default)")
        require(self.queue_size >= 0, "queue_size", self.queue_size, ">= 0 (0: the default for the algorithm)")
        require(self.max_policy_lag >= 0, "max_policy_lag", self.max_policy_lag, ">= 0")
        require(self.replay_ratio >= 0, "replay_ratio", self.replay_ratio, ">= 0 (0: actors and learner run free)")
        require(self.worker_cpus >= 0, "worker_cpus", self.worker_cpus, ">= 0")
        require(self.worker_gpus >= 0, "worker_gpus", self.worker_gpus, ">= 0")
        require(self.max_worker_restarts >= 0, "max_worker_restarts", self.max_worker_restarts, ">= 0")
        require_fraction(self, "sync_frac", inclusive_zero=False)
        require_fraction(self, "min_rollout_frac", inclusive_zero=False)
        if self.strategy == "single":
            require(self.workers == 1, "workers", self.workers, "1 with --strategy single", "use --strategy ddp")
        if self.strategy == "decoupled":
            require(
                self.workers >= 2,
                "workers",
                self.workers,
                ">= 2 with --strategy decoupled",
                "a player needs at least one trainer",
            )
        if self.launcher == "spark":
            require(
                self.strategy in ("ddp", "decoupled"),
                "launcher",
                self.launcher,
                "auto, local or ray with --strategy " + self.strategy,
                "Spark starts ddp or decoupled ranks",
            )
        if self.engine != "ray":
            require(
                self.strategy == "pipeline",
                "engine",
                self.engine,
                "ray with --strategy " + self.strategy,
                "Monarch runs the pipeline's actors",
            )
            require(not self.ray_address, "ray_address", self.ray_address, "empty with --engine monarch")
        if self.strategy in ("decoupled", "pipeline"):
            require(
                self.scaling == "per-worker",
                "scaling",
                self.scaling,
                f"per-worker with --strategy {self.strategy}",
                "its learner already trains on single's batch whatever the worker count",
            )
        if self.strategy != "ddp":
            require(
                self.sync_frac == 1.0,
                "sync_frac",
                self.sync_frac,
                f"1.0 with --strategy {self.strategy}",
                "straggler preemption needs --strategy ddp",
            )

    @property
    def uses_ray(self) -> bool:
        return self.launcher == "ray" or (self.launcher == "auto" and bool(self.ray_address))


def scaled(cfg: Any, strategy: StrategyConfig, world_size: int) -> Any:
    """The algorithm config each worker runs: unchanged per worker, or scaled to match one process.

    ddp: PPO n_steps / N and learning_rate * N. SAC and DQN: buffer_size / N, learning_starts / N and
    learning_rate * N (the recipes of Horovod's distributed PPO and SAC). REINFORCE: episodes_per_iter / N;
    GRPO: slices_per_step / N; their one gradient step per iteration is already the mean over every
    worker's samples, so the learning rate stays.

    actor-learner: one learner trains on the union of its workers' batches, as single does on its own, so
    only the collection shrinks: PPO's workers collect n_steps / N each (REINFORCE's already share
    episodes_per_iter) and the learning rate stays. DQN's and SAC's learner samples its batches from the
    shared replay whatever the number of actors: nothing changes.
    """
    if strategy.scaling == "per-worker" or world_size == 1:
        return cfg
    if isinstance(cfg, OfflineConfig):  # its batch is global already: each worker holds a part of every one
        return cfg
    if strategy.strategy == "actor-learner":
        if isinstance(cfg, (REINFORCEConfig, SACConfig, DQNConfig)):
            return cfg
        return _divided(cfg, "n_steps", world_size)
    if isinstance(cfg, GRPOConfig):
        return _divided(cfg, "slices_per_step", world_size)
    if isinstance(cfg, REINFORCEConfig):
        return _divided(cfg, "episodes_per_iter", world_size)
    if isinstance(cfg, (SACConfig, DQNConfig)):
        return dataclasses.replace(
            cfg,
            buffer_size=max(cfg.batch_size, cfg.buffer_size // world_size),
            learning_starts=cfg.learning_starts // world_size,
            learning_rate=cfg.learning_rate * world_size,
        )
    return _divided(cfg, "n_steps", world_size, learning_rate=cfg.learning_rate * world_size)


def _divided(cfg: Any, field: str, world_size: int, **changes: Any) -> Any:
    """``cfg`` with ``field`` divided among ``world_size`` workers (and ``changes``); an error if it does not divide."""
    value = getattr(cfg, field)
    require(value % world_size == 0, field, value, f"divisible by the {world_size} workers with --scaling equivalent")
    return dataclasses.replace(cfg, **{field: value // world_size}, **changes)
