"""Environments: name resolution, vector envs, and Gymnasium's autoreset in one place.

Gymnasium >= 1.0 vector envs reset an environment on the step *after* it ends
(next-step autoreset): the step that ends an episode returns the true final
observation, and the following step ignores its action, returns the first
observation of the new episode and a reward of 0. :class:`VecEnv` marks that reset
step ``valid=False`` so it is never trained on, and the final observation stays
available to bootstrap truncated episodes. Nothing else in distrl handles autoreset.
"""

from __future__ import annotations

import difflib
import importlib
from dataclasses import dataclass

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from distrl.config import ConfigError, VecMode

SHORT_NAMES = {
    "cartpole": "CartPole-v1",
    "pendulum": "Pendulum-v1",
    "acrobot": "Acrobot-v1",
    "mountaincar": "MountainCar-v0",
    "mountaincarcontinuous": "MountainCarContinuous-v0",
    "hopper": "Hopper-v5",
    "halfcheetah": "HalfCheetah-v5",
    "walker2d": "Walker2d-v5",
    "ant": "Ant-v5",
    "humanoid": "Humanoid-v5",
    "lunarlander": "LunarLander-v3",
    "bipedalwalker": "BipedalWalker-v3",
}

# Entry-point packages whose simulators come from an optional extra.
_EXTRAS = {"gymnasium.envs.mujoco": "mujoco", "gymnasium.envs.box2d": "box2d"}


def resolve_env_id(name: str) -> str:
    """Turn a short name, Gymnasium id or 'package.module:ClassName' into a registered id."""
    if name.lower() in SHORT_NAMES:
        return SHORT_NAMES[name.lower()]
    if name in gym.registry:
        return name
    if ":" in name:
        return _register_custom(name)
    candidates = list(gym.registry) + list(SHORT_NAMES)
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.pprint_registry()"
    raise ConfigError(f"env={name!r} is not a registered Gymnasium id or short name{hint}")


def portable_env_name(name: str) -> str:
    """``name`` as any other process can resolve it: the registered id, or for a custom class its
    'package.module:ClassName' (the ``custom/`` id exists only where it was registered)."""
    env_id = resolve_env_id(name)
    return name if env_id.startswith("custom/") and ":" in name else env_id


def _register_custom(entry_point: str) -> str:
    module_name, _, class_name = entry_point.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"env={entry_point!r}: cannot import module {module_name!r} ({exc})") from None
    if not hasattr(module, class_name):
        raise ConfigError(f"env={entry_point!r}: module {module_name!r} has no {class_name!r}")
    env_id = f"custom/{class_name}-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=entry_point)
    return env_id


def required_extra(env_id: str) -> str | None:
    """The distrl extra that provides ``env_id``'s simulator, if any."""
    entry = str(gym.spec(env_id).entry_point)
    return next((extra for pkg, extra in _EXTRAS.items() if entry.startswith(pkg)), None)


def _dependency_error(env_id: str, exc: Exception) -> ConfigError:
    extra = required_extra(env_id)
    if extra is None:
        return ConfigError(f"env={env_id!r} cannot be created: {exc}")
    return ConfigError(f"env={env_id!r} needs the {extra} extra: pip install 'distrl[{extra}]' ({exc})")


