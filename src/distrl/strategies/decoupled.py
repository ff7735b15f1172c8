"""``decoupled``: one player process runs every environment; trainers update together.

The pattern of Lightning Fabric's decoupled PPO. Rank 0 is the player: it collects
with its copy of the policy, computes values, GAE and normalised advantages for the
whole rollout, and sends the packed batch to ranks 1..N-1, the trainers. The trainers
update their replicas with gradients summed over a trainers-only process group (the
same ``Sync`` as ``ddp``); trainer rank 1 then broadcasts the new weights to everyone,
and the player's policy version goes up by one.

- default: the rollout is scattered in equal shards, one per trainer;
- ``--share-data``: every trainer receives the whole rollout and computes the gradient of
  its own chunk of every minibatch, so the update equals single-process PPO on it.

Each iteration starts with a small header broadcast by the player (command, progress,
segment), so the trainers follow the player's loop: update, hand over optimizer state
for a checkpoint, or stop.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from distrl.algos.policy_stats import UPDATE_METRICS
from distrl.algos.ppo import PPOAlgo
from distrl.algos.protocols import Sync
from distrl.config import ConfigError, PPOConfig, RunConfig, StrategyConfig
from distrl.data.normalize import ObsNormalizer, RewardScaler
from distrl.data.packed import PackedBatch
from distrl.data.rollout import Rollout, RolloutBatch, Sequences
from distrl.nets.recurrent import sequence_minibatch_rows
from distrl.run import preemption
from distrl.strategies.dist_sync import DistributedSync

STOP, UPDATE, SEND_STATE = 0, 1, 2
TRAINER_ROOT = 1  # the trainer that broadcasts weights and hands over optimizer state


def check_layout(cfg: PPOConfig, strategy: StrategyConfig, world: int) -> None:
    """Fail before training when the rollout cannot be split over the trainers."""
    if world < 2:
        raise ConfigError(
            f"workers={world} is not allowed with --strategy decoupled: must be >= 2 "
            "(a player needs at least one trainer)"
        )
    if cfg.recompute_advantage:
        raise ConfigError(
            "recompute_advantage=True is not available with --strategy decoupled: its player "
            "computes the advantages once per rollout; use single, ddp or actor-learner"
        )
    if cfg.normalize_value:
        raise ConfigError(
            "normalize_value=True is not available with --strategy decoupled: its player computes the advantages "
            "with value statistics that only its trainers' updates see; use single, ddp or actor-learner"
        )
    trainers = world - 1
    if not strategy.share_data and cfg.core != "none":  # shards of whole environment sequences
        if cfg.n_envs % trainers or (cfg.batch_size // trainers) % cfg.n_steps:
            raise ConfigError(
                f"n_envs={cfg.n_envs} and batch_size={cfg.batch_size} do not split over the {trainers} "
                f"trainers in whole sequences with core={cfg.core!r} (--strategy decoupled scatters "
                "equal shards of environments): n_envs and batch_size / n_steps must be divisible by "
                "the trainers; use --share-data or change them"
            )
    elif not strategy.share_data:
        if cfg.rollout_size % trainers:
            raise ConfigError(
                f"n_envs * n_steps = {cfg.rollout_size} is not divisible by the {trainers} trainers "
                "(--strategy decoupled scatters equal shards); use --share-data or change n_envs/n_steps"
            )
        if cfg.batch_size % trainers:
            raise ConfigError(f"batch_size={cfg.batch_size} is not divisible by the {trainers} trainers")


def trainer_config(cfg: PPOConfig, strategy: StrategyConfig, trainers: int) -> PPOConfig:
    """What each trainer's PPOAlgo runs: the player has normalised the advantages already."""
    if strategy.share_data:
        return dataclasses.replace(cfg, normalize_advantage=False)
    if cfg.core != "none":  # each trainer holds whole sequences of its share of the environments
        return dataclasses.replace(
            cfg, n_envs=cfg.n_envs // trainers, batch_size=cfg.batch_size // trainers, normalize_advantage=False
        )
    shard = cfg.rollout_size // trainers
    return dataclasses.replace(
        cfg, n_envs=1, n_steps=shard, batch_size=cfg.batch_size // trainers, normalize_advantage=False
    )


