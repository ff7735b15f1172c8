"""``--vec envpool``: envpool's C++ vector environments behind the interface :class:`distrl.envs.vector.VecEnv` reads.

envpool steps all environments in C++ threads, outside the GIL, and for Atari does the standard
preprocessing itself. What it runs, against distrl's Gymnasium path (:mod:`distrl.envs.atari`):

- The same preprocessing: up to 30 no-ops at reset, frame skip 4 with the max over the last two
  frames, 84x84 greyscale (INTER_AREA), 4 stacked frames channels first, FIRE on reset where the
  game has it, and for training episodic life and rewards clipped to their sign. Sticky actions
  stay at ALE v5's 0.25 unless ``repeat_action_probability`` is given in env_kwargs, and a game is
  cut at 27,000 agent steps (v5's 108,000 frames).
- Two details differ: after a lost life envpool plays 0-29 no-ops before its FIRE (distrl's
  Gymnasium path plays one no-op, then FIRE and action 2), and its random streams are its own, so
  the two backends give different trajectories for one seed.
- Episodes: envpool resets an env on the step after it ended, ignoring that step's action (the
  next-step autoreset distrl's VecEnv expects). A whole game's unclipped score and length are
  counted here from envpool's ``info["reward"]`` and ``info["terminated"]`` (the game is over)
  and handed to VecEnv as ``game_over``/``game_return``/``game_length``, as
  :class:`distrl.envs.atari.GameStats` does on the Gymnasium path.
- Evaluation never uses envpool (see :func:`distrl.envs.vector.make_run_env`): its whole games without
  episodic life would leave Breakout waiting for a serve after each lost life, and evaluating on
  the Gymnasium path keeps scores comparable between backends.

Other envpool tasks (``CartPole-v1``, MuJoCo ``-v4`` ids, ...) run under the same names, with
env_kwargs passed to ``envpool.make``; episode returns are then summed by VecEnv as usual.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium.vector import AutoresetMode

from distrl.config import ConfigError

ATARI_DEFAULTS = {
    "repeat_action_probability": 0.25,
    "noop_max": 30,
    "frame_skip": 4,
    "stack_num": 4,
    "img_height": 84,
    "img_width": 84,
    "gray_scale": True,
    "use_fire_reset": True,
    "max_episode_steps": 27_000,
}
"""distrl's Atari preprocessing in envpool's option names (see the module docstring)."""


def envpool_task(env_id: str) -> str:
    """envpool's name for ``env_id``: ALE ids lose their ``ALE/`` prefix; a one-line error when envpool
    is missing or has no such task."""
    try:
        import envpool
    except ImportError as exc:
        raise ConfigError(
            f"vec='envpool' needs envpool: pip install 'distrl[envpool]' ({exc}); "
            "if it has no wheel for this Python or platform, use vec=sync or async"
        ) from None
    task = env_id.removeprefix("ALE/")
    if task not in envpool.list_all_envs():
        raise ConfigError(
            f"vec='envpool' has no task {task!r} (env={env_id!r}): envpool runs its own list of "
            "Atari, classic-control, MuJoCo, DeepMind Control and ViZDoom tasks; use vec=sync or async"
        )
    return task


class EnvPoolVector:
    """An envpool pool with next-step autoreset and, for Atari, whole-game statistics.

    envpool fixes seeds when a pool is made, so :meth:`reset` with a seed makes the pool again
    (env i gets ``seed + i``).
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, env_id: str, n_envs: int, env_kwargs: dict[str, Any], atari: bool):
        self.task = envpool_task(env_id)
        self.env_id = env_id
        self.num_envs = n_envs
        self.atari = atari
        self.kwargs = (
            {**ATARI_DEFAULTS, "episodic_life": True, "reward_clip": True, **env_kwargs} if atari else env_kwargs
        )
        self.pool = self._make(seed=0)
        self.single_observation_space = self.pool.observation_space
        self.single_action_space = self.pool.action_space
        self._ended = np.zeros(n_envs, dtype=bool)
        self._game_return = np.zeros(n_envs, dtype=np.float64)
        self._game_length = np.zeros(n_envs, dtype=np.int64)

    def _make(self, seed: int) -> Any:
        import envpool

        try:
            return envpool.make(self.task, env_type="gymnasium", num_envs=self.num_envs, seed=seed, **self.kwargs)
        except (TypeError, ValueError, RuntimeError, KeyError) as exc:
            given = " ".join(f"{k}={v}" for k, v in self.kwargs.items())
            raise ConfigError(f"env_kwargs={given} is not accepted by envpool's {self.task}: {exc}") from None

    def reset(self, seed: int | None = None) -> tuple[np.ndarray, dict]:
        if seed is not None:  # as in Gymnasium, a seed restarts the random streams even when it is the same
            self.pool.close()
            self.pool = self._make(seed)
        obs, _ = self.pool.reset()
        self._ended[:] = False
        self._game_return[:] = 0.0
        self._game_length[:] = 0
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        obs, reward, terminated, truncated, info = self.pool.step(np.asarray(actions))
        terminated = np.asarray(terminated, dtype=bool)
        truncated = np.asarray(truncated, dtype=bool)
        if not self.atari:
            return obs, reward, terminated, truncated, {}
        valid = ~self._ended  # the step after an end is envpool's reset step
        self._ended = terminated | truncated
        self._game_return += np.where(valid, info["reward"], 0.0)
        self._game_length += valid
        over = valid & ((np.asarray(info["terminated"], dtype=bool) & terminated) | truncated)
        games = {"game_over": over, "game_return": self._game_return.copy(), "game_length": self._game_length.copy()}
        self._game_return[over] = 0.0
        self._game_length[over] = 0
        return obs, reward, terminated, truncated, games

    def close(self) -> None:
        self.pool.close()
