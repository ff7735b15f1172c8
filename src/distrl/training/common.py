"""What every training loop shares: placement, logging, evaluation (checkpoints: ``state.py``).

A trainer runs on one worker. Strategies differ only in the ``Sync`` they pass in
and in which worker is the main one (it logs and writes checkpoints); the loop, the
algorithm and the collector are the same everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

import distrl
from distrl import checkpoint
from distrl.data.collector import Collector
from distrl.config import ConfigError, RunConfig, StrategyConfig
from distrl.envs import VecEnv, make_run_env
from distrl.env_names import resolve_env_id
from distrl.evaluation import evaluate
from distrl.logs import Console, RunLogger, write_json_atomic
from distrl.nets.agent import Agent
from distrl.nets.recurrent import StatefulPolicy
from distrl.protocols import LocalSync, Sync
from distrl.spaces import DictLayout, stored_layout
from distrl.training.state import RunState, resumed_line

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


def set_cpu_options(run: RunConfig) -> None:
    """This process's torch CPU settings for a run: intra-op threads and subnormal flushing."""
    torch.set_num_threads(run.threads)  # default 1: for small networks a second thread only contends
    torch.set_flush_denormal(run.flush_denormal)


def init_worker(trainer: Any, run: RunConfig, cfg: Any, sync: Sync | None, strategy: StrategyConfig | None,
                requested: Any, device: torch.device | None) -> None:
    """Give a trainer what every worker has: run and algorithm configs, its sync (``LocalSync`` alone), the
    strategy, the config as the user asked for it (before scaling), whether it is rank 0, and its device."""
    trainer.run, trainer.cfg = run, cfg
    trainer.sync = sync if sync is not None else LocalSync()
    trainer.strategy = strategy if strategy is not None else StrategyConfig()
    trainer.requested = requested if requested is not None else cfg
    trainer.is_main = trainer.sync.rank == 0
    trainer.device = device if device is not None else resolve_device(run.device)
    if trainer.device.type == "cpu":
        set_cpu_options(run)


