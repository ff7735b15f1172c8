"""The episodic loop (REINFORCE): collect whole episodes → one update → report the iteration."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.algos.protocols import Sync
from distrl.algos.reinforce import REINFORCEAlgo
from distrl.config import REINFORCEConfig, RunConfig, StrategyConfig
from distrl.data.episodes import EpisodeCollector, EpisodeSource
from distrl.nets.factory import PolicySource, check_agent_spaces
from distrl.training.common import TrainerBase
from distrl.training.state import section


class EpisodicTrainer(TrainerBase):
    """Trains REINFORCE from whole episodes, collected here or by remote workers (``collector_factory``)."""

    algo_name = "reinforce"
    counts_iterations = True

    def __init__(
        self,
        run: RunConfig,
        cfg: REINFORCEConfig,
        sync: Sync | None = None,
        run_dir: Path | None = None,
        log: bool = True,
        strategy: StrategyConfig | None = None,
        requested: REINFORCEConfig | None = None,
        device: torch.device | None = None,
        collector_factory: Callable[[TrainerBase], EpisodeSource] | None = None,
        policy: PolicySource = None,
    ):
        super().__init__(run, cfg, sync, run_dir, log, strategy, requested, device)
        self.agent = self.build_agent(cfg, policy)
        self.algo = REINFORCEAlgo(cfg, self.agent)
        self.last_iteration_return: float | None = None
        if collector_factory is None:
            self.collector: EpisodeSource = EpisodeCollector(
                self.env, self.agent, run.seed, self.sync.rank * cfg.n_envs, cfg.max_episode_steps
            )
        else:
            self.collector = collector_factory(self)
        self.start_segment()

    @classmethod
    def check_spaces(cls, env_id: str, observation_space: Any, action_space: Any, cfg: Any) -> None:
        check_agent_spaces(env_id, cls.algo_name, observation_space, action_space, cfg)

    def weights(self) -> dict[str, Any]:
        """What a remote collector needs to act like this learner: the policy version and parameters."""
        return {"version": self.policy_version, "params": self.agent.params.data.cpu().numpy().copy()}

    def train(self, total_steps: int | None = None, stop_at: int | None = None) -> dict[str, Any]:
        total = total_steps if total_steps is not None else self.run.total_steps
        limit = min(total, stop_at) if stop_at is not None else total
        iterations = self.run.iterations
        while (self.iteration < iterations) if iterations else (self.steps < limit):
            start = time.perf_counter()
            batch = self.collector.collect(self.cfg.episodes_per_iter, self.policy_version)
            # Episodes differ in length: every rank counts every rank's steps, or they would stop apart.
            counts = np.zeros(3 + self.sync.world_size)
            counts[0], counts[1 + self.sync.rank] = batch.steps, batch.n_episodes
            counts[-2:] = self.stop_votes()
            summed = self.sync.all_sum(counts)
            counts, votes = summed[:-2], summed[-2:]
            self.steps += int(counts[0])
            self.episodes += int(counts[1:].sum())
            update_start = time.perf_counter()
            metrics = self.algo.update(batch, self.sync)
            now = self._end_iteration(start, update_start)
            mean_return = float(np.mean(batch.episode_returns))
            self.last_iteration_return = mean_return
            metrics.update(
                {
                    "time/collect_s": batch.collect_s,
                    "time/update_s": now - update_start,
                    "charts/mean_return": mean_return,
                    **self.collector.iteration_metrics(),
                }
            )
            self._log(batch.episode_returns, batch.episode_lengths, counts[1:], metrics)
            if self.console is not None:
                of = f"/{iterations}" if iterations else ""
                self.console.line(
                    f"iteration {self.iteration}{of}: mean reward {mean_return:.2f}, "
                    f"loss {metrics['losses/policy_loss']:.4f}, {int(counts[1:].sum())} episodes, "
                    f"{self.steps:,} steps"
                )
            if self.end_of_iteration(int(counts[0]), votes, self.steps < total):
                break
        return self.summary()

    def summary(self) -> dict[str, Any]:
        summary = super().summary()
        summary["episodes_per_s"] = self.episodes / max(self.train_s, 1e-9)
        summary["final_iteration_mean_return"] = self.last_iteration_return
        return summary

    def act_for_eval(self, obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
        return self.agent.env_action(self.greedy_actions(obs.astype(self.obs_dtype), starts))

    def start_segment(self) -> None:
        self.collector.reset(self.run.seed, self.steps)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"params/{k}": v for k, v in self.agent.params.state_dict().items()}
        tensors.update({f"optim/{k}": v for k, v in self.algo.state_dict().items()})
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        self.agent.params.load_state_dict(section(tensors, "params"))
        self.algo.load_state_dict(section(tensors, "optim"))
        self.agent.refresh_acting_copy()

    def broadcast_tensors(self) -> list[torch.Tensor]:
        optim = self.algo.optimizer
        return [
            self.agent.params.data,
            optim.exp_avg,
            optim.exp_avg_sq,
            torch.tensor([optim.steps], dtype=torch.float64),
        ]

    def after_broadcast(self, tensors: list[torch.Tensor]) -> None:
        self.algo.optimizer.steps = int(tensors[-1][0])
        self.agent.refresh_acting_copy()
