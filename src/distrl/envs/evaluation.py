"""Policy evaluation: one episode per environment of a vector env, run to its end or to a step cap."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from distrl.envs.vector import VecEnv

Progress = Callable[[int, int], None]
"""Told after every vector step: (episodes finished, environment steps of the evaluation's episodes so far)."""


@dataclass(frozen=True)
class Evaluation:
    """What one evaluation did: the returns of the episodes it finished, their steps, its time and its cap."""

    returns: np.ndarray
    """Undiscounted returns of the finished episodes [finished], in environment order."""
    episodes: int
    """Episodes asked for (one per environment)."""
    steps: int
    """Environment steps of the finished episodes: the sum of their lengths (a multi-agent game's times its
    agents, as a run counts its steps)."""
    cut_steps: int
    """Environment steps of the episodes the cap cut: those still under way when it stopped (0 if none was)."""
    steps_taken: int
    """Environment steps taken over all the evaluation's environments, what the cap counts: the environments
    step together, so one whose episode has ended steps on (into an episode nobody counts) until the last ends.
    At least ``steps + cut_steps``."""
    max_steps: int
    """The cap on ``steps_taken`` it ran under (0: none)."""
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
        """What it took and which flags change it, for an end line: the steps of the episodes it reports, and where
        the cap stopped it, those of the episodes it cut apart from them."""
        if not self.capped:
            return f"evaluation: {self.episodes} episodes in {self.seconds:.1f}s, {self.steps:,} env steps (--eval-episodes)"
        return (
            f"evaluation stopped at the cap of {self.max_steps:,} steps (--eval-max-steps, 0: none) after "
            f"{self.seconds:.1f}s, {self.steps_taken:,} env steps taken: {self.finished} of {self.episodes} episodes "
            f"finished, {self.steps:,} env steps; {self.episodes - self.finished} cut by the cap, "
            f"{self.cut_steps:,} env steps (--eval-episodes)"
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
            takes ``n_envs`` steps, though only those of environments whose episode is under way count for it.
        max_steps: the cap on environment steps taken over all environments, finished or not (the last vector
            step may pass it by less than ``n_envs``); 0: none.
        progress: told (episodes finished, steps of the episodes so far) after every vector step.
    """
    start = time.perf_counter()
    obs = env.reset(seed=seed)
    starts = np.ones(env.n_envs, dtype=bool)
    rows_per_episode = max(
        1, len(getattr(env, "agents", ()))
    )  # a multi-agent env's game is one episode of all its agents' rows
    returns = np.full(env.n_envs // rows_per_episode, np.nan)
    lengths = np.zeros(len(returns), dtype=np.int64)  # steps of each episode so far, all its rows counted
    taken = 0
    while np.isnan(returns).any() and not (max_steps and taken >= max_steps):
        lengths += np.isnan(returns) * rows_per_episode  # the step that ends an episode is one of its own
        step = env.step(act(obs, starts))
        taken += env.n_envs
        obs, starts = step.obs, ~step.valid
        ended = step.episode_ends if step.episode_ends is not None else step.terminated | step.truncated
        if ended.any():
            # VecEnv reports returns only for the envs that ended, in env order (a game's on one of its rows)
            episode = np.flatnonzero(ended) // rows_per_episode
            first = np.isnan(returns[episode])
            returns[episode[first]] = step.episode_returns[first]
        if progress is not None:
            progress(int((~np.isnan(returns)).sum()), int(lengths.sum()))
    finished = ~np.isnan(returns)
    return Evaluation(
        returns=returns[finished],
        episodes=len(returns),
        steps=int(lengths[finished].sum()),
        cut_steps=int(lengths[~finished].sum()),
        steps_taken=taken,
        max_steps=max_steps,
        seconds=time.perf_counter() - start,
    )


def evaluate(
    act: Callable[[np.ndarray, np.ndarray], np.ndarray], env: VecEnv, seed: int, max_steps: int = 1_000_000
) -> np.ndarray:
    """Undiscounted returns of one episode in each of ``env``'s environments (see :func:`run_episodes`);
    fails if they have not all ended after ``max_steps`` vector steps."""
    result = run_episodes(act, env, seed, max_steps * env.n_envs)
    if result.capped:
        raise RuntimeError(f"evaluation did not finish {result.episodes} episodes within {max_steps} steps")
    return result.returns
