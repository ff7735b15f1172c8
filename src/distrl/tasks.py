"""Group tasks for GRPO: an input state, a discrete answer, a reward scored in batches.

- ``toy``: a 4-dim random state, 4 actions, rewards from a small fixed random reward network
  (the shape of the generator/scorer/learner example).
- ``bandit``: a contextual bandit with a known optimum: 8-dim state, 8 actions, reward 1 for the
  action a fixed linear map ranks first, else 0. Optimal mean reward 1, random 1/8.

Both know their optimum, so learning is checkable: ``optimal_reward(states)``.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from distrl.config import ConfigError


class ToyTask:
    obs_dim, n_actions = 4, 4

    def __init__(self, seed: int = 0):
        generator = torch.Generator().manual_seed(10_000 + seed)
        self.reward_net = nn.Sequential(nn.Linear(self.obs_dim + self.n_actions, 16), nn.Tanh(), nn.Linear(16, 1))
        with torch.no_grad():
            for param in self.reward_net.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.8)

    def states(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_normal((n, self.obs_dim)).astype(np.float32)

    @torch.inference_mode()
    def _all_rewards(self, states: np.ndarray) -> torch.Tensor:
        """``[B, n_actions]``: the reward of every action for every state."""
        s = torch.as_tensor(states).unsqueeze(1).expand(-1, self.n_actions, -1)
        onehot = torch.eye(self.n_actions).expand(len(states), -1, -1)
        return self.reward_net(torch.cat([s, onehot], dim=-1)).squeeze(-1)

    def rewards(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``states [B, D]``, ``actions [B, G]`` → rewards ``[B, G]`` (one batched network call)."""
        return self._all_rewards(states).gather(1, torch.as_tensor(actions)).numpy()

    def optimal_reward(self, states: np.ndarray) -> float:
        return float(self._all_rewards(states).max(dim=1).values.mean())


class BanditTask:
    obs_dim, n_actions = 8, 8

    def __init__(self, seed: int = 0):
        self.weights = np.random.default_rng(20_000 + seed).standard_normal((self.obs_dim, self.n_actions))

    def states(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return rng.standard_normal((n, self.obs_dim)).astype(np.float32)

    def best_actions(self, states: np.ndarray) -> np.ndarray:
        return np.argmax(states @ self.weights, axis=1)

    def rewards(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return (actions == self.best_actions(states)[:, None]).astype(np.float32)

    def optimal_reward(self, states: np.ndarray) -> float:
        return 1.0


TASKS = {"toy": ToyTask, "bandit": BanditTask}


def make_task(name: str, seed: int = 0) -> ToyTask | BanditTask:
    if name not in TASKS:
        raise ConfigError(f"env={name!r} is not a group task: must be one of {', '.join(TASKS)}")
    return TASKS[name](seed)
