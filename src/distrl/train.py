"""The on-policy training loop: collect → update → log → evaluate → checkpoint.

One :class:`OnPolicyTrainer` per worker. Strategies differ only in the ``Sync`` they
pass in and in who is the main worker (the one that logs and writes checkpoints);
the loop, the algorithm and the collector are the same everywhere.
"""

from __future__ import annotations

import math
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

import distrl
from distrl import checkpoint
from distrl.algos.ppo import PPOAlgo
from distrl.config import ConfigError, PPOConfig, RunConfig, StrategyConfig, from_dict, to_dict
from distrl.data.normalize import ObsNormalizer, RewardScaler
from distrl.data.rollout import RolloutCollector
from distrl.envs import VecEnv, check_spaces, make_env, resolve_env_id
from distrl.evaluation import evaluate
from distrl.logs import RunLogger, write_json_atomic
from distrl.nets import ActorCritic
from distrl.protocols import Sync
from distrl.strategies.single import LocalSync

EVAL_SEED_OFFSET = 1_000_000


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("device='cuda' is not available on this machine: use --device cpu or auto")
    return torch.device(device)


def default_run_dir(run: RunConfig, env_id: str) -> Path:
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{run.algo}-{env_id.replace('/', '_')}-s{run.seed}-{stamp}"


def build_agent(cfg: PPOConfig, obs_dim: int, action_space: spaces.Space, device: torch.device, seed: int) -> ActorCritic:
    return ActorCritic(obs_dim, action_space, cfg.net_arch, cfg.activation, cfg.log_std_init,
                       cfg.ortho_init, device, seed)


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    assert isinstance(space, spaces.Box)
    return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "shape": list(space.shape)}


def space_from_json(data: dict[str, Any]) -> spaces.Space:
    if data["type"] == "Discrete":
        return spaces.Discrete(data["n"])
    return spaces.Box(np.array(data["low"], dtype=np.float32), np.array(data["high"], dtype=np.float32))


