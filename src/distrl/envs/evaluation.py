"""Policy evaluation: one episode per environment of a vector env, run to its end or to a step cap."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from distrl.envs.vector import VecEnv

Progress = Callable[[int, int], None]
"""Told after every vector step: (episodes finished, environment steps taken)."""


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation did: the returns of the episodes it finished, its steps and time, and its cap."""

    returns: np.ndarray
    """Undiscounted returns of the finished episodes [finished], in environment order."""
    episodes: int
    """Episodes asked for (one per environment)."""
    steps: int
    """Environment steps taken, over all the evaluation's environments."""
    max_steps: int
    """The cap on ``steps`` it ran under (0: none)."""
    seconds: float

    @property
    def finished(self) -> int:
        return len(self.returns)

    @property
    def capped(self) -> bool:
        """Whether the cap stopped it before every episode ended."""
        return self.finished < self.episodes

    @property
    def mean(self) -> float:
        """Mean return of the finished episodes; nan when none finished."""
        return float(self.returns.mean()) if self.finished else float("nan")

    @property
    def std(self) -> float:
        return float(self.returns.std()) if self.finished else float("nan")

    def headline(self) -> str:
        """The result, for an end line: "eval return 21.3 ± 4.0", and how many episodes where the cap stopped it."""
        if not self.finished:
            return "no eval return (no episode finished)"
        part = f" over {self.finished} of {self.episodes} episodes" if self.capped else ""
        return f"eval return {self.mean:.1f} ± {self.std:.1f}{part}"

    def account(self) -> str:
        """What it took and which flags change it, for an end line."""
        took = f"{self.seconds:.1f}s, {self.steps:,} env steps"
        if not self.capped:
            return f"evaluation: {self.episodes} episodes in {took} (--eval-episodes)"
        return (
            f"evaluation stopped at the cap of {self.max_steps:,} steps (--eval-max-steps, 0: none) after {took}: "
            f"{self.finished} of {self.episodes} episodes finished (--eval-episodes)"
        )


def run_episodes(
    act: Callable[[np.ndarray, np.ndarray], np.ndarray],
    env: VecEnv,
    seed: int,
    max_steps: int = 0,
    progress: Progress | None = None,
) -> Evaluation:
    """One episode in each of ``env``'s environments (one game of each copy of a multi-agent env), stopped once it
    has taken ``max_steps`` steps.

    Args:
        act: maps raw observations [n_envs, ...] and episode starts [n_envs] (True where the observation
            begins an episode: a recurrent policy restarts its state there) to env actions.
        env: its environments are reset with seeds ``seed + i``; they step together, so every vector step
            counts ``n_envs`` steps, finished or not.
        max_steps: the cap on environment steps over all environments (the last vector step may pass it by
            less than ``n_envs``); 0: none.
        progress: told (episodes finished, steps taken) after every vector step.
    """
    start = time.perf_counter()
    obs = env.reset(seed=seed)
    starts = np.ones(env.n_envs, dtype=bool)
    rows_per_episode = max(
        1, len(getattr(env, "agents", ()))
    )  # a multi-agent env's game is one episode of all its agents' rows
    returns = np.full(env.n_envs // rows_per_episode, np.nan)
    steps = 0
    while np.isnan(returns).any() and not (max_steps and steps >= max_steps):
        step = env.step(act(obs, starts))
        steps += env.n_envs
        obs, starts = step.obs, ~step.valid
        ended = step.episode_ends if step.episode_ends is not None else step.terminated | step.truncated
        if ended.any():
            # VecEnv reports returns only for the envs that ended, in env order (a game's on one of its rows)
            episode = np.flatnonzero(ended) // rows_per_episode
            first = np.isnan(returns[episode])
            returns[episode[first]] = step.episode_returns[first]
        if progress is not None:
            progress(int((~np.isnan(returns)).sum()), steps)
    done = returns[~np.isnan(returns)]
    return Evaluation(done, len(returns), steps, max_steps, time.perf_counter() - start)


def evaluate(
    act: Callable[[np.ndarray, np.ndarray], np.ndarray], env: VecEnv, seed: int, max_steps: int = 1_000_000
) -> np.ndarray:
    """Undiscounted returns of one episode in each of ``env``'s environments (see :func:`run_episodes`);
    fails if they have not all ended after ``max_steps`` vector steps."""
    result = run_episodes(act, env, seed, max_steps * env.n_envs)
    if result.capped:
        raise RuntimeError(f"evaluation did not finish {result.episodes} episodes within {max_steps} steps")
    return result.returns
