"""One environment behind the part of Gymnasium's vector interface distrl uses: the single-env fast path of
:func:`distrl.envs.vector.make_vector_env`, with next-step autoreset and :meth:`OneEnv.restart`."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode


class OneEnv:
    """One environment behind the part of Gymnasium's vector interface distrl uses (next-step autoreset).

    For a single environment, SyncVectorEnv spends a sizeable part of a MuJoCo step merging
    info dicts and stacking arrays (about a fifth of the env time for Hopper, profiled); this
    steps the env directly, with the same autoreset rule and seeding, so trajectories are the
    same (tested against SyncVectorEnv).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}
    num_envs = 1

    def __init__(self, env: gym.Env):
        self.env = env
        self.single_observation_space = env.observation_space
        self.single_action_space = env.action_space
        self._needs_reset = False

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        obs, _ = self.env.reset(seed=seed)
        self._needs_reset = False
        return _one(obs), {}

    def restart(self) -> np.ndarray:
        """Begin the next episode now, after one ended: the next step is a step of it (no reset step)."""
        obs, _ = self.env.reset()
        self._needs_reset = False
        return _one(obs)

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._needs_reset:  # the step after an episode's end is the reset step
            obs, _ = self.env.reset()
            self._needs_reset = False
            return _one(obs), np.zeros(1), np.zeros(1, dtype=bool), np.zeros(1, dtype=bool), {}
        obs, reward, terminated, truncated, info = self.env.step(actions[0])
        self._needs_reset = bool(terminated or truncated)
        games = {key: np.array([info[key]]) for key in GAME_KEYS if key in info}  # only what VecEnv reads
        return (
            _one(obs),
            np.array([reward], dtype=np.float64),
            np.array([terminated], dtype=bool),
            np.array([truncated], dtype=bool),
            games,
        )

    def close(self) -> None:
        self.env.close()


GAME_KEYS = ("game_over", "game_return", "game_length")
"""Info keys of envs that keep whole-game statistics (see distrl.envs.atari.GameStats)."""


def _one(obs: Any) -> Any:
    """One env's observation with a batch axis of 1 (each part of a Dict observation)."""
    if isinstance(obs, dict):
        return {key: np.asarray(value)[None] for key, value in obs.items()}
    return np.array(obs)[None]
