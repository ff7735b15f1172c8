"""Small tasks over images, Dict observations and multi-part actions (importable as ``distrl_spaceenvs:Name``).

Each is solved only by using what its space carries: a policy that ignores the pixels, one
Dict key or one action part earns a known fraction of the reward.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import torch
from torch import nn


class QuadrantEnv(gym.Env):
    """A marker in one quadrant of a ``size`` x ``size`` uint8 image; naming the quadrant earns 1.

    Each step shows a new marker; episodes last ``length`` steps. Guessing earns 0.25 per step.
    """

    def __init__(self, size: int = 10, channels_first: bool = False, length: int = 8):
        self.size, self.length, self.channels_first = size, length, channels_first
        shape = (1, size, size) if channels_first else (size, size, 1)
        self.observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.t = 0
        self.quadrant = 0

    def _obs(self) -> np.ndarray:
        self.quadrant = int(self.np_random.integers(4))
        half = self.size // 2
        row = int(self.np_random.integers(half)) + half * (self.quadrant // 2)
        col = int(self.np_random.integers(half)) + half * (self.quadrant % 2)
        image = np.zeros((self.size, self.size), np.uint8)
        image[row, col] = 255
        return image[None] if self.channels_first else image[..., None]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.quadrant)
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}


class DictSignEnv(gym.Env):
    """Dict observation: an 8x8 image with a marker in its left or right half, and a sign in [-1, 1].

    The rewarded action (of 4) is 2 * [marker on the right] + [sign > 0]: it needs both keys; either
    alone earns 0.5 per step, guessing 0.25.
    """

    def __init__(self, length: int = 8):
        self.length = length
        self.observation_space = gym.spaces.Dict(
            {"image": gym.spaces.Box(0, 255, (8, 8, 1), np.uint8), "sign": gym.spaces.Box(-1.0, 1.0, (1,), np.float32)}
        )
        self.action_space = gym.spaces.Discrete(4)
        self.t = 0
        self.answer = 0

    def _obs(self) -> dict:
        right = int(self.np_random.integers(2))
        sign = float(self.np_random.uniform(-1, 1))
        image = np.zeros((8, 8, 1), np.uint8)
        image[int(self.np_random.integers(8)), int(self.np_random.integers(4)) + 4 * right, 0] = 255
        self.answer = 2 * right + int(sign > 0)
        return {"image": image, "sign": np.array([sign], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(int(action) == self.answer)
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}


class SignsEnv(gym.Env):
    """Observation: ``parts`` random signs; action: one choice per sign (MultiDiscrete or MultiBinary).

    The reward is the fraction of parts whose choice matches its sign (1 for positive); guessing earns 0.5.
    """

    def __init__(self, parts: int = 3, binary: bool = False, length: int = 8):
        self.parts, self.length = parts, length
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (parts,), np.float32)
        self.action_space = gym.spaces.MultiBinary(parts) if binary else gym.spaces.MultiDiscrete([2] * parts)
        self.t = 0
        self.signs = np.zeros(parts)

    def _obs(self) -> np.ndarray:
        self.signs = self.np_random.choice([-1.0, 1.0], self.parts)
        return self.signs.astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = float(np.mean(np.asarray(action) == (self.signs > 0)))
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}


class TinyNet(nn.Module):
    """A user's network with the (head, value) contract: one hidden layer shared by both heads."""

    def __init__(self, obs_dim: int, head_size: int):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, 32), nn.Tanh())
        self.head = nn.Linear(32, head_size)
        self.value = nn.Linear(32, 1)

    def forward(self, obs: torch.Tensor):
        x = self.body(obs.float().reshape(len(obs), -1))
        return self.head(x), self.value(x)


def tiny_net(observation_space, action_space, config) -> nn.Module:
    """A policy factory as ``--policy distrl_spaceenvs:tiny_net`` names it."""
    head = int(action_space.n) if isinstance(action_space, gym.spaces.Discrete) else int(np.prod(action_space.shape))
    return TinyNet(int(np.prod(observation_space.shape)), head)


class TinyEncoder(nn.Module):
    """A user's encoder (it has ``features_dim``): distrl puts its own heads on top."""

    def __init__(self, observation_space, action_space=None, config=None):
        super().__init__()
        self.features_dim = 16
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(int(np.prod(observation_space.shape)), 16), nn.ReLU())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs.float())


def not_a_module(observation_space, action_space, config):
    return "a string"


def raising_net(observation_space, action_space, config) -> nn.Module:
    """A policy factory that raises while it builds the network: it reads a field its config does not have."""
    return TinyNet(int(np.prod(observation_space.shape)), config.hidden_units)


class DictTargetEnv(gym.Env):
    """Dict observation {"x": Box(1), "flip": Discrete(2)}, one continuous action in [-1, 1].

    The reward is ``-|a - t|`` with the target ``t = x``, or ``-x`` when flip is 1: the policy needs
    both keys. Acting on ``x`` alone earns about -0.5 per step, the best policy 0.
    """

    def __init__(self, length: int = 8):
        self.length = length
        self.observation_space = gym.spaces.Dict(
            {"x": gym.spaces.Box(-1.0, 1.0, (1,), np.float32), "flip": gym.spaces.Discrete(2)}
        )
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.t = 0
        self.target = 0.0

    def _obs(self) -> dict:
        x, flip = float(self.np_random.uniform(-1, 1)), int(self.np_random.integers(2))
        self.target = -x if flip else x
        return {"x": np.array([x], np.float32), "flip": flip}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        reward = -abs(float(np.asarray(action).reshape(-1)[0]) - self.target)
        self.t += 1
        return self._obs(), reward, False, self.t >= self.length, {}
