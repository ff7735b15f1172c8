"""Partially observed test tasks: what a policy cannot solve without memory."""

import gymnasium as gym
import numpy as np


class CueEnv(gym.Env):
    """The first observation shows a cue (+1 or -1), later ones hide it; at the last step the action must
    match it: +1 if it does, -1 if not, 0 before. A policy without memory can do no better than chance
    (expected return 0); one that remembers the cue earns 1 every episode.

    Observation: [cue (first step only), first-step flag, last-step flag].
    """

    observation_space = gym.spaces.Box(-1.0, 1.0, (3,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, length: int = 4):
        self.length = length
        self.t = 0
        self.cue = 1

    def _obs(self) -> np.ndarray:
        first, last = self.t == 0, self.t == self.length - 1
        return np.array([self.cue if first else 0.0, float(first), float(last)], dtype=np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        self.cue = 1 if self.np_random.random() < 0.5 else -1
        return self._obs(), {}

    def step(self, action):
        last = self.t == self.length - 1
        reward = (1.0 if (int(action) == 1) == (self.cue > 0) else -1.0) if last else 0.0
        self.t += 1
        return (self._obs() if not last else np.zeros(3, np.float32)), reward, last, False, {}


def hide_velocity(env: gym.Env) -> gym.Env:
    """CartPole with its velocities hidden (zeroed: indices 1 and 3), as RL Zoo's CartPoleNoVel-v1."""
    mask = np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)
    return gym.wrappers.TransformObservation(env, lambda obs: (obs * mask).astype(np.float32), env.observation_space)
