"""Episodes played by a policy, kept whole as an offline dataset stores them.

:func:`record_episodes` steps a :class:`~distrl.envs.vector.VecEnv` with any acting function and returns each
finished episode as arrays (``observations`` T + 1 rows, ``actions``, ``rewards``, ``terminations``,
``truncations`` T rows), the layout :func:`distrl.data.minari_store.write_dataset` writes. The vector env's
next-step autoreset makes this simple: a step that ends an episode returns its true final observation, and the
step after it (the reset step, ``valid`` False) returns the next episode's first.

``epsilon`` mixes in uniformly random actions (an epsilon-greedy behaviour policy); each environment draws from
a stream of its own, seeded, so a recording is reproducible.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distrl.envs.vector import VecEnv

Act = Callable[[np.ndarray, np.ndarray], np.ndarray]
"""Env actions [N, ...] for a batch of observations [N, ...] and [N] flags of those that begin an episode (a
recurrent policy restarts its state there)."""


@dataclass
class _Open:
    """One environment's episode under way."""

    observations: list[np.ndarray] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminations: list[bool] = field(default_factory=list)
    truncations: list[bool] = field(default_factory=list)

    def close(self) -> dict[str, Any]:
        return {
            "observations": np.stack(self.observations),
            "actions": np.stack(self.actions),
            "rewards": np.asarray(self.rewards, dtype=np.float64),
            "terminations": np.asarray(self.terminations, dtype=bool),
            "truncations": np.asarray(self.truncations, dtype=bool),
        }


def record_episodes(
    env: VecEnv, act: Act, steps: int, seed: int, epsilon: float = 0.0, random: bool = False
) -> list[dict[str, Any]]:
    """Play ``act`` (or, with ``random``, uniformly random actions) in ``env`` until the finished episodes hold at
    least ``steps`` transitions; the episodes in the order they finished (an episode still under way then is
    dropped: a dataset holds whole episodes). With ``epsilon`` each action is replaced, with that probability, by
    a uniformly random one.

    Environment ``i`` is reset with ``seed + i`` and draws its random actions from its own stream keyed by
    ``(seed, i)``: the same call records the same episodes."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon={epsilon}: must be in [0, 1]")
    n = env.n_envs
    space = env.single_action_space
    spaces = [_seeded(space, seed, i) for i in range(n)]
    draws = [np.random.default_rng([seed, i, 1]) for i in range(n)]
    obs = env.reset(seed=seed)
    starts = np.ones(n, dtype=bool)
    open_ = [_Open(observations=[obs[i]]) for i in range(n)]
    episodes: list[dict[str, Any]] = []
    recorded = 0
    while recorded < steps:
        actions = np.stack([s.sample() for s in spaces]) if random else np.asarray(act(obs, starts))
        if epsilon and not random:
            for i in range(n):
                if draws[i].random() < epsilon:
                    actions[i] = spaces[i].sample()
        step = env.step(actions)
        for i in range(n):
            if not step.valid[i]:  # the reset step after an episode's end: its observation begins the next
                open_[i] = _Open(observations=[step.obs[i]])
                continue
            episode = open_[i]
            episode.actions.append(np.asarray(actions[i]))
            episode.rewards.append(float(step.reward[i]))
            episode.terminations.append(bool(step.terminated[i]))
            episode.truncations.append(bool(step.truncated[i]))
            episode.observations.append(step.obs[i])
            if step.terminated[i] or step.truncated[i]:
                episodes.append(episode.close())
                recorded += len(episode.actions)
        obs, starts = step.obs, ~step.valid
    return episodes


def behaviour(deterministic: bool = True, epsilon: float = 0.0, random: bool = False) -> str:
    """How a recording chose its actions, in words for a dataset's description."""
    if random:
        return "uniformly random actions"
    chosen = "the policy's mode" if deterministic else "the policy's samples"
    return f"{chosen}, random with probability {epsilon:g}" if epsilon else chosen


def _seeded(space: Any, seed: int, i: int) -> Any:
    """A copy of ``space`` whose ``sample()`` draws from a stream of environment ``i``'s own."""
    own = copy.deepcopy(space)
    own.seed(int(np.random.SeedSequence([seed, i, 2]).generate_state(1)[0]))
    return own
