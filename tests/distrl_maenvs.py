"""Tiny deterministic PettingZoo Parallel envs for distrl.envs.multiagent (importable as ``distrl_maenvs:name``)."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class ScoutAndTank(ParallelEnv):
    """Two unlike agents: a scout (Box(3) observations, Discrete(3) actions) that is out after
    ``scout_steps`` steps, and a tank (Box(5), Discrete(5)) truncated after ``game_steps``.

    Each game draws an offset from the seeded generator; an observation is filled with
    ``offset + t + agent index / 10``. An agent's reward is its action plus 1 for the tank and
    0.5 for the scout. With ``late_tank`` the tank joins after the first step.
    """

    metadata = {"name": "scout_and_tank"}

    def __init__(self, scout_steps: int = 2, game_steps: int = 4, late_tank: bool = False):
        self.possible_agents = ["scout", "tank"]
        self.scout_steps, self.game_steps, self.late_tank = scout_steps, game_steps, late_tank
        self.rng = np.random.default_rng()
        self.agents: list[str] = []
        self.t, self.offset = 0, 0.0

    def observation_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1e4, 1e4, (3,) if agent == "scout" else (5,), np.float32)

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(3 if agent == "scout" else 5)

    def _obs(self, agent: str) -> np.ndarray:
        index = self.possible_agents.index(agent)
        return np.full(self.observation_space(agent).shape, self.offset + self.t + index / 10, np.float32)

    def reset(self, seed=None, options=None):
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        self.t, self.offset = 0, float(self.rng.integers(0, 1000))
        self.agents = ["scout"] if self.late_tank else list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        rewards = {a: float(actions[a]) + (1.0 if a == "tank" else 0.5) for a in actions}
        terms = {a: a == "scout" and self.t >= self.scout_steps for a in actions}
        truncs = {a: a == "tank" and self.t >= self.game_steps for a in actions}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        if self.late_tank and self.t == 1:
            self.agents.append("tank")
        obs = {a: self._obs(a) for a in {*actions, *self.agents}}
        return obs, rewards, terms, truncs, {a: {} for a in actions}


class MaskedPair(ParallelEnv):
    """Two agents with their own action masks, Discrete(2) and Discrete(4), over ``game_steps`` steps;
    the masks of the last step have no legal action (a full board)."""

    metadata = {"name": "masked_pair"}

    def __init__(self, game_steps: int = 2):
        self.possible_agents = ["a", "b"]
        self.game_steps = game_steps
        self.agents: list[str] = []
        self.t = 0

    def observation_space(self, agent: str) -> spaces.Dict:
        n = self.action_space(agent).n
        return spaces.Dict(
            {"observation": spaces.Box(0, 10, (2,), np.float32), "action_mask": spaces.Box(0, 1, (n,), np.int8)}
        )

    def action_space(self, agent: str) -> spaces.Discrete:
        return spaces.Discrete(2 if agent == "a" else 4)

    def _obs(self, agent: str) -> dict[str, np.ndarray]:
        mask = np.zeros(self.action_space(agent).n, np.int8)
        if self.t < self.game_steps:
            mask[self.t % len(mask)] = 1
        return {"observation": np.full(2, self.t, np.float32), "action_mask": mask}

    def reset(self, seed=None, options=None):
        self.t, self.agents = 0, list(self.possible_agents)
        return {a: self._obs(a) for a in self.agents}, {a: {} for a in self.agents}

    def step(self, actions):
        self.t += 1
        over = self.t >= self.game_steps
        obs = {a: self._obs(a) for a in actions}
        self.agents = [] if over else self.agents
        return obs, dict.fromkeys(actions, 1.0), dict.fromkeys(actions, over), dict.fromkeys(actions, False), {}


class _Empty(ParallelEnv):
    metadata = {"name": "empty"}
    possible_agents: list[str] = []


class _UnequalBoxes(ScoutAndTank):
    def action_space(self, agent: str) -> spaces.Box:
        return spaces.Box(-1, 1, (2,) if agent == "scout" else (3,), np.float32)


def scout_and_tank(**kwargs) -> ScoutAndTank:
    return ScoutAndTank(**kwargs)


def masked_pair(**kwargs) -> MaskedPair:
    return MaskedPair(**kwargs)


def no_agents() -> ParallelEnv:
    return _Empty()


def unequal_boxes() -> ParallelEnv:
    return _UnequalBoxes()


def cartpole() -> gym.Env:
    return gym.make("CartPole-v1")
