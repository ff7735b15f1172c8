"""Policy evaluation: one episode per environment of a vector env, run to its end."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from distrl.envs import VecEnv


def evaluate(
    act: Callable[[np.ndarray, np.ndarray], np.ndarray], env: VecEnv, seed: int, max_steps: int = 1_000_000
) -> np.ndarray:
    """Undiscounted returns of one episode in each of ``env``'s environments.

    Args:
        act: maps raw observations [n_envs, ...] and episode starts [n_envs] (True where the observation
            begins an episode: a recurrent policy restarts its state there) to env actions.
        env: its environments are reset with seeds ``seed + i``.
    """
    obs = env.reset(seed=seed)
    starts = np.ones(env.n_envs, dtype=bool)
    returns = np.full(env.n_envs, np.nan)
    for _ in range(max_steps):
        step = env.step(act(obs, starts))
        obs, starts = step.obs, ~step.valid
        ended = step.episode_ends if step.episode_ends is not None else step.terminated | step.truncated
        if ended.any():
            first = ended & np.isnan(returns)
            # VecEnv reports returns only for the envs that ended, in env order.
            returns[np.flatnonzero(ended)[first[ended]]] = step.episode_returns[first[ended]]
        if not np.isnan(returns).any():
            return returns
    raise RuntimeError(f"evaluation did not finish {env.n_envs} episodes within {max_steps} steps")