def _send(tensor: torch.Tensor, share: bool, trainers: int, dim: int = 0) -> None:
    tensor = tensor.cpu().contiguous()
    if share:
        dist.broadcast(tensor, 0)
    else:
        shards = [shard.contiguous() for shard in tensor.chunk(trainers, dim)]
        dist.scatter(torch.empty_like(shards[0]), [torch.empty_like(shards[0]), *shards], src=0)


def _receive(buffer: torch.Tensor, share: bool) -> torch.Tensor:
    if share:
        dist.broadcast(buffer, 0)
    else:
        dist.scatter(buffer, None, src=0)
    return buffer


def _send_batch(packed: PackedBatch, share: bool, trainers: int) -> None:
    """Observations (in their stored dtype: images travel as uint8) and the float rows, to every trainer;
    for a recurrent policy whole environment sequences, with their episode starts and initial states."""
    obs, data, sequences = packed.obs, packed.data, packed.sequences
    if sequences is not None and not share:  # rows regrouped so that each shard is some environments' sequences
        T, N = sequences.length, sequences.count
        order = torch.cat([sequence_minibatch_rows(T, N, envs) for envs in torch.arange(N).chunk(trainers)])
        obs, data = obs[order.to(obs.device)], data[order.to(data.device)]
    for tensor in (obs, data):
        _send(tensor, share, trainers)
    if sequences is not None:
        for tensor in (sequences.starts, *sequences.initial_state):  # environments on axis 1
            _send(tensor, share, trainers, dim=1)


def _receive_batch(
    rows: int,
    obs_shape: tuple[int, ...],
    obs_dtype: torch.dtype,
    columns: int,
    share: bool,
    trainers: int,
    sequences: tuple[int, tuple[torch.Tensor, ...]] | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Sequences | None]:
    """``sequences``: (T, the initial state of this trainer's environments, for its shapes) when recurrent."""
    n = rows if share else rows // trainers
    obs = _receive(torch.empty(n, *obs_shape, dtype=obs_dtype), share)
    data = _receive(torch.empty(n, columns), share)
    if sequences is None:
        return obs, data, None
    T, like = sequences
    envs = n // T
    starts = _receive(torch.empty(T, envs), share)
    state = tuple(_receive(torch.empty(s.shape[0], envs, *s.shape[2:]), share) for s in like)
    return obs, data, Sequences(starts, state)


