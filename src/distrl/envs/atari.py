"""The standard Atari preprocessing (Mnih et al. 2015; Machado et al. 2018), as one named family.

Per environment, innermost first:

1. ``gym.make(id, frameskip=1)``: ALE/...-v5 keeps its sticky actions (repeat_action_probability
   0.25, Machado et al. 2018's recommendation). The published PPO Atari results (Schulman et al.
   2017; openai/baselines, CleanRL) used ``NoFrameskip-v4`` without sticky actions; pass
   ``--env-kwargs repeat_action_probability=0.0`` to match them.
2. Gymnasium's ``AtariPreprocessing``: up to 30 random no-ops at reset, frame skip 4 with the
   max over the last two frames, 84x84 greyscale, uint8.
3. :class:`GameStats`: the whole game's true score and length, in ``info`` when the game ends.
4. Training only, :class:`EpisodicLife`: a lost life ends the episode (``terminated``, so returns
   do not bootstrap across it) without resetting the game.
5. :class:`FireReset` where the game's actions include FIRE (Breakout's ball needs it); for evaluation
   also :class:`FireAfterLifeLoss`, as each life began with FIRE in training.
6. Training only: rewards clipped to their sign.
7. ``FrameStackObservation``: the last 4 frames, observation uint8 of shape (4, 84, 84), channels first.

A vector env counts an episode when ``info["game_over"]`` says the game ended, with the return
and length from ``info["game_return"]``/``info["game_length"]`` (see ``distrl.envs.vector.VecEnv``):
monitor.csv and evaluation report real game scores, never per-life clipped sums.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation, TransformReward

NOOP_MAX = 30
FRAME_SKIP = 4
SCREEN_SIZE = 84
FRAME_STACK = 4


class GameStats(gym.Wrapper):
    """Adds ``game_over`` to every step's info; at a game's end also its unclipped ``game_return``
    and ``game_length`` (agent steps), summed over all its lives."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.game_return = 0.0
        self.game_length = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.game_return, self.game_length = 0.0, 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_return += float(reward)
        self.game_length += 1
        info = dict(info, game_over=bool(terminated or truncated))
        if info["game_over"]:
            info.update(game_return=self.game_return, game_length=self.game_length)
        return obs, reward, terminated, truncated, info


class EpisodicLife(gym.Wrapper):
    """A lost life is a terminated episode for the learner; the game goes on (a no-op step stands in
    for the reset) until it is really over (Mnih et al. 2015; baselines' EpisodicLifeEnv)."""

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        if self.game_over:
            obs, info = self.env.reset(**kwargs)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(**kwargs)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


class FireReset(gym.Wrapper):
    """Press FIRE (then action 2) after a reset: games such as Breakout wait for it (baselines' FireResetEnv)."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        self.env.reset(**kwargs)
        for action in (1, 2):
            obs, _, terminated, truncated, info = self.env.step(action)
            if terminated or truncated:
                return self.env.reset(**kwargs)
        return obs, info


class FireAfterLifeLoss(gym.Wrapper):
    """Evaluation only: press FIRE when a life is lost and the game goes on.

    In training every life is an episode and begins through :class:`FireReset`, so a policy never
    needs to learn to serve; evaluated on whole games without that, it would leave Breakout waiting
    for the ball until the game's time limit (108,000 frames).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self.lives = 0

    def reset(self, **kwargs: Any) -> tuple[Any, dict]:
        obs, info = self.env.reset(**kwargs)
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives and not (terminated or truncated):
            obs, fire_reward, terminated, truncated, info = self.env.step(1)
            reward += fire_reward
        self.lives = self.env.unwrapped.ale.lives()
        return obs, reward, terminated, truncated, info


def has_fire(env: gym.Env) -> bool:
    meanings = env.unwrapped.get_action_meanings()
    return len(meanings) >= 3 and meanings[1] == "FIRE"


def wrap_game(env: gym.Env, training: bool) -> gym.Env:
    """Steps 3-7 above on an env with ``unwrapped.ale.lives()`` and ``get_action_meanings()``."""
    env = GameStats(env)
    if training:
        env = EpisodicLife(env)
    if has_fire(env):
        env = FireReset(env) if training else FireAfterLifeLoss(FireReset(env))
    if training:
        env = TransformReward(env, lambda r: float(np.sign(r)))
    return FrameStackObservation(env, FRAME_STACK)


def make_atari(env_id: str, env_kwargs: dict[str, Any], training: bool, render_mode: str | None = None) -> gym.Env:
    """One preprocessed Atari env; ``training`` adds episodic life and reward clipping."""
    kwargs = {"frameskip": 1, **env_kwargs}  # AtariPreprocessing skips frames itself
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    env = gym.make(env_id, **kwargs)
    env = AtariPreprocessing(
        env, noop_max=NOOP_MAX, frame_skip=FRAME_SKIP, screen_size=SCREEN_SIZE, grayscale_obs=True, scale_obs=False
    )
    return wrap_game(env, training)
