"""What ``--preset auto`` gives an env that has no preset: a fallback, chosen from the env's spaces.

A preset is tuned for one env (:mod:`distrl.training.presets`). An env without one gets its algorithm's library
defaults, unless a fallback below fits its spaces: a setting for a family of envs of one kind and size. DQN's
library defaults are stable-baselines3's, which are set for Atari (Adam at 1e-4, a target copied every 10,000
steps, a 1M-transition buffer); they learn none of the classic-control and Box2D tasks at the budgets those tasks
are given (50k-120k steps). DQN's ``small-control`` fallback does: see "DQN without a preset" in
docs/benchmarks.md. Images and everything else larger keep the library defaults.

An env that has a preset keeps it, ``--preset none`` keeps the library defaults for every env, and flags win over
a fallback as they do over a preset. A run says which applied in its first line (:func:`preset_line`; from
``TrainerBase.begin``, once every check before the run has passed).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gymnasium import spaces

    from distrl.config import RunConfig

# What rl-baselines3-zoo's tuned DQN entries for the classic-control and Box2D tasks (hyperparams/dqn.yml:
# CartPole-v1, Acrobot-v1, MountainCar-v0, LunarLander-v2) have in common: 256x256 networks, batches of 128, a
# target copied every few hundred steps, epsilon falling to about 0.1 over the first 12-20% of the run. The
# values are its Acrobot and LunarLander entries' (the same two), with 1,000 random steps first and 8 gradient
# steps every 16 env steps, as its MountainCar entry. The policy changes every 16 steps rather than every 4 (the
# Acrobot entry's): on MountainCar-v0 (seed 0, 120k steps) that is what took the car to the flag, with these
# values or the MountainCar entry's own; every 4 steps (2 gradient steps each) it never got there with either
# (docs/benchmarks.md, "DQN without a preset").
_SMALL_CONTROL_DQN = dict(
    learning_rate=6.3e-4,
    batch_size=128,
    buffer_size=50_000,
    learning_starts=1_000,
    gamma=0.99,
    target_update_interval=250,
    train_freq=16,
    gradient_steps=8,
    exploration_fraction=0.12,
    exploration_final_eps=0.1,
    net_arch=(256, 256),
)


@dataclass(frozen=True)
class Fallback:
    """Settings for the envs whose observations are flat vectors of at most ``max_features`` numbers and whose
    actions are one Discrete choice among at most ``max_actions``."""

    name: str
    values: dict[str, Any]
    """Fields of the algorithm's config, as a preset holds them (never ``total_steps``: the budget is the env's)."""
    max_features: int
    max_actions: int

    def fits(self, observation_space: spaces.Space, action_space: spaces.Space) -> bool:
        from gymnasium import spaces

        from distrl.envs.spaces import is_vector

        return (
            is_vector(observation_space)
            and len(observation_space.shape) == 1
            and observation_space.shape[0] <= self.max_features
            and isinstance(action_space, spaces.Discrete)
            and int(action_space.n) <= self.max_actions
        )


FALLBACKS: dict[str, tuple[Fallback, ...]] = {
    # measured on 2-8 features and 2-4 actions; the bounds leave room for tasks of that size, not for RAM
    # observations (128 bytes) or full Atari action sets (18)
    "dqn": (Fallback("small-control", _SMALL_CONTROL_DQN, max_features=64, max_actions=16),),
}
"""Per algorithm, its fallbacks in the order they are tried; the first that fits the env's spaces applies."""


@dataclass(frozen=True)
class Choice:
    """The fallback an env gets (None: the library defaults) and the spaces that decided it, in words."""

    fallback: Fallback | None
    spaces: str
    """E.g. "2-feature vector observations, 3 actions"."""

    @property
    def values(self) -> dict[str, Any]:
        return dict(self.fallback.values) if self.fallback is not None else {}


def choose_fallback(algo: str, observation_space: spaces.Space, action_space: spaces.Space) -> Choice:
    """The first of ``algo``'s fallbacks that fits these spaces, or the library defaults."""
    found = next((f for f in FALLBACKS.get(algo, ()) if f.fits(observation_space, action_space)), None)
    return Choice(found, describe_spaces(observation_space, action_space))


def has_fallbacks(algo: str) -> bool:
    return bool(FALLBACKS.get(algo))


def fallback_for_run(run: RunConfig) -> Choice:
    """:func:`choose_fallback` for the run's env as its workers will build it (its env_kwargs and wrappers), built
    once here to read its spaces."""
    from distrl.envs.vector import make_run_env

    env = make_run_env(run, 1)
    try:
        return choose_fallback(run.algo, env.single_observation_space, env.single_action_space)
    finally:
        env.close()


def describe_spaces(observation_space: spaces.Space, action_space: spaces.Space) -> str:
    """The spaces as a fallback reads them: "2-feature vector observations, 3 actions", "image observations,
    Box actions"."""
    from gymnasium import spaces

    from distrl.envs.spaces import is_image, is_vector

    if is_image(observation_space):
        observations = "image observations"
    elif is_vector(observation_space) and len(observation_space.shape) == 1:
        observations = f"{observation_space.shape[0]}-feature vector observations"
    elif is_vector(observation_space):
        observations = f"Box observations of shape {tuple(observation_space.shape)}"
    else:
        observations = f"{type(observation_space).__name__} observations"
    if isinstance(action_space, spaces.Discrete):
        return f"{observations}, {int(action_space.n)} actions"
    return f"{observations}, {type(action_space).__name__} actions"


def preset_line(env: str, choice: Choice) -> str:
    """The run's first line when ``--preset auto`` found no preset for ``env``, e.g. "preset: none for
    MountainCar-v0; fallback: small-control (2-feature vector observations, 3 actions)"."""
    if choice.fallback is None:
        return f"preset: none for {env}; fallback: none, library defaults ({choice.spaces})"
    return f"preset: none for {env}; fallback: {choice.fallback.name} ({choice.spaces})"
