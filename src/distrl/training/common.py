"""What every training loop shares: placement, logging, evaluation (checkpoints: ``state.py``).

A trainer runs on one worker. Strategies differ only in the ``Sync`` they pass in
and in which worker is the main one (it logs and writes checkpoints); the loop, the
algorithm and the collector are the same everywhere.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from distrl.algos.protocols import Sync
from distrl.config import ConfigError, RunConfig, StrategyConfig
from distrl.data.collector import Collector
from distrl.data.normalize import ObsNormalizer
from distrl.envs.evaluation import Evaluation, run_episodes
from distrl.envs.names import portable_env_name, resolve_env_id
from distrl.envs.selfplay import games_of, outcomes
from distrl.envs.spaces import DictLayout, stored_layout
from distrl.envs.vector import VecEnv, make_run_env, resolve_action_mask
from distrl.nets import make_agent
from distrl.nets.agent import Agent
from distrl.nets.factory import PolicySource
from distrl.nets.multiagent import AgentSetup, agent_setup_for
from distrl.nets.recurrent import StatefulPolicy
from distrl.run.logs import Console, RunLogger
from distrl.training.presets import fallback_line
from distrl.training.recorded import space_to_json
from distrl.training.state import RunState

EVAL_SEED_OFFSET = 1_000_000


def _cap_note(result: Evaluation) -> str:
    """What an evaluation line adds when the step cap stopped it."""
    if not result.capped:
        return ""
    return f" ({result.finished} of {result.episodes} episodes: stopped at the cap of {result.max_steps:,} steps)"


def _evaluation_summary(result: Evaluation | None) -> dict[str, Any]:
    """summary.json's figures of the run's last evaluation (its final one): returns None where none finished;
    ``final_eval_steps`` counts the steps of the finished episodes, ``final_eval_cut_steps`` those of the episodes
    the cap cut, ``final_eval_steps_taken`` every step taken (what the cap counts)."""
    if result is None:
        return {"final_eval_mean_return": None, "final_eval_std_return": None}
    return {
        "final_eval_mean_return": result.mean if result.finished else None,
        "final_eval_std_return": result.std if result.finished else None,
        "final_eval_episodes": result.episodes,
        "final_eval_finished": result.finished,
        "final_eval_steps": result.steps,
        "final_eval_cut_steps": result.cut_steps,
        "final_eval_steps_taken": result.steps_taken,
        "final_eval_max_steps": result.max_steps,
        "final_eval_s": result.seconds,
    }


MULTIAGENT_ALGOS = ("ppo", "appo", "impala")
"""What trains on a multi-agent env's rows of agents (IPPO, MAPPO and their asynchronous forms)."""