def make_vector_env(env_id: str, n_envs: int, mode: VecMode = "auto", **env_kwargs: object) -> gym.vector.VectorEnv | OneEnv:
    """A Gymnasium vector env with next-step autoreset.

    ``native`` uses the env's own vector implementation (e.g. CartPole's, which steps
    all environments in one numpy call); ``auto`` uses it when the env has one and
    falls back to ``sync`` otherwise, or to :class:`OneEnv` for a single environment.
    """
    spec = gym.spec(env_id)
    has_native = spec.vector_entry_point is not None
    if mode == "native" and not has_native:
        raise ConfigError(f"vec='native' is not available for {env_id}: it has no vector entry point; use sync or async")
    if mode == "auto":
        mode = "native" if has_native and not env_kwargs else "sync"
        if mode == "sync" and n_envs == 1:
            mode = "one"
    try:
        if mode == "one":
            return OneEnv(gym.make(env_id, **env_kwargs))
        if mode == "native":
            env = gym.make_vec(env_id, num_envs=n_envs, vectorization_mode="vector_entry_point", **env_kwargs)
        else:
            env = gym.make_vec(env_id, num_envs=n_envs, vectorization_mode=mode,
                               vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}, **env_kwargs)
    except (gym.error.DependencyNotInstalled, ImportError, ModuleNotFoundError) as exc:
        raise _dependency_error(env_id, exc) from None
    autoreset = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if autoreset != AutoresetMode.NEXT_STEP:
        env.close()
        raise ConfigError(f"env={env_id!r} uses autoreset mode {autoreset}; distrl needs NEXT_STEP")
    return env


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
        return np.array(obs)[None], {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._needs_reset:  # the step after an episode's end is the reset step
            obs, _ = self.env.reset()
            self._needs_reset = False
            return np.array(obs)[None], np.zeros(1), np.zeros(1, dtype=bool), np.zeros(1, dtype=bool), {}
        obs, reward, terminated, truncated, _ = self.env.step(actions[0])
        self._needs_reset = bool(terminated or truncated)
        return (np.array(obs)[None], np.array([reward], dtype=np.float64), np.array([terminated], dtype=bool),
                np.array([truncated], dtype=bool), {})

    def close(self) -> None:
        self.env.close()


_NO_EPISODES = np.zeros(0, dtype=np.float64)
_NO_LENGTHS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Step:
    """One vector step as distrl sees it; arrays are [n_envs].

    ``obs`` after a step that ended an episode is that episode's true final
    observation; ``valid`` is False on the reset step that follows it.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    episode_returns: np.ndarray
    """Undiscounted returns of the episodes that ended on this step (raw rewards)."""
    episode_lengths: np.ndarray


class VecEnv:
    """A next-step-autoreset vector env with valid-step masks and episode statistics."""

    def __init__(self, env: gym.vector.VectorEnv | OneEnv, env_id: str):
        self.env = env
        self.env_id = env_id
        self.n_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        self._ended = np.zeros(self.n_envs, dtype=bool)
        self._returns = np.zeros(self.n_envs, dtype=np.float64)
        self._lengths = np.zeros(self.n_envs, dtype=np.int64)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start fresh episodes everywhere; env i is seeded ``seed + i``."""
        obs, _ = self.env.reset(seed=seed)
        self._ended[:] = False
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return obs

    def step(self, actions: np.ndarray) -> Step:
        obs, reward, terminated, truncated, _ = self.env.step(actions)
        valid = ~self._ended
        if self._ended.any():  # the reset step: its reward and flags belong to no episode
            reward = np.where(valid, reward, 0.0)
            terminated = terminated & valid
            truncated = truncated & valid
        reward = reward.astype(np.float32, copy=False)
        self._returns += reward
        self._lengths += valid
        ended = terminated | truncated
        self._ended = ended
        if not ended.any():
            return Step(obs, reward, terminated, truncated, valid, _NO_EPISODES, _NO_LENGTHS)
        episode_returns = self._returns[ended]
        episode_lengths = self._lengths[ended]
        self._returns[ended] = 0.0
        self._lengths[ended] = 0
        return Step(obs, reward, terminated, truncated, valid, episode_returns, episode_lengths)

    def close(self) -> None:
        self.env.close()


def make_env(env_id: str, n_envs: int, vec: VecMode = "auto") -> VecEnv:
    """Resolve ``env_id`` and build a :class:`VecEnv` of ``n_envs`` environments."""
    env_id = resolve_env_id(env_id)
    return VecEnv(make_vector_env(env_id, n_envs, vec), env_id)


def check_spaces(algo: str, env: VecEnv, allowed: tuple[type, ...]) -> None:
    """Fail early when ``algo`` cannot act in ``env``'s action space."""
    space = env.single_action_space
    if not isinstance(space, allowed):
        names = " or ".join(t.__name__ for t in allowed)
        raise ConfigError(f"env={env.env_id!r} has a {type(space).__name__} action space; {algo} needs {names}")
    if not isinstance(env.single_observation_space, gym.spaces.Box):
        raise ConfigError(f"env={env.env_id!r} has a {type(env.single_observation_space).__name__} "
                          "observation space; distrl needs a flat Box")
