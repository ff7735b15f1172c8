"""The online algorithms' models: PPO, APPO, IMPALA, SAC, DQN and REINFORCE."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from distrl.api.model import MODELS, Model
from distrl.config import ConfigError
from distrl.export import graph
from distrl.export.q_graph import q_graph
from distrl.training import DQNTrainer, OffPolicyTrainer, OnPolicyTrainer


class PPO(Model):
    """Proximal Policy Optimization; hyperparameters as :class:`~distrl.config.PPOConfig`."""

    algo = "ppo"
    _trainer: OnPolicyTrainer

    @property
    def recurrent(self) -> bool:
        return self._trainer.agent.recurrent

    def _noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return self._trainer.agent.spec.draw_noise(rng, (n,))

    def _graph(self, stochastic: bool) -> graph.ActingGraph:
        trainer = self._trainer
        space = trainer.env.single_observation_space
        return graph.policy_graph(trainer.agent, space, trainer.obs_normalizer, stochastic)

    def _actions(
        self, obs: np.ndarray, noise: np.ndarray | None, state: Any = None, starts: np.ndarray | None = None
    ) -> tuple[np.ndarray, Any]:
        agent = self._trainer.agent
        obs = self._trainer.policy_obs(obs)
        if not agent.recurrent:
            return agent.env_action(agent.act(obs, noise)), None
        initial = agent.initial_state(len(obs))
        if state is None:
            state_t, starts = initial, np.ones(len(obs), dtype=bool)
        else:
            state_t = tuple(
                torch.as_tensor(np.asarray(s), dtype=i.dtype).to(agent.device) for s, i in zip(state, initial)
            )
            if len(state) != len(initial) or any(s.shape != i.shape for s, i in zip(state_t, initial)):
                raise ConfigError(
                    f"state of shapes {[np.shape(s) for s in state]} is not allowed for {len(obs)} observation(s): "
                    f"{[tuple(i.shape) for i in initial]}, the state predict returned for as many observations"
                )
        starts = np.zeros(len(obs), dtype=bool) if starts is None else starts
        actions, _, _, next_state = agent.act_state(obs, noise, state_t, starts)
        return agent.env_action(actions), tuple(s.cpu().numpy() for s in next_state)


class SAC(Model):
    """Soft Actor-Critic; hyperparameters as :class:`~distrl.config.SACConfig`."""

    algo = "sac"
    _trainer: OffPolicyTrainer

    def _noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.standard_normal((n, self._trainer.action_dim), dtype=np.float32)

    def _graph(self, stochastic: bool) -> graph.ActingGraph:
        trainer = self._trainer
        env = trainer.env
        return graph.sac_graph(trainer.algo.actor, env.single_observation_space, env.single_action_space, stochastic)

    def _actions(
        self, obs: np.ndarray, noise: np.ndarray | None, state: Any = None, starts: np.ndarray | None = None
    ) -> tuple[np.ndarray, Any]:
        trainer = self._trainer
        return trainer.to_env(trainer.algo.actor.act(obs, noise)), None


class DQN(Model):
    """Deep Q-Network; hyperparameters as :class:`~distrl.config.DQNConfig`. Non-deterministic predictions are
    epsilon-greedy with the run's current exploration rate, as stable-baselines3's are."""

    algo = "dqn"
    _trainer: DQNTrainer

    def _noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return rng.random((n, 2))  # per observation: the coin, then the random action's uniform draw

    def _graph(self, stochastic: bool) -> graph.ActingGraph:
        if stochastic:
            raise ConfigError("stochastic=True is not available for dqn: its policy is the greedy one (argmax Q)")
        trainer = self._trainer
        env = trainer.env
        return q_graph(trainer.algo.q, env.single_observation_space, env.single_action_space)

    def _actions(
        self, obs: np.ndarray, noise: np.ndarray | None, state: Any = None, starts: np.ndarray | None = None
    ) -> tuple[np.ndarray, Any]:
        trainer = self._trainer
        greedy = trainer.algo.q.act(obs)
        if noise is not None:
            randoms = np.minimum((noise[:, 1] * trainer.n_actions).astype(np.int64), trainer.n_actions - 1)
            greedy = np.where(noise[:, 0] < trainer.exploration_rate, randoms, greedy)
        return greedy + trainer.action_start, None


class REINFORCE(PPO):
    """REINFORCE; hyperparameters as :class:`~distrl.config.REINFORCEConfig` (its policy acts like PPO's)."""

    algo = "reinforce"


class APPO(PPO):
    """Asynchronous PPO on V-trace targets; hyperparameters as :class:`~distrl.config.APPOConfig`. Trained here in
    one process (the command line spreads it over actors: ``distrl train appo ENV``)."""

    algo = "appo"


class IMPALA(PPO):
    """IMPALA's V-trace actor-critic; hyperparameters as :class:`~distrl.config.IMPALAConfig`. Trained here in one
    process (the command line spreads it over actors: ``distrl train impala ENV``)."""

    algo = "impala"


MODELS.update({"ppo": PPO, "appo": APPO, "impala": IMPALA, "sac": SAC, "dqn": DQN, "reinforce": REINFORCE})
