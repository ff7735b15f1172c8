"""The offline loop (BC, TD3+BC, IQL, CQL): draw a batch from the dataset → one gradient step → log → evaluate →
checkpoint. No environment step is taken but the evaluation's: ``steps`` counts gradient steps.

Online (``--init-from`` an offline run, or ``td3``): the loop steps the env with the policy's exploration, keeps
what it sees in a replay buffer (with ``--keep-dataset``, after the dataset's transitions) and takes one gradient
step per environment step on a batch drawn from it; ``steps`` then counts environment steps. One process only.

Each worker loads its shard of the dataset's episodes (:meth:`~distrl.data.offline.OfflineData.load`) when
training starts, not before: a model loaded to be evaluated or exported needs no dataset. Every worker draws the
same global batch (:class:`~distrl.data.offline.GlobalSampler`) and trains on the part it holds, so a ddp run
takes the steps one process would. Observations are standardised by the dataset's statistics where the config
says so (kept in checkpoints, for evaluation); Box actions are rescaled to [-1, 1].
"""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from distrl.algos.offline import make_offline_algo
from distrl.algos.protocols import Sync
from distrl.config import OFFLINE_CONFIGS, ConfigError, OfflineConfig, RunConfig, StrategyConfig
from distrl.data.minari_store import check_spaces, open_dataset
from distrl.data.offline import GlobalSampler, OfflineData
from distrl.data.replay import ReplayBuffer, Transitions
from distrl.envs.names import shown_name
from distrl.envs.spaces import from_bounds, to_bounds
from distrl.training.common import TrainerBase
from distrl.training.init_from import check_goes_on_from, read_run
from distrl.training.off_policy import REPLAY_FILE
from distrl.training.state import section

OBS_STD_FLOOR = 1e-3
"""Added to the dataset's standard deviation of each observation dimension (TD3+BC's)."""
CONTINUOUS_ONLY = ("td3bc", "iql", "td3")
"""The algorithms of this family whose policies act in Box spaces only."""


