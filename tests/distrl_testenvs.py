"""Small deterministic environments for tests (importable as ``distrl_testenvs:Name``)."""

from __future__ import annotations

import os
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


class GoRight(gym.Env):
    """A corridor of ``size`` cells: action 1 moves right (+1 at the end, which terminates), 0 stays (-0.1);
    truncated after 4 * size steps."""

    def __init__(self, size: int = 4):
        self.size = size
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.pos = self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.pos = self.t = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        self.pos += int(action)
        self.t += 1
        done = self.pos >= self.size
        return (
            np.array([self.pos / self.size], dtype=np.float32),
            1.0 if done else -0.1,
            done,
            self.t >= 4 * self.size,
            {},
        )


class Reach(gym.Env):
    """A point on a line from 0 to the goal at 1: the action in [-1, 1] moves it by a tenth of itself, reaching
    the goal gives 10 and ends the episode, every other step costs 0.1; truncated after 30 steps. Uniformly
    random actions almost never reach the goal (return -3); full speed right reaches it in 10 steps (9.1)."""

    def __init__(self):
        self.observation_space = gym.spaces.Box(-5.0, 5.0, (1,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
        self.x = 0.0
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.x, self.t = 0.0, 0
        return np.array([self.x], dtype=np.float32), {}

    def step(self, action):
        self.x += 0.1 * float(np.clip(action, -1.0, 1.0)[0])
        self.t += 1
        done = self.x >= 1.0 - 1e-6
        return np.array([self.x], dtype=np.float32), 10.0 if done else -0.1, done, self.t >= 30, {}


def make_count_env(length: int = 3, terminate: bool = False) -> gym.Env:
    """A factory entry point ('distrl_testenvs:make_count_env')."""
    return CountEnv(length, terminate)


def returns_none():
    """A function that is no env factory."""
    return None


NOT_AN_ENV = 42


class NotAnEnv:
    pass


def double_reward(env: gym.Env) -> gym.Env:
    """A wrapper function: rewards times 2."""
    return gym.wrappers.TransformReward(env, lambda r: 2.0 * r)


def slow_to_start(env: gym.Env) -> gym.Env:
    """A wrapper function that takes 3 s in every process but the one whose pid DISTRL_TEST_PID names: a worker
    making this env starts slowly, as on a loaded machine, and the test's own envs are made at once."""
    if str(os.getpid()) != os.environ.get("DISTRL_TEST_PID"):
        time.sleep(3.0)
    return env


def fails_outside_the_test(env: gym.Env) -> gym.Env:
    """A wrapper function that raises in every process but the one whose pid DISTRL_TEST_PID names: the test's
    own process makes the env, its workers cannot."""
    if str(os.getpid()) != os.environ.get("DISTRL_TEST_PID"):
        raise RuntimeError("this env cannot be made here")
    return env


def add_one_reward(env: gym.Env) -> gym.Env:
    """A wrapper function: rewards plus 1 (with double_reward, the order shows)."""
    return gym.wrappers.TransformReward(env, lambda r: r + 1.0)


def broken_wrapper(env: gym.Env):
    """A wrapper that forgets to return the env."""
    env.reset()


def wrong_type_wrapper(env: gym.Env) -> gym.Env:
    """A wrapper that raises while it is applied: it takes the env for a number (TypeError)."""
    return gym.wrappers.TimeLimit(env, max_episode_steps=int(env))


def raising_factory() -> gym.Env:
    """An env factory that raises while it makes the env."""
    raise RuntimeError("the simulator's licence file is missing")


class RaisingEnv(gym.Env):
    """An env class whose constructor raises."""

    def __init__(self, size: int = 3):
        raise ValueError(f"size={size}: the map file is missing")


class FakeAle(gym.Env):
    """An ALE-like game for the Atari wrappers: ``lives`` lives of ``life_steps`` steps each, reward 3 per
    step (clipped: 1), FIRE as action 1 (``fires`` counts presses); ``unwrapped.ale.lives()`` as in ale-py."""

    def __init__(self, lives: int = 3, life_steps: int = 4):
        self.observation_space = gym.spaces.Box(0, 255, (84, 84), np.uint8)
        self.action_space = gym.spaces.Discrete(4)
        self.start_lives, self.life_steps = lives, life_steps
        self.ale = self
        self.resets = self.fires = self.t = 0
        self.left = lives

    def lives(self) -> int:
        return self.left

    def get_action_meanings(self):
        return ["NOOP", "FIRE", "RIGHT", "LEFT"]

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.resets += 1
        self.left, self.t = self.start_lives, 0
        return np.zeros((84, 84), np.uint8), {}

    def step(self, action):
        self.fires += int(action == 1)
        self.t += 1
        if self.t % self.life_steps == 0:
            self.left -= 1
        return np.full((84, 84), self.t % 256, np.uint8), 3.0, self.left == 0, False, {}


class WarnsWhileStepping(gym.Wrapper):
    """Issues a library's kind of deprecation notice at its env's 10th step (during training, not at start)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.steps = 0

    def step(self, action):
        self.steps += 1
        if self.steps == 10:
            import warnings

            warnings.warn(
                "distrl_testenvs.WarnsWhileStepping is deprecated (a test notice)", FutureWarning, stacklevel=2
            )
        return self.env.step(action)
