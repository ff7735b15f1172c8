"""Cooperative PettingZoo tasks small enough to learn in seconds (importable as ``distrl_macoop:name``).

In both, every agent sees a fresh random cue each step and the team is paid for the agents that answer
their cue correctly; a game lasts ``length`` steps, so the best team return is ``length`` and guessing
earns a known fraction of it.
"""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class CueGame(ParallelEnv):
    """Agents with cues of ``sizes[i]`` choices (one-hot observations, Discrete(sizes[i]) actions); agent ``i``
    is right when its action is ``(cue + shifts[i]) % sizes[i]``. Each step pays every agent the team's
    fraction of right answers divided by the number of agents, so the team return is at most ``length``."""

    metadata = {"name": "cue_game"}

    def __init__(self, sizes: tuple[int, ...] = (2, 2), shifts: tuple[int, ...] = (0, 0), length: int = 8):
        self.sizes, self.shifts, self.length = tuple(sizes), tuple(shifts), length
        self.possible_agents = [f"agent_{i}" for i in range(len(self.sizes))]
        self.rng = np.random.default_rng()
        self.agents: list[str] = []
        self.t = 0
        self.cues = np.zeros(len(self.sizes), np.int64)

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(0.0, 1.0, (self.sizes[self.possible_agents.index(agent)],), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(self.sizes[self.possible_agents.index(agent)])

    def _observe(self) -> dict[str, np.ndarray]:
        self.cues = np.array([self.rng.integers(n) for n in self.sizes])
        return {a: np.eye(n, dtype=np.float32)[c] for a, n, c in zip(self.possible_agents, self.sizes, self.cues)}

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t = 0
        self.agents = list(self.possible_agents)
        return self._observe(), {a: {} for a in self.agents}

    def step(self, actions):
        right = [
            int(actions[a]) == (c + s) % n
            for a, n, s, c in zip(self.possible_agents, self.sizes, self.shifts, self.cues)
        ]
        reward = float(np.mean(right)) / len(self.sizes)
        self.t += 1
        done = self.t >= self.length
        obs = self._observe()
        self.agents = [] if done else list(self.possible_agents)
        rewards = {a: reward for a in actions}
        return obs, rewards, {a: False for a in actions}, {a: done for a in actions}, {a: {} for a in actions}


def symmetric(**kwargs) -> CueGame:
    """Three alike agents answering their own cue: one shared policy serves them all."""
    return CueGame(sizes=(3, 3, 3), shifts=(0, 0, 0), **kwargs)


def unlike(**kwargs) -> CueGame:
    """Two unlike agents: a cue of 2 answered as it is, and one of 3 answered shifted by one; different
    observation and action spaces."""
    return CueGame(sizes=(2, 3), shifts=(0, 1), **kwargs)