class PlayerAlgo:
    """The player's learning rule (an ``OnPolicyUpdate``): prepares batches with :class:`PPOAlgo` here, and
    updates on the trainers, whose weights come back."""

    def __init__(self, algo: PPOAlgo, strategy: StrategyConfig, world: int):
        self.algo = algo
        self.optimizer = algo.optimizer
        """The trainers' Adam state, fetched for checkpoints (:meth:`state_dict`)."""
        self.share = strategy.share_data
        self.trainers = world - 1
        self.segment = 0
        self.wait_s = 0.0
        """Seconds the player spent waiting for the trainers' weights."""

    def prepare(self, rollout: Rollout) -> RolloutBatch:
        return self.algo.prepare(rollout)

    def batch_statistics(self, batch: RolloutBatch) -> np.ndarray:
        return self.algo.batch_statistics(batch)

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.algo.load_state_dict(tensors)

    def reseed(self, seed: int, rank: int, segment: int) -> None:
        self.segment = segment
        self.algo.reseed(seed, rank, segment)

    def _header(self, command: int, progress: float = 0.0) -> None:
        dist.broadcast(torch.tensor([command, progress, self.segment], dtype=torch.float64), 0)

    def update(
        self,
        batch: RolloutBatch,
        sync: Sync,
        progress_remaining: float = 1.0,
        batch_totals: np.ndarray | None = None,
    ) -> dict[str, float]:
        packed = PackedBatch.pack(batch, self.algo.normalized_advantages(batch, sync, batch_totals))
        self._header(UPDATE, progress_remaining)
        _send_batch(packed, self.share, self.trainers)
        start = time.perf_counter()
        params = self.algo.agent.params.data
        staged = params.cpu() if params.device.type != "cpu" else params
        dist.broadcast(staged, TRAINER_ROOT)
        metrics = torch.zeros(len(UPDATE_METRICS), dtype=torch.float64)
        dist.broadcast(metrics, TRAINER_ROOT)
        self.wait_s += time.perf_counter() - start
        if staged is not params:
            params.copy_(staged)
        self.algo.agent.refresh_acting_copy()
        out = dict(zip(UPDATE_METRICS, metrics.tolist()))
        out["time/player_wait_s"] = self.wait_s
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The optimizer state lives on the trainers: fetch it from trainer 1 first."""
        self._header(SEND_STATE)
        optim = self.algo.optimizer
        steps = torch.zeros(1, dtype=torch.float64)
        for tensor in (optim.exp_avg, optim.exp_avg_sq, steps):
            dist.broadcast(tensor, TRAINER_ROOT)
        optim.steps = int(steps[0])
        return self.algo.state_dict()

    def stop(self) -> None:
        self._header(STOP)


def run_trainer(
    run: RunConfig, strategy: StrategyConfig, cfg: PPOConfig, device: torch.device, trainers_group: Any
) -> list[str]:
    """The loop of ranks 1..N-1: receive a batch, update together, hand the weights back.

    Returns a checksum of the weights after every update (tests compare them with the player's).
    """
    from distrl.envs.spaces import stored_layout
    from distrl.envs.vector import make_run_env
    from distrl.nets import make_agent
    from distrl.nets.core import checksum
    from distrl.nets.multiagent import agent_setup_for

    world, rank = dist.get_world_size(), dist.get_rank()
    trainers = world - 1
    preemption.listen()  # a stop signal here waits for the player's STOP, which follows its checkpoint
    probe = make_run_env(run, 1)
    obs_space, action_space, agents = probe.single_observation_space, probe.single_action_space, probe.agents
    probe.close()
    obs_shape, obs_dtype = stored_layout(obs_space)
    setup = agent_setup_for(run, agents)  # a trainer rank has no OnPolicyTrainer: its probe env gives the agents
    agent = make_agent(
        obs_space, action_space, cfg, device, run.seed, run.policy, run.precision, run.network_mask, setup
    )
    algo = PPOAlgo(trainer_config(cfg, strategy, trainers), agent, run.seed)
    algo.set_agents(setup)  # a multi-agent env's rows: n_envs games of every agent
    sync = DistributedSync(device, strategy.timeout_s, group=trainers_group)
    _receive_start_state(
        agent,
        algo,
        ObsNormalizer.for_space(obs_space, cfg.normalize_obs, cfg.clip_obs),
        RewardScaler(cfg.n_envs * max(1, len(agents)), cfg.gamma, cfg.normalize_reward),
        DistributedSync(torch.device("cpu"), strategy.timeout_s),
    )
    action_shape = agent.spec.action_shape
    torch_dtype = torch.from_numpy(np.zeros(0, obs_dtype)).dtype
    segment = -1
    history: list[str] = []
    while True:
        header = torch.zeros(3, dtype=torch.float64)
        dist.broadcast(header, 0)
        command, progress, new_segment = int(header[0]), float(header[1]), int(header[2])
        if command == STOP:
            return history
        if command == SEND_STATE:
            steps = torch.tensor([algo.optimizer.steps], dtype=torch.float64)
            for tensor in (algo.optimizer.exp_avg, algo.optimizer.exp_avg_sq, steps):
                staged = tensor.cpu() if tensor.device.type != "cpu" else tensor
                dist.broadcast(staged, TRAINER_ROOT)
            continue
        if new_segment != segment:  # every trainer shuffles alike with --share-data, apart otherwise
            segment = new_segment
            algo.reseed(run.seed, 0 if strategy.share_data else rank, segment)
        recurrent = (cfg.n_steps, agent.initial_state(1)) if agent.recurrent else None
        obs, data, sequences = _receive_batch(
            cfg.rollout_size * algo.agents_per_env,
            obs_shape,
            torch_dtype,
            PackedBatch.columns(action_shape),
            strategy.share_data,
            trainers,
            recurrent,
        )
        if sequences is not None:
            sequences = Sequences(sequences.starts.to(device), tuple(s.to(device) for s in sequences.initial_state))
        packed = PackedBatch(obs.to(device), data.to(device), action_shape, agent.discrete, sequences)
        part = (rank - 1, trainers) if strategy.share_data else None
        metrics = algo.update_packed(packed, sync, progress, part)
        params = agent.params.data
        staged = params.cpu() if params.device.type != "cpu" else params
        dist.broadcast(staged, TRAINER_ROOT)
        if staged is not params and rank != TRAINER_ROOT:
            params.copy_(staged)
        dist.broadcast(torch.tensor([metrics[k] for k in UPDATE_METRICS], dtype=torch.float64), TRAINER_ROOT)
        history.append(checksum(agent.params.data))


def _receive_start_state(
    agent: Any, algo: PPOAlgo, obs_normalizer: ObsNormalizer, reward_scaler: RewardScaler, world_sync: Sync
) -> None:
    """A trainer's side of the player's ``broadcast_state``: the same tensors, by the same code, received in place
    (the counters only the player keeps)."""
    from distrl.training import OnPolicyTrainer
    from distrl.training.state import exchange_start_state

    tensors = OnPolicyTrainer.start_state(agent, algo.optimizer, obs_normalizer, reward_scaler)
    exchange_start_state(tensors, torch.zeros(len(OnPolicyTrainer.COUNTERS), dtype=torch.float64), world_sync)
    OnPolicyTrainer.load_start_state(tensors, algo.optimizer, obs_normalizer, reward_scaler)
    agent.refresh_acting_copy()


def run_decoupled_rank(
    run: RunConfig, strategy: StrategyConfig, cfg: PPOConfig, run_dir: Path, resume_path: Path | None, start: float
) -> dict[str, Any] | None:
    """Rank 0 plays, ranks 1..N-1 train. Called with the world process group initialised."""
    from distrl.training import OnPolicyTrainer, resolve_device
    from distrl.training.state import set_cpu_options

    world, rank = dist.get_world_size(), dist.get_rank()
    check_layout(cfg, strategy, world)
    trainer_device = resolve_device(strategy.trainer_device)
    backend = "nccl" if trainer_device.type == "cuda" else "gloo"
    trainers_group = dist.new_group(list(range(1, world)), backend=backend)  # every rank takes part in creating it
    if rank > 0:
        device = trainer_device
        if device.type == "cuda":
            device = torch.device("cuda", (rank - 1) % torch.cuda.device_count())
            torch.cuda.set_device(device)
        set_cpu_options(run)
        run_trainer(run, strategy, cfg, device, trainers_group)
        return None
    player = OnPolicyTrainer(
        run.replace(device=strategy.player_device),
        cfg,
        run_dir=run_dir,
        strategy=strategy,
        update_factory=lambda algo: PlayerAlgo(algo, strategy, world),
    )
    player_algo = player.algo
    assert isinstance(player_algo, PlayerAlgo)
    try:
        player.begin(resume_path)
        player.broadcast_state(DistributedSync(torch.device("cpu"), strategy.timeout_s))  # to the trainers
        player.train()
        player.extra_summary["player_wait_s"] = player_algo.wait_s
        summary = player.finish(time.perf_counter() - start)
    except BaseException:
        player.close()
        raise
    finally:
        try:
            player_algo.stop()
        except Exception:  # noqa: BLE001 - the trainers may already be gone; the launcher reports them
            pass
    return summary