class TrainerBase(RunState):
    """Placement, logging and evaluation around an algorithm's loop; checkpoints and broadcast from RunState.

    Subclasses build their algorithm and collector in ``__init__`` and implement
    ``train``, ``act_for_eval``, ``state_tensors``/``load_state_tensors`` and ``start_segment``.
    """

    algo_name = ""
    counts_iterations = False
    """Whether --iterations bounds this trainer's runs (else it trains for total_steps)."""
    collector: Collector | None = None
    """What collects this trainer's experience, where it has one (SAC steps its environments itself)."""
    obs_normalizer: ObsNormalizer | None = None
    """The observation normaliser :meth:`policy_obs` applies, where the run has one (PPO's ``--normalize-obs``)."""

    def __init__(
        self,
        run: RunConfig,
        cfg: Any,
        sync: Sync | None,
        run_dir: Path | None,
        log: bool,
        strategy: StrategyConfig | None,
        requested: Any,
        device: torch.device | None,
    ):
        run = resolve_action_mask(run)
        self.start_run(run, cfg, sync, strategy, requested, device, run_dir)
        self.env_id = resolve_env_id(run.env)
        self.env = make_run_env(run, cfg.n_envs, self.env_id)
        try:
            if self.env.agents and self.algo_name not in MULTIAGENT_ALGOS:
                raise ConfigError(
                    f"env={self.env_id!r} is a multi-agent env, which {self.algo_name} does not train yet: "
                    f"use {', '.join(MULTIAGENT_ALGOS)}"
                )
            self.agent_setup: AgentSetup | None = agent_setup_for(run, self.env.agents)
            """How the env's agents map to policies and what the critic sees (None: a single-agent env); the
            networks and the learning rule are built from it."""
            self.check_spaces(self.env_id, self.env.single_observation_space, self.env.single_action_space, cfg)
        except ConfigError:
            self.env.close()
            raise
        self.obs_shape, self.obs_dtype = stored_layout(self.env.single_observation_space)
        self.obs_dim = int(np.prod(self.obs_shape))
        self.eval_s = 0.0
        self.last_eval: tuple[float, float] | None = None
        self.last_evaluation: Evaluation | None = None
        self.last_metrics: dict[str, float] = {}
        self._eval_steps = -1
        self._eval_env: VecEnv | None = None
        self._eval_policy: StatefulPolicy | None = None
        self._console_return: float | None = None
        self.stop_when: Callable[[int, float], bool] | None = None
        """Called on the main worker with (steps, mean return) after each periodic evaluation (--eval-every);
        True ends the run there, as a reached --target-return does (a tuning study prunes trials with it)."""
        if run.iterations and not self.counts_iterations:
            raise ConfigError(
                f"iterations={run.iterations} is not allowed for {self.algo_name}: must be 0, "
                f"{self.algo_name} trains for --total-steps (iterations bound REINFORCE's runs)"
            )
        if self.is_main and log and run_dir is not None:
            self.console = Console(*self.progress_bound(), quiet=run.quiet)
            try:
                self.logger = RunLogger.start(
                    run_dir, self.env_id, self.config_dict(), run.track, run.track_project, agents=self.env.agents
                )
            except BaseException:
                self.close()
                raise

    def begin(self, resume_path: Path | None) -> None:
        """The run's first line, on a fresh run of an env without a preset: the fallback it got and why."""
        if self.is_main and resume_path is None:
            space, actions = self.env.single_observation_space, self.env.single_action_space
            line = fallback_line(self.algo_name, self.env_id, self.run.preset, space, actions, self.run.self_play)
            if line is not None:
                self.report(line)
        super().begin(resume_path)

    def build_agent(self, cfg: Any, policy: PolicySource = None) -> Agent:
        """An actor-critic for this trainer's envs under ``cfg``'s network (``policy``: the API's, else the run's):
        the run's precision, action masks and multi-agent policies."""
        run = self.run
        return make_agent(
            self.env.single_observation_space,
            self.env.single_action_space,
            cfg,
            self.device,
            run.seed,
            policy if policy is not None else run.policy,
            run.precision,
            run.network_mask,
            self.agent_setup,
        )

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

    def _end_iteration(self, start: float, update_start: float, updated: bool = True) -> float:
        """Count an iteration (and its update, if there was one) and its time; returns the current time."""
        self.policy_version += int(updated)
        self.iteration += 1
        now = time.perf_counter()
        self.train_s += now - start
        self.update_s += now - update_start
        return now

    def count_episodes(self, finished: int) -> tuple[np.ndarray, np.ndarray]:
        """Each worker's count of the episodes that ended this iteration ([world_size], ``finished`` here) and the
        summed stop votes, in one all-reduce; the episodes are added to ``self.episodes``."""
        counts = np.zeros(self.sync.world_size + 2)
        counts[self.sync.rank] = finished
        counts[-2:] = self.stop_votes()
        counts = self.sync.all_sum(counts) if self.sync.world_size > 1 else counts
        episodes, votes = counts[:-2], counts[-2:]
        self.episodes += int(episodes.sum())
        return episodes, votes

    def _crossed(self, every: int, per_iteration: int) -> bool:
        """Whether the last iteration (``per_iteration`` steps) crossed a multiple of ``every`` steps."""
        if every <= 0:
            return False
        return self.steps // every > (self.steps - per_iteration) // every

    def end_of_iteration(self, per_iteration: int, votes: np.ndarray, more: bool) -> bool:
        """After an iteration of ``per_iteration`` steps, with the summed stop votes: a stop signal's checkpoint,
        else the periodic evaluation and checkpoint; True to end the loop (stopped, or target reached)."""
        if votes[0] > 0:
            return self.checkpoint_or_stop(False, votes, more)
        if self._crossed(self.run.eval_every, per_iteration) and self._evaluate_and_check_target():
            return True
        return self.checkpoint_or_stop(self._crossed(self.run.checkpoint_every, per_iteration), votes, more)

    def _evaluate_and_check_target(self) -> bool:
        """Evaluate on the main worker; True (on every worker) once the target return is reached."""
        reached = 0.0
        if self.is_main:
            mean, _ = self.evaluate_now()
            complete = self.last_evaluation is not None and not self.last_evaluation.capped
            reached = float(complete and self.run.target_return is not None and mean >= self.run.target_return)
            if self.stop_when is not None and self.stop_when(self.steps, mean):
                reached = 1.0
        return bool(self.sync.all_sum(np.array([reached]))[0] > 0)

    def _log(
        self,
        returns: list[float],
        lengths: list[int],
        counts: np.ndarray,
        metrics: dict[str, float],
        agent_returns: list[list[float]] | None = None,
    ) -> None:
        """Log this iteration; every worker's finished episodes go to the main worker's monitor files (with each
        agent's return of a multi-agent env's games, ``agent_returns``)."""
        self.last_metrics = metrics
        if counts.sum():
            columns = [np.asarray(returns, np.float64), np.asarray(lengths, np.float64)]
            if self.env.agents:
                agents = len(self.env.agents)
                columns += list(np.asarray(agent_returns or [], np.float64).reshape(len(returns), agents).T)
            episodes = self.sync.gather(np.stack(columns, 1), counts.astype(int).tolist())
        else:  # most iterations of an off-policy run, which steps once per iteration
            episodes = [np.zeros((0, 2 + len(self.env.agents or ())))] * len(counts)
        sps = self.steps / max(self.train_s, 1e-9)
        if self.logger is not None:
            metrics["charts/SPS"] = sps
            for rank, part in enumerate(episodes):
                self.logger.episodes(
                    part[:, 0].tolist(),
                    part[:, 1].astype(int).tolist(),
                    self.steps,
                    rank if self.sync.world_size > 1 else None,
                    part[:, 2:].tolist() if self.env.agents else None,
                )
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

    def evaluate_now(self) -> tuple[float, float]:
        """Deterministic evaluation over ``eval_episodes`` episodes, stopped at the run's cap on evaluation steps
        (``RunConfig.eval_step_cap``); returns the (mean, std) of the episodes it finished (nan if none did)."""
        start = time.perf_counter()
        if self._eval_env is None:
            self._eval_env = make_run_env(self.run, self.run.eval_episodes, self.env_id, evaluation=True)
        label = f"eval at {self.steps:,} steps"
        progress = self.console.episodes(label, self.run.eval_episodes) if self.console is not None else None
        try:
            result = run_episodes(
                self.act_for_eval, self._eval_env, self.run.seed + EVAL_SEED_OFFSET, self.run.eval_step_cap, progress
            )
        finally:
            if progress is not None:
                progress.close()
        self.last_evaluation = result
        self.last_eval = (result.mean, result.std)
        self._eval_steps = self.steps
        self.eval_s += time.perf_counter() - start
        if self.logger is not None and result.finished:
            self.logger.scalars({"eval/mean_return": result.mean, "eval/std_return": result.std}, self.steps)
        if self.console is not None:
            outcome = f"{result.mean:.1f} ± {result.std:.1f}" if result.finished else "no episode finished"
            self.console.line(f"{label}: {outcome}{_cap_note(result)}")
        return self.last_eval

    def env_name(self) -> str:
        return portable_env_name(self.env_id)

    def checkpoint_state(self) -> dict[str, Any]:
        return {"observation_dim": self.obs_dim, "action_space": space_to_json(self.env.single_action_space)}

    def summary(self) -> dict[str, Any]:
        mean_return = self.logger.mean_return if self.logger is not None else None
        return {
            **super().summary(),
            "total_steps": self.steps,
            "iterations": self.iteration,
            "episodes": self.episodes,
            "eval_s": self.eval_s,
            "sps": self.steps / max(self.train_s, 1e-9),
            "final_mean_return": mean_return,
            **_evaluation_summary(self.last_evaluation),
            **(outcomes(self.last_evaluation.returns) if self.last_evaluation and games_of(self.env) else {}),
            **self.extra_summary,
            **(self.collector.summary() if self.collector is not None else {}),
        }

    def end_collection(self) -> dict[str, Any]:
        return self.collector.finish() if self.collector is not None else {}  # a pipeline drains its generators

    def final_evaluation(self) -> dict[str, Any]:
        if self._eval_steps != self.steps:
            self.evaluate_now()
        return {}

    def after_summary(self, summary: dict[str, Any]) -> None:
        if self.run.plot:
            from distrl.run.plots import reward_curves

            if self.logger is not None:
                self.logger.monitor.file.flush()
            reward_curves(
                [self.run_dir],
                "total-steps",
                k=10,
                out=self.run_dir / "reward_curve.png",
                title=f"{self.algo_name.upper()} {self.env_id}",
            )

    def end_line(self, summary: dict[str, Any]) -> str:
        """The one line a finished run prints: what it did, its times (labelled), the evaluation."""
        done = [f"{self.steps:,} steps", f"{self.episodes:,} episodes"]
        if self.run.iterations:
            done.insert(0, f"{self.iteration:,} iterations")
        evaluation = self.last_evaluation
        ev = evaluation.headline() if evaluation is not None else "no evaluation"
        account = f"; {evaluation.account()}" if evaluation is not None else ""
        return (
            f"done: {', '.join(done)} in {summary['train_s']:.1f}s training ({summary['sps']:,.0f} SPS), "
            f"{summary['wall_s']:.1f}s total; {ev}; run dir {self.run_dir}{account}"
        )

    def release(self) -> None:
        if self.collector is not None:
            self.collector.close()
        self.env.close()
        if self._eval_env is not None:
            self._eval_env.close()
            self._eval_env = None