class OnPolicyTrainer:
    """Trains PPO on one worker's environments; the main worker logs and checkpoints."""

    def __init__(self, run: RunConfig, cfg: PPOConfig, sync: Sync | None = None,
                 run_dir: Path | None = None, log: bool = True, strategy: StrategyConfig | None = None,
                 requested: PPOConfig | None = None, device: torch.device | None = None):
        """
        Args:
            run, cfg: what to train; ``cfg`` is the config this worker runs (after scaling).
            sync: how updates agree with other workers (default: a single process).
            run_dir: where the main worker writes logs and checkpoints (None: nowhere).
            strategy: the strategy settings, recorded in config.json and checkpoints.
            requested: the PPO config as the user gave it, before ``--scaling``.
            device: overrides ``run.device`` (a ddp rank's own GPU).
        """
        self.run = run
        self.cfg = cfg
        self.sync = sync if sync is not None else LocalSync()
        self.strategy = strategy if strategy is not None else StrategyConfig()
        self.requested = requested if requested is not None else cfg
        self.is_main = self.sync.rank == 0
        self.device = device if device is not None else resolve_device(run.device)
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # tiny networks: a second thread only contends (PERFORMANCE.md)
        self.env_id = resolve_env_id(run.env)
        self.env = make_env(self.env_id, cfg.n_envs, run.vec)
        try:
            check_spaces("ppo", self.env, (spaces.Discrete, spaces.Box))
        except ConfigError:
            self.env.close()
            raise
        obs_shape = self.env.single_observation_space.shape
        self.agent = build_agent(cfg, int(np.prod(obs_shape)), self.env.single_action_space, self.device, run.seed)
        self.obs_normalizer = ObsNormalizer(obs_shape, cfg.normalize_obs, cfg.clip_obs)
        self.reward_scaler = RewardScaler(cfg.n_envs, cfg.gamma, cfg.normalize_reward)
        self.collector = RolloutCollector(self.env, self.agent, self.obs_normalizer, self.reward_scaler,
                                          cfg.n_steps, run.seed, env_offset=self.sync.rank * cfg.n_envs)
        self.algo = PPOAlgo(cfg, self.agent, run.seed)
        self.steps = 0
        self.iteration = 0
        self.episodes = 0
        self.policy_version = 0
        self.train_s = 0.0
        self.update_s = 0.0
        self.eval_s = 0.0
        self.last_eval: tuple[float, float] | None = None
        self.last_metrics: dict[str, float] = {}
        self._eval_steps = -1
        self.start_segment()
        self._eval_env: VecEnv | None = None
        self.run_dir = run_dir
        self.logger: RunLogger | None = None
        if self.is_main and log and run_dir is not None:
            self.logger = RunLogger(run_dir, self.env_id, run.total_steps, run.quiet)
            write_json_atomic(run_dir / "config.json", self.config_dict())

    @staticmethod
    def check_env(run: RunConfig, cfg: PPOConfig) -> None:
        """Fail now, in the launching process, if workers could not build this env."""
        env = make_env(run.env, 1, run.vec)
        try:
            check_spaces("ppo", env, (spaces.Discrete, spaces.Box))
        finally:
            env.close()

    # ---- the loop ----

    def train(self, total_steps: int | None = None, stop_at: int | None = None) -> dict[str, Any]:
        """Train until ``total_steps`` (schedules anneal over it); ``stop_at`` ends early, as an interruption would."""
        total = total_steps if total_steps is not None else self.run.total_steps
        limit = min(total, stop_at) if stop_at is not None else total
        preempt, min_steps = None, 0
        if self.strategy.sync_frac < 1.0 and self.sync.world_size > 1:
            needed = math.ceil(self.strategy.sync_frac * self.sync.world_size)
            preempt = lambda: self.sync.count_finished(self.iteration) >= needed  # noqa: E731
            min_steps = math.ceil(self.strategy.min_rollout_frac * self.cfg.n_steps)
        while self.steps < limit:
            start = time.perf_counter()
            rollout = self.collector.collect(self.policy_version, preempt, min_steps)
            if preempt is not None and rollout.collected_steps == self.cfg.n_steps:
                self.sync.mark_finished(self.iteration)
            batch = self.algo.prepare(rollout)
            totals = self._sum_over_workers(rollout, batch)
            self.steps += int(totals["steps"][0])
            self.episodes += int(totals["episodes"].sum())
            update_start = time.perf_counter()
            metrics = self.algo.update(batch, self.sync, progress_remaining=max(0.0, 1.0 - self.steps / total),
                                       advantage_moments=totals["advantages"])
            self.policy_version += 1
            self.iteration += 1
            now = time.perf_counter()
            self.train_s += now - start
            self.update_s += now - update_start
            metrics.update({"charts/samples": float(totals["samples"][0]), "charts/local_samples": float(rollout.valid.sum()),
                            "time/collect_s": rollout.collect_s,
                            "time/update_s": now - update_start, "time/collected_steps": float(rollout.collected_steps)})
            self.last_metrics = metrics
            self._log(rollout.episode_returns, rollout.episode_lengths, totals["episodes"], metrics)
            if self._crossed(self.run.eval_every) and self._evaluate_and_check_target():
                break
            if self._crossed(self.run.checkpoint_every) and self.steps < total:
                self.save_checkpoint()
        return self.summary()

    def _evaluate_and_check_target(self) -> bool:
        """Evaluate on the main worker; True (on every worker) once the target return is reached."""
        reached = 0.0
        if self.is_main:
            mean, _ = self.evaluate_now()
            reached = float(self.run.target_return is not None and mean >= self.run.target_return)
        return bool(self.sync.all_sum(np.array([reached]))[0] > 0)

    def _crossed(self, every: int) -> bool:
        """Whether the last iteration crossed a multiple of ``every`` steps."""
        if every <= 0:
            return False
        per_iteration = self.cfg.rollout_size * self.sync.world_size
        return self.steps // every > (self.steps - per_iteration) // every

    def _sum_over_workers(self, rollout: Any, batch: Any) -> dict[str, np.ndarray]:
        """One all-reduce per iteration for every count and statistic the workers must share.

        Steps, valid samples, per-worker episode counts, advantage moments and the
        normalisers' moments travel together; collectives cost about a millisecond each
        on small machines, so they are batched. Updates the normalisers.
        """
        episodes = np.zeros(self.sync.world_size)
        episodes[self.sync.rank] = len(rollout.episode_returns)
        parts = {"steps": np.array([rollout.steps]), "samples": np.array([rollout.valid.sum()]), "episodes": episodes,
                 "advantages": self.algo.advantage_moments(batch)}
        if self.cfg.normalize_obs:
            parts["obs"] = rollout.obs_moments
        if self.cfg.normalize_reward:
            parts["reward"] = self.reward_scaler.take_moments()
        summed = self.sync.all_sum(np.concatenate([np.asarray(v, dtype=np.float64) for v in parts.values()]))
        out, offset = {}, 0
        for name, value in parts.items():
            out[name] = summed[offset:offset + len(value)]
            offset += len(value)
        if "obs" in out:
            self.obs_normalizer.update(out["obs"])
        if "reward" in out:
            self.reward_scaler.update(out["reward"])
        return out

    def _log(self, returns: list[float], lengths: list[int], counts: np.ndarray, metrics: dict[str, float]) -> None:
        """Log this iteration; every worker's finished episodes go to the main worker's monitor files."""
        local = np.stack([np.asarray(returns, np.float64), np.asarray(lengths, np.float64)], 1)
        episodes = self.sync.gather(local, counts.astype(int).tolist()) if counts.sum() else [local[:0]] * len(counts)
        if self.logger is None:
            return
        sps = self.steps / max(self.train_s, 1e-9)
        metrics["charts/SPS"] = sps
        for rank, part in enumerate(episodes):
            self.logger.episodes(part[:, 0].tolist(), part[:, 1].astype(int).tolist(), self.steps,
                                 rank if self.sync.world_size > 1 else None)
        self.logger.scalars(metrics, self.steps, every_s=0.2)  # many short iterations: about 5 points a second
        self.logger.console.update(self.steps, sps, self.logger.mean_return)

    def evaluate_now(self) -> tuple[float, float]:
        """Deterministic evaluation over ``eval_episodes`` episodes; returns (mean, std)."""
        start = time.perf_counter()
        if self._eval_env is None:
            self._eval_env = make_env(self.env_id, self.run.eval_episodes, self.run.vec)
        returns = evaluate(self.agent, self.obs_normalizer, self._eval_env, self.run.seed + EVAL_SEED_OFFSET)
        self.last_eval = (float(returns.mean()), float(returns.std()))
        self._eval_steps = self.steps
        self.eval_s += time.perf_counter() - start
        if self.logger is not None:
            self.logger.scalars({"eval/mean_return": self.last_eval[0], "eval/std_return": self.last_eval[1]}, self.steps)
            self.logger.console.line(f"eval at {self.steps:,} steps: {self.last_eval[0]:.1f} ± {self.last_eval[1]:.1f}")
        return self.last_eval

    def summary(self) -> dict[str, Any]:
        mean_return = self.logger.mean_return if self.logger is not None else None
        return {
            "algo": self.run.algo, "env": self.env_id, "strategy": self.strategy.strategy,
            "workers": self.sync.world_size, "total_steps": self.steps, "iterations": self.iteration,
            "episodes": self.episodes, "train_s": self.train_s, "eval_s": self.eval_s,
            "update_s": self.update_s, "sync_s": getattr(self.sync, "sync_s", 0.0),
            "sps": self.steps / max(self.train_s, 1e-9), "final_mean_return": mean_return,
            "final_eval_mean_return": self.last_eval[0] if self.last_eval else None,
            "final_eval_std_return": self.last_eval[1] if self.last_eval else None,
            "distrl_version": distrl.__version__,
        }

    def finish(self, wall_s: float) -> dict[str, Any]:
        """Final evaluation, model and summary.json (main worker), then close."""
        if self.is_main and self._eval_steps != self.steps:
            self.evaluate_now()
        summary = {**self.summary(), "wall_s": wall_s}
        if self.is_main and self.run_dir is not None:
            self.save_checkpoint(self.run_dir / checkpoint.MODEL_DIR)
            write_json_atomic(self.run_dir / "summary.json", summary)
            if self.logger is not None:
                ret = summary["final_eval_mean_return"]
                self.logger.console.line(f"done: {self.steps:,} steps in {summary['train_s']:.1f}s "
                                         f"({summary['sps']:,.0f} SPS), eval return {ret:.1f}, run dir {self.run_dir}")
        self.close()
        return summary

    def close(self) -> None:
        self.env.close()
        if self._eval_env is not None:
            self._eval_env.close()
        if self.logger is not None:
            self.logger.close()

    # ---- checkpoints ----

    def config_dict(self) -> dict[str, Any]:
        return {"run": to_dict(self.run.replace(env=self.env_id)), "strategy": to_dict(self.strategy),
                "ppo": to_dict(self.requested), "ppo_effective": to_dict(self.cfg)}

    def checkpoint_contents(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        tensors = {f"params/{k}": v for k, v in self.agent.params.state_dict().items()}
        tensors.update({f"optim/{k}": v for k, v in self.algo.state_dict().items()})
        for prefix, stats in (("obs_norm", self.obs_normalizer.stats), ("reward_norm", self.reward_scaler.stats)):
            tensors.update({f"{prefix}/{k}": torch.from_numpy(np.atleast_1d(v)) for k, v in stats.state().items()})
        state = {
            "algo": "ppo", "env_id": self.env_id, "config": self.config_dict(),
            "steps": self.steps, "iteration": self.iteration, "episodes": self.episodes,
            "policy_version": self.policy_version, "train_s": self.train_s,
            "observation_dim": self.agent.obs_dim, "action_space": space_to_json(self.env.single_action_space),
            "distrl_version": distrl.__version__,
        }
        return tensors, state

    def save_checkpoint(self, path: Path | None = None) -> Path | None:
        """Write a checkpoint (main worker); a periodic one (no ``path``) also starts a new segment.

        Each periodic checkpoint is an episode boundary: every worker restarts its
        environments and random streams from seeds derived from the step count (see
        :meth:`start_segment`), so a run resumed from it continues exactly as the
        uninterrupted run does.
        """
        written = None
        if self.is_main and (path is not None or self.run_dir is not None):
            target = path or self.run_dir / checkpoint.CHECKPOINTS_DIR / f"step-{self.steps:012d}"  # type: ignore[operator]
            tensors, state = self.checkpoint_contents()
            written = checkpoint.save(target, tensors, state)
        if path is None:
            self.start_segment()
        return written

    def start_segment(self) -> None:
        """Restart environments, sampling noise and minibatch shuffling from seeds derived from the step count."""
        self.collector.reset(self.run.seed, self.steps)
        self.algo.reseed(self.run.seed, self.sync.rank, self.steps)

    def broadcast_state(self) -> None:
        """Make every worker hold the main worker's parameters, optimizer state, statistics and counters."""
        sync = self.sync
        for tensor in (self.agent.params.data, self.algo.optimizer.exp_avg, self.algo.optimizer.exp_avg_sq):
            sync.broadcast_(tensor)
        stats = [self.obs_normalizer.stats, self.reward_scaler.stats]
        packed = np.concatenate([np.concatenate([s.mean.ravel(), s.var.ravel(), [s.count]]) for s in stats])
        counters = np.array([self.steps, self.iteration, self.episodes, self.policy_version,
                             self.algo.optimizer.steps, self.train_s], dtype=np.float64)
        flat = torch.from_numpy(np.concatenate([packed, counters]))
        sync.broadcast_(flat)
        values = flat.numpy()
        offset = 0
        for s in stats:
            size = s.mean.size
            s.load({"mean": values[offset:offset + size], "var": values[offset + size:offset + 2 * size],
                    "count": values[offset + 2 * size]})
            offset += 2 * size + 1
        self.obs_normalizer.refresh()
        steps, iteration, episodes, version, adam_steps, train_s = values[offset:]
        self.steps, self.iteration, self.episodes = int(steps), int(iteration), int(episodes)
        self.policy_version, self.algo.optimizer.steps, self.train_s = int(version), int(adam_steps), float(train_s)
        self.agent.refresh_acting_copy()
        self.start_segment()

    def load_checkpoint(self, path: Path) -> None:
        tensors, state = checkpoint.load(path)
        if state.get("algo") != "ppo":
            raise ConfigError(f"checkpoint={str(path)!r} holds a {state.get('algo')!r} model, not ppo")
        try:
            self.agent.params.load_state_dict({k[7:]: v for k, v in tensors.items() if k.startswith("params/")})
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"checkpoint={str(path)!r} does not fit this network: {exc}") from None
        self.agent.refresh_acting_copy()
        self.algo.load_state_dict({k[6:]: v for k, v in tensors.items() if k.startswith("optim/")})
        for prefix, stats in (("obs_norm", self.obs_normalizer.stats), ("reward_norm", self.reward_scaler.stats)):
            stats.load({k.split("/", 1)[1]: v.numpy() for k, v in tensors.items() if k.startswith(prefix + "/")})
        self.obs_normalizer.refresh()
        self.steps, self.iteration = state["steps"], state["iteration"]
        self.episodes, self.policy_version = state["episodes"], state["policy_version"]
        self.train_s = state.get("train_s", 0.0)
        self.start_segment()


def configs_from_checkpoint(path: Path) -> tuple[RunConfig, StrategyConfig, PPOConfig, dict[str, Any]]:
    """The run, strategy and (requested) PPO configs stored in a checkpoint, and its JSON state."""
    _, state = checkpoint.load(path)
    config = state["config"]
    return (from_dict(RunConfig, config["run"]), from_dict(StrategyConfig, config["strategy"]),
            from_dict(PPOConfig, config["ppo"]), state)