class OfflineTrainer(TrainerBase):
    """Trains an offline algorithm (``run.algo``: bc, td3bc, iql or cql) on a Minari dataset; the main worker logs,
    evaluates in the env and checkpoints."""

    algo_name = "bc"

    def __init__(
        self,
        run: RunConfig,
        cfg: OfflineConfig,
        sync: Sync | None = None,
        run_dir: Path | None = None,
        log: bool = True,
        strategy: StrategyConfig | None = None,
        requested: OfflineConfig | None = None,
        device: torch.device | None = None,
    ):
        if run.algo in OFFLINE_CONFIGS:
            self.algo_name = run.algo
        super().__init__(run, cfg, sync, run_dir, log, strategy, requested, device)
        space = self.env.single_action_space
        self.discrete = isinstance(space, spaces.Discrete)
        actions = int(space.n) if isinstance(space, spaces.Discrete) else int(np.prod(space.shape))
        if isinstance(space, spaces.Box):
            self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
            self._bounds = (torch.from_numpy(self.low).to(self.device), torch.from_numpy(self.high).to(self.device))
        self.algo = make_offline_algo(
            self.algo_name, cfg, self.obs_dim, actions, self.discrete, self.device, run.seed, run.precision
        )
        self.obs_mean = torch.zeros(self.obs_dim, dtype=torch.float32, device=self.device)
        self.obs_std = torch.ones(self.obs_dim, dtype=torch.float32, device=self.device)
        self.data: OfflineData | None = None
        self._on_disk: Path | None = None
        self.replay: ReplayBuffer | None = None
        try:
            if cfg.online and self.sync.world_size > 1:
                raise ConfigError(
                    f"strategy={self.strategy.strategy!r} is not available online: {run.algo} online runs in one process"
                )
            if cfg.init_from:
                self._go_on_from(Path(cfg.init_from))
        except BaseException:
            self.close()
            raise
        self.start_segment()

    @classmethod
    def check_spaces(cls, env_id: str, observation_space: Any, action_space: Any, cfg: Any) -> None:
        name = shown_name(env_id)
        if not isinstance(observation_space, spaces.Box) or len(observation_space.shape) != 1:
            raise ConfigError(
                f"env={name!r} has {observation_space} observations; the offline algorithms take flat Box vectors"
            )
        if not isinstance(action_space, (spaces.Box, spaces.Discrete)):
            raise ConfigError(
                f"env={name!r} has a {type(action_space).__name__} action space; offline needs Box or Discrete"
            )
        if not cfg.dataset and (not cfg.online or cfg.keep_dataset):
            raise ConfigError("dataset='' is not allowed: name a Minari dataset, --dataset ID (or a dataset's path)")
        if cfg.online and not isinstance(action_space, spaces.Box):
            raise ConfigError(f"env={name!r} has a Discrete action space; online fine-tuning needs Box")

    @classmethod
    def check_env(cls, run: RunConfig, cfg: Any) -> None:
        """The env and the dataset, before any run directory is made: the dataset opens from local storage and
        its spaces are the env's."""
        super().check_env(run, cfg)
        from distrl.envs.vector import make_run_env

        env = make_run_env(run, 1)
        try:
            if run.algo in CONTINUOUS_ONLY and not isinstance(env.single_action_space, spaces.Box):
                raise ConfigError(
                    f"env={shown_name(env.env_id)!r} has a {type(env.single_action_space).__name__} action space; "
                    f"{run.algo} needs Box (bc clones Discrete actions too)"
                )
            if cfg.dataset:
                dataset = open_dataset(cfg.dataset, cfg.datasets_dir or None)
                check_spaces(dataset, env.single_observation_space, env.single_action_space, env.env_id)
            if cfg.init_from:
                check_goes_on_from(run.algo, cfg.init_from, read_run(cfg.init_from)[1])
        finally:
            env.close()

    def _go_on_from(self, path: Path) -> None:
        """The offline run's networks, their optimizers and its observation statistics; the step count starts
        at 0 (the online run's)."""
        tensors, state = read_run(str(path))
        check_goes_on_from(self.algo_name, str(path), state)
        try:
            self.load_state_tensors(tensors, path)
        except (KeyError, ValueError, RuntimeError) as exc:
            raise ConfigError(
                f"init_from={str(path)!r} does not fit this run's networks (--net-arch?): {exc}"
            ) from None
        self.report(f"went on from {path}: its networks and observation statistics, online now")

    # ---- the loop ----

    def _load_data(self) -> OfflineData:
        """This worker's shard of the dataset, and with ``normalize_obs`` the whole dataset's statistics (summed
        over every worker's shard); once, when training starts."""
        if self.data is None:
            cfg = self.cfg
            dataset = open_dataset(cfg.dataset, cfg.datasets_dir or None)
            check_spaces(dataset, self.env.single_observation_space, self.env.single_action_space, self.env_id)
            chunk = cfg.episodes_per_chunk or None
            self.data = OfflineData.load(dataset, self.sync.rank, self.sync.world_size, chunk, self._dataset_folder())
            if cfg.normalize_obs:
                total = self.sync.all_sum(self.data.moments())
                count = max(total[0], 1.0)
                mean = total[1 : 1 + self.obs_dim] / count
                var = np.maximum(total[1 + self.obs_dim :] / count - mean**2, 0.0)
                self.obs_mean.copy_(torch.from_numpy(mean))
                self.obs_std.copy_(torch.from_numpy(np.sqrt(var) + OBS_STD_FLOOR))
        return self.data

    def _dataset_folder(self) -> Path | None:
        """With ``dataset_on_disk``, where this worker's decoded shard goes: beside the run's checkpoints (or in a
        temporary folder for a run without a directory), removed by :meth:`release`."""
        if not self.cfg.dataset_on_disk:
            return None
        if self.run_dir is not None:
            self._on_disk = self.run_dir / f".dataset-rank{self.sync.rank}"
            shutil.rmtree(self._on_disk, ignore_errors=True)  # a stopped run's, decoded again
        else:
            self._on_disk = Path(tempfile.mkdtemp(prefix="distrl-dataset-"))
        return self._on_disk

    def release(self) -> None:
        super().release()
        self.data = None  # the maps close with the arrays
        if getattr(self, "_on_disk", None) is not None:
            shutil.rmtree(self._on_disk, ignore_errors=True)
            self._on_disk = None

    def train(self, total_steps: int | None = None, stop_at: int | None = None) -> dict[str, Any]:
        total = total_steps if total_steps is not None else self.run.total_steps
        limit = min(total, stop_at) if stop_at is not None else total
        if self.cfg.online:
            return self._train_online(total, limit)
        data = self._load_data()
        while self.steps < limit:
            start = time.perf_counter()
            batch, size = self.sampler.batch(data, self.cfg.batch_size, self.device)
            metrics = self.algo.update(self._prepared(batch), self.sync, size)
            self.steps += 1
            episodes, votes = self.count_episodes(0)
            self._end_iteration(start, start)
            self._log([], [], episodes, metrics)
            if self.end_of_iteration(1, votes, self.steps < total):
                break
        return self.summary()

    def _train_online(self, total: int, limit: int) -> dict[str, Any]:
        cfg = self.cfg
        replay = self._online_replay()
        starts = getattr(cfg, "learning_starts", 0) if not cfg.init_from else 0
        n = cfg.n_envs
        while self.steps < limit:
            start = time.perf_counter()
            if self.steps < starts:
                actions = self.noise_rng.uniform(-1.0, 1.0, (n, *self.low.shape)).astype(np.float32)
            else:
                noise = torch.from_numpy(self.noise_rng.standard_normal((n, *self.low.shape), dtype=np.float32))
                obs = self._normalized(torch.as_tensor(self.obs, device=self.device))
                actions = self.algo.explore(obs, noise.to(self.device)).cpu().numpy()
            step = self.env.step(self.to_env(actions))
            next_obs = step.obs.astype(self.obs_dtype)
            replay.add(self.obs, actions, step.reward, next_obs, step.terminated.astype(np.float32), step.valid)
            self.obs = next_obs
            self.steps += n
            episodes, votes = self.count_episodes(len(step.episode_returns))
            update_start = time.perf_counter()
            metrics: dict[str, float] = {}
            if self.steps >= starts:
                batch = replay.sample(cfg.batch_size, self.sample_rng, self.device)
                metrics = self.algo.update(
                    self._prepared(dataclasses.replace(batch, rows=None), scaled=True), self.sync, cfg.batch_size
                )
            self._end_iteration(start, update_start, updated=bool(metrics))
            self._log(step.episode_returns.tolist(), step.episode_lengths.tolist(), episodes, metrics)
            if self.end_of_iteration(n, votes, self.steps < total):
                break
        return self.summary()

    def _online_replay(self) -> ReplayBuffer:
        """The online run's replay: with ``keep_dataset``, the dataset's transitions first (Box actions in [-1, 1])."""
        if self.replay is None:
            cfg = self.cfg
            self.replay = self._empty_replay()
            if cfg.keep_dataset:
                data = self._load_data()
                every = np.ones(data.size, dtype=bool)
                scaled = from_bounds(data.actions, self.low, self.high)
                self.replay.add(data.obs, scaled, data.rewards, data.next_obs, data.terminated, every)
        return self.replay

    def _empty_replay(self) -> ReplayBuffer:
        return ReplayBuffer(self.cfg.buffer_size, self.obs_shape, self.low.shape, self.obs_dtype)

    def after_checkpoint(self, path: Path) -> None:
        if self.cfg.online and self.cfg.save_replay and self.replay is not None:
            self.replay.save(path / REPLAY_FILE)

    def to_env(self, actions: np.ndarray) -> np.ndarray:
        """Actions in [-1, 1] in the env's bounds."""
        return to_bounds(actions, self.low, self.high)

    def _scaled(self, actions: torch.Tensor) -> torch.Tensor:
        """Box actions in the env's bounds in [-1, 1] (the inverse of :meth:`to_env`)."""
        low, high = self._bounds
        return (2.0 * (actions.to(self.device, torch.float32) - low) / (high - low) - 1.0).clamp(-1.0, 1.0)

    def _prepared(self, batch: Transitions, scaled: bool = False) -> Transitions:
        """Observations as the networks see them (standardised), Box actions in [-1, 1] (``scaled``: already)."""
        actions = batch.actions
        if not self.discrete and not scaled:
            actions = self._scaled(actions)
        return dataclasses.replace(
            batch,
            obs=self._normalized(batch.obs),
            next_obs=self._normalized(batch.next_obs),
            actions=actions,
        )

    def _normalized(self, obs: torch.Tensor) -> torch.Tensor:
        obs = obs.reshape(obs.shape[0], -1).float()
        return (obs - self.obs_mean) / self.obs_std if self.cfg.normalize_obs else obs

    def act_for_eval(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return self.actions(obs)

    def actions(self, obs: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        """The policy's actions for env observations, in the env's terms: its mode's, or with ``noise`` a draw of
        it (``algo.sampling`` says which noise)."""
        x = self._normalized(torch.as_tensor(obs, device=self.device))
        if noise is None:
            actions = self.algo.act(x)
        else:
            actions = self.algo.sample(x, torch.as_tensor(noise, device=self.device))
        actions = actions.cpu().numpy()
        return actions if self.discrete else self.to_env(actions)

    def start_segment(self) -> None:
        """Batches and in-step noise from streams keyed by (seed, step count): a resumed run draws what it would
        have drawn."""
        self.sampler = GlobalSampler(self.run.seed, self.steps)
        self.algo.reseed(self.run.seed, self.steps)
        if self.cfg.online:  # the env restarts too, and the exploration's and the replay's streams
            self.obs = self.env.reset(seed=self.run.seed + self.steps).astype(self.obs_dtype)
            self.noise_rng = np.random.default_rng([self.run.seed, self.steps, 1])
            self.sample_rng = np.random.default_rng([self.run.seed, self.steps, 2])

    # ---- state ----

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"algo/{k}": v for k, v in self.algo.state_tensors().items()}
        tensors["obs_norm/mean"] = self.obs_mean.cpu().clone()
        tensors["obs_norm/std"] = self.obs_std.cpu().clone()
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        self.algo.load_state_tensors(section(tensors, "algo"))
        stats = section(tensors, "obs_norm")
        self.obs_mean.copy_(stats["mean"])
        self.obs_std.copy_(stats["std"])
        if self.cfg.online and self.cfg.save_replay and (path / REPLAY_FILE).exists():  # a resumed online run's
            self.replay = self._empty_replay()
            self.replay.load(path / REPLAY_FILE)

    def broadcast_tensors(self) -> list[torch.Tensor]:
        return self.algo.broadcast_tensors()

    def after_broadcast(self, tensors: list[torch.Tensor]) -> None:
        self.algo.after_broadcast(tensors[-1])