class TrainerBase(RunState):
    """Placement, logging and evaluation around an algorithm's loop; checkpoints and broadcast from RunState.

    Subclasses build their algorithm and collector in ``__init__`` and implement
    ``train``, ``act_for_eval``, ``state_tensors``/``load_state_tensors`` and ``start_segment``.
    """

    algo_name = ""
    counts_iterations = False
    collector: Collector | None = None
    """What collects this trainer's experience, where it has one (SAC steps its environments itself)."""
    """Whether --iterations bounds this trainer's runs (else it trains for total_steps)."""

    def __init__(self, run: RunConfig, cfg: Any, sync: Sync | None, run_dir: Path | None, log: bool,
                 strategy: StrategyConfig | None, requested: Any, device: torch.device | None):
        init_worker(self, run, cfg, sync, strategy, requested, device)
        self.env_id = resolve_env_id(run.env)
        self.env = make_run_env(run, cfg.n_envs, self.env_id)
        try:
            self.check_spaces(self.env_id, self.env.single_observation_space, self.env.single_action_space, cfg)
        except ConfigError:
            self.env.close()
            raise
        self.obs_shape, self.obs_dtype = stored_layout(self.env.single_observation_space)
        self.obs_dim = int(np.prod(self.obs_shape))
        self.steps = 0
        self.iteration = 0
        self.episodes = 0
        self.policy_version = 0
        self.train_s = 0.0
        self.update_s = 0.0
        self.eval_s = 0.0
        self.wall_before = 0.0
        """Wall time of the earlier processes of a resumed run, up to its checkpoint."""
        self._created = time.perf_counter()
        self.last_eval: tuple[float, float] | None = None
        self.last_metrics: dict[str, float] = {}
        self.events: list[str] = []
        self.extra_summary: dict[str, Any] = {}
        """Figures a strategy adds to summary.json (ddp: the replicas' final parameter checksums)."""
        self._eval_steps = -1
        self._eval_env: VecEnv | None = None
        self._eval_policy: StatefulPolicy | None = None
        self.run_dir = run_dir
        self.logger: RunLogger | None = None
        self.console: Console | None = None
        """Progress and events on the terminal: a run directory's main worker has one; the API's
        ``learn(progress_bar=True)`` lends one for its call."""
        self._console_return: float | None = None
        self.stop_when: Callable[[int, float], bool] | None = None
        """Called on the main worker with (steps, mean return) after each periodic evaluation (--eval-every);
        True ends the run there, as a reached --target-return does (a tuning study prunes trials with it)."""
        if run.iterations and not self.counts_iterations:
            raise ConfigError(f"iterations={run.iterations} is not allowed for {self.algo_name}: must be 0, "
                              f"{self.algo_name} trains for --total-steps (iterations bound REINFORCE's runs)")
        if self.is_main and log and run_dir is not None:
            self.console = Console(*self.progress_bound(), quiet=run.quiet)
            try:
                self.logger = RunLogger.start(run_dir, self.env_id, self.config_dict(), run.track, run.track_project)
            except BaseException:
                self.close()
                raise

    @classmethod
    def check_env(cls, run: RunConfig, cfg: Any) -> None:
        """Fail now, in the launching process, if workers could not build this env or its agent."""
        env = make_run_env(run, 1)
        try:
            cls.check_spaces(env.env_id, env.single_observation_space, env.single_action_space, cfg)
        finally:
            env.close()

    @classmethod
    def check_spaces(cls, env_id: str, observation_space: spaces.Space, action_space: spaces.Space, cfg: Any) -> None:
        """Fail early, with a one-line ConfigError, when this algorithm cannot act in these spaces."""
        raise NotImplementedError

    def stored_batch(self, obs: Any) -> tuple[np.ndarray, bool]:
        """Observations as the env gives them (one, or a batch) as a stored batch; True if it was one."""
        space = self.env.single_observation_space
        if isinstance(space, spaces.Dict):
            first = next(iter(space.spaces))
            single = np.ndim(obs[first]) == len(stored_layout(space[first])[0])
            rows = DictLayout(space).pack({k: np.asarray(v)[None] if single else v for k, v in obs.items()})
            return rows, single
        batch = np.asarray(obs).astype(self.obs_dtype, copy=False)
        single = batch.ndim == len(self.obs_shape)
        return (batch[None] if single else batch), single

    # ---- hooks for subclasses ----

    def train(self, total_steps: int | None = None, stop_at: int | None = None) -> dict[str, Any]:
        raise NotImplementedError

    def policy_obs(self, obs: np.ndarray) -> np.ndarray:
        """Observations [B, ...] as the policy sees them (normalised, where the run normalises them)."""
        return obs

    def act_for_eval(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """Deterministic env actions for raw observations [B, ...]; ``starts`` [B] marks the observations
        that begin an episode (a recurrent policy restarts its state there)."""
        raise NotImplementedError

    def greedy_actions(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        """The policy's deterministic actions (before ``env_action``), carrying a recurrent policy's state
        from call to call (for evaluation, which begins every episode with ``starts``)."""
        agent: Agent = self.agent  # type: ignore[attr-defined]
        if not agent.recurrent:
            return agent.act(obs, None)
        if self._eval_policy is None or self._eval_policy.n_envs != len(obs):
            self._eval_policy = StatefulPolicy(agent, len(obs))
        return self._eval_policy(obs, starts)

    # ---- shared loop pieces ----

    def run_to_end(self, resume_path: Path | None, start: float) -> dict[str, Any]:
        """Resume if asked, train to the configured end, then finish (final eval, model, summary)."""
        try:
            self.begin(resume_path)
            self.train()
        except BaseException:
            self.close()
            raise
        return self.finish(time.perf_counter() - start)

    def begin(self, resume_path: Path | None) -> None:
        """Load the checkpoint to resume from and say so, or clear the episodes an unfinished earlier start
        left in the run directory (killed before its first checkpoint). On the main worker only."""
        if resume_path is not None:
            self.load_checkpoint(resume_path)
            self.report(resumed_line(f"step {self.steps:,}", resume_path))
        elif self.logger is not None:
            self.logger.start_afresh()

    def _end_iteration(self, start: float, update_start: float, updated: bool = True) -> float:
        """Count an iteration (and its update, if there was one) and its time; returns the current time."""
        self.policy_version += int(updated)
        self.iteration += 1
        now = time.perf_counter()
        self.train_s += now - start
        self.update_s += now - update_start
        return now

    def _crossed(self, every: int, per_iteration: int) -> bool:
        """Whether the last iteration (``per_iteration`` steps) crossed a multiple of ``every`` steps."""
        if every <= 0:
            return False
        return self.steps // every > (self.steps - per_iteration) // every

    def _evaluate_and_check_target(self) -> bool:
        """Evaluate on the main worker; True (on every worker) once the target return is reached."""
        reached = 0.0
        if self.is_main:
            mean, _ = self.evaluate_now()
            reached = float(self.run.target_return is not None and mean >= self.run.target_return)
            if self.stop_when is not None and self.stop_when(self.steps, mean):
                reached = 1.0
        return bool(self.sync.all_sum(np.array([reached]))[0] > 0)

    def _log(self, returns: list[float], lengths: list[int], counts: np.ndarray, metrics: dict[str, float]) -> None:
        """Log this iteration; every worker's finished episodes go to the main worker's monitor files."""
        self.last_metrics = metrics
        local = np.stack([np.asarray(returns, np.float64), np.asarray(lengths, np.float64)], 1)
        episodes = self.sync.gather(local, counts.astype(int).tolist()) if counts.sum() else [local[:0]] * len(counts)
        sps = self.steps / max(self.train_s, 1e-9)
        if self.logger is not None:
            metrics["charts/SPS"] = sps
            for rank, part in enumerate(episodes):
                self.logger.episodes(part[:, 0].tolist(), part[:, 1].astype(int).tolist(), self.steps,
                                     rank if self.sync.world_size > 1 else None)
            self.logger.scalars(metrics, self.steps, every_s=0.2)  # many short iterations: about 5 points a second
        if self.console is not None:
            if self.logger is not None:
                self._console_return = self.logger.mean_return
            elif sum(len(part) for part in episodes):  # no run directory: this iteration's episodes
                self._console_return = float(np.concatenate([part[:, 0] for part in episodes]).mean())
            self.console.update(self.progress_done(), sps, self._console_return)

    def progress_bound(self, total_steps: int | None = None) -> tuple[int, str]:
        """What bounds the run, as the progress display counts it: (total, unit)."""
        if self.run.iterations:
            return self.run.iterations, "iterations"
        return (total_steps if total_steps is not None else self.run.total_steps), "steps"

    def progress_done(self) -> int:
        return self.iteration if self.run.iterations else self.steps

    def report(self, message: str) -> None:
        """An event worth a line: on the console, in ``events.log`` and in summary.json."""
        stamped = f"{time.strftime('%Y-%m-%d %H:%M:%S')} {message}"
        self.events.append(stamped)
        if self.console is not None:
            self.console.line(message)
        if self.logger is not None:
            with (self.logger.run_dir / "events.log").open("a") as f:
                f.write(stamped + "\n")

    def evaluate_now(self) -> tuple[float, float]:
        """Deterministic evaluation over ``eval_episodes`` episodes; returns (mean, std)."""
        start = time.perf_counter()
        if self._eval_env is None:
            self._eval_env = make_run_env(self.run, self.run.eval_episodes, self.env_id, evaluation=True)
        returns = evaluate(self.act_for_eval, self._eval_env, self.run.seed + EVAL_SEED_OFFSET)
        self.last_eval = (float(returns.mean()), float(returns.std()))
        self._eval_steps = self.steps
        self.eval_s += time.perf_counter() - start
        if self.logger is not None:
            self.logger.scalars({"eval/mean_return": self.last_eval[0], "eval/std_return": self.last_eval[1]}, self.steps)
        if self.console is not None:
            self.console.line(f"eval at {self.steps:,} steps: {self.last_eval[0]:.1f} ± {self.last_eval[1]:.1f}")
        return self.last_eval

    def summary(self) -> dict[str, Any]:
        mean_return = self.logger.mean_return if self.logger is not None else None
        return {
            "algo": self.run.algo, "env": self.env_id, "strategy": self.strategy.strategy,
            "workers": self.strategy.workers if self.strategy.strategy != "single" else 1,
            "total_steps": self.steps, "iterations": self.iteration,
            "episodes": self.episodes, "train_s": self.train_s, "eval_s": self.eval_s,
            "update_s": self.update_s, "sync_s": self.sync.sync_s,
            "sps": self.steps / max(self.train_s, 1e-9), "final_mean_return": mean_return,
            "final_eval_mean_return": self.last_eval[0] if self.last_eval else None,
            "final_eval_std_return": self.last_eval[1] if self.last_eval else None,
            "events": self.events, "distrl_version": distrl.__version__,
            **self.extra_summary,
            **(self.collector.summary() if self.collector is not None else {}),
        }

    def finish(self, wall_s: float) -> dict[str, Any]:
        """Final evaluation, model and summary.json (main worker), then close; ``wall_s`` is this
        process's time, to which a resumed run adds its earlier processes' (``wall_before``)."""
        if self.is_main and self._eval_steps != self.steps:
            self.evaluate_now()
        if self.collector is not None:  # a pipeline drains its generators and reports its counters
            self.extra_summary.update(self.collector.finish())
        summary = {**self.summary(), "wall_s": self.wall_before + wall_s}
        if self.run_dir is not None and (self.is_main or self.keeps_worker_state):
            self.save_checkpoint(self.run_dir / checkpoint.MODEL_DIR)
        if self.is_main and self.run_dir is not None:
            if self.logger is not None:
                self.logger.summary(summary)
            else:
                write_json_atomic(self.run_dir / "summary.json", summary)
            if self.run.plot:
                from distrl.plots import reward_curves

                if self.logger is not None:
                    self.logger.monitor.file.flush()
                reward_curves([self.run_dir], "total-steps", k=10, out=self.run_dir / "reward_curve.png",
                              title=f"{self.algo_name.upper()} {self.env_id}")
            if self.console is not None:
                self.console.close(self.progress_done())  # the bar ends on the real count, above the summary
                self.console.line(self.end_line(summary))
        self.close()
        return summary

    def end_line(self, summary: dict[str, Any]) -> str:
        """The one line a finished run prints: what it did, its times (labelled), the evaluation."""
        done = [f"{self.steps:,} steps", f"{self.episodes:,} episodes"]
        if self.run.iterations:
            done.insert(0, f"{self.iteration:,} iterations")
        ev = ("no evaluation" if summary["final_eval_mean_return"] is None else
              f"eval return {summary['final_eval_mean_return']:.1f} ± {summary['final_eval_std_return']:.1f}")
        return (f"done: {', '.join(done)} in {summary['train_s']:.1f}s training ({summary['sps']:,.0f} SPS), "
                f"{summary['wall_s']:.1f}s total; {ev}; run dir {self.run_dir}")

    def close(self) -> None:
        if self.console is not None:
            self.console.close()
        if self.collector is not None:
            self.collector.close()
        self.env.close()
        if self._eval_env is not None:
            self._eval_env.close()
            self._eval_env = None
        if self.logger is not None:
            self.logger.close()
            self.logger = None
