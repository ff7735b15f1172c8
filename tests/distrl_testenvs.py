"""Small deterministic environments for tests (importable as ``distrl_testenvs:Name``)."""

from __future__ import annotations

import time

import gymnasium as gym
import numpy as np


class CountEnv(gym.Env):
    """Observation is [step index, episode index]; reward 1 per step; ends after ``length`` steps.

    ``terminate=True`` ends episodes by termination, otherwise by truncation.
    """

    def __init__(self, length: int = 3, terminate: bool = False):
        self.length = length
        self.terminate = terminate
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (2,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0
        self.episode = -1

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.episode += 1
        return np.array([self.t, self.episode], dtype=np.float32), {}

    def step(self, action):
        self.t += 1
        ended = self.t >= self.length
        obs = np.array([self.t, self.episode], dtype=np.float32)
        return obs, 1.0, ended and self.terminate, ended and not self.terminate, {}


class ContinuousCountEnv(CountEnv):
    """CountEnv with a Box action space, for Gaussian-policy tests."""

    def __init__(self, length: int = 5):
        super().__init__(length)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


class SlowCartPole(gym.Wrapper):
    """CartPole whose every step sleeps ``delay`` seconds (a straggler)."""

    def __init__(self, delay: float = 0.002):
        super().__init__(gym.make("CartPole-v1"))
        self.delay = delay

    def step(self, action):
        time.sleep(self.delay)
        return self.env.step(action)


class ExplodingEnv(CountEnv):
    """Raises from ``step`` after ``after`` steps, to test error reporting."""

    def __init__(self, after: int = 5):
        super().__init__(length=100)
        self.after = after
        self.calls = 0

    def step(self, action):
        self.calls += 1
        if self.calls > self.after:
            raise RuntimeError("boom from ExplodingEnv")
        return super().step(action)


class SlowOnRank1CartPole(gym.Wrapper):
    """CartPole that sleeps ``delay`` seconds per step in the process whose RANK is 1."""

    def __init__(self, delay: float = 0.01):
        super().__init__(gym.make("CartPole-v1"))
        import os

        self.delay = delay if os.environ.get("RANK") == "1" else 0.0

    def step(self, action):
        if self.delay:
            time.sleep(self.delay)
        return self.env.step(action)


class ExplodingOnRank1(CountEnv):
    """Raises from ``step`` after 50 steps in the process whose RANK is 1."""

    def __init__(self):
        super().__init__(length=20)
        import os

        self.armed = os.environ.get("RANK") == "1"
        self.calls = 0

    def step(self, action):
        self.calls += 1
        if self.armed and self.calls > 50:
            raise RuntimeError("boom from rank 1's env")
        return super().step(action)
