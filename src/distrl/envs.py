"""Environments: name resolution, vector envs, and Gymnasium's autoreset in one place.

Gymnasium >= 1.0 vector envs reset an environment on the step *after* it ends
(next-step autoreset): the step that ends an episode returns the true final
observation, and the following step ignores its action, returns the first
observation of the new episode and a reward of 0. :class:`VecEnv` marks that reset
step ``valid=False`` so it is never trained on, and the final observation stays
available to bootstrap truncated episodes. Nothing else in distrl handles autoreset.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

from distrl.config import ConfigError, VecMode, parse_env_kwargs
from distrl.spaces import DictLayout

if TYPE_CHECKING:
    from distrl.config import RunConfig

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
    "breakout": "ALE/Breakout-v5",
    "pong": "ALE/Pong-v5",
}

# Entry-point packages whose simulators come from an optional extra.
_EXTRAS = {"gymnasium.envs.mujoco": "mujoco", "gymnasium.envs.box2d": "box2d"}


ENTRY_POINT_RULE = "an entry point must be a gymnasium.Env subclass or a function returning a gymnasium.Env"
MEMORY = "memory:"
"""Prefix of the names of Python objects handed to the API (env instances, factories, wrappers): they
exist only in the process that was given them."""

_CUSTOM: dict[str, str] = {}
"""Registered ``custom/...`` ids -> the 'package.module:Name' entry point they were registered from."""
_OBJECTS: dict[str, Any] = {}
"""``memory:...`` names -> the object (an _Instance, an env factory or a wrapper)."""


def resolve_env_id(name: str) -> str:
    """Turn a short name, Gymnasium id, 'package.module:ClassName' or 'package.module:function' into a
    registered id (or the ``memory:`` name of an object given to the API in this process)."""
    if name.startswith(MEMORY):
        if name in _OBJECTS:
            return name
        raise ConfigError(f"env={name!r} was a Python object given to the API in the process that trained this run; "
                          "it cannot be rebuilt here: pass the env again, e.g. PPO.load(path, env=...)")
    if name.lower() in SHORT_NAMES:
        name = SHORT_NAMES[name.lower()]
    if name in gym.registry:
        return name
    if name.startswith("ALE/") and _register_ale() and name in gym.registry:
        return name
    if name.startswith("custom/"):
        class_name = name[len("custom/"):].rsplit("-v", 1)[0]
        raise ConfigError(f"env={name!r} was registered from a 'package.module:{class_name}' entry point in the "
                          "process that trained this run, and the run does not record which (runs saved before "
                          f"distrl recorded entry points): name it, e.g. --env mypkg.envs:{class_name}")
    if ":" in name:
        return _register_custom(name)
    candidates = list(gym.registry) + list(SHORT_NAMES)
    close = difflib.get_close_matches(name, candidates, n=3, cutoff=0.6)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.pprint_registry()"
    raise ConfigError(f"env={name!r} is not a registered Gymnasium id or short name{hint}")


def _register_ale() -> bool:
    """Register ale-py's ``ALE/...`` ids (its wheel ships the ROMs), so users need not import it themselves."""
    try:
        import ale_py
    except ImportError:
        raise ConfigError("ALE/... ids need ale-py: pip install 'distrl[atari]'") from None
    gym.register_envs(ale_py)
    return True


def portable_env_name(name: str) -> str:
    """``name`` as any other process can resolve it: the registered id, or for a custom class or function
    its 'package.module:Name' (the ``custom/`` id exists only where it was registered). A ``memory:`` name
    stays as it is: the object it names cannot be rebuilt elsewhere."""
    env_id = resolve_env_id(name)
    return _CUSTOM.get(env_id, env_id)


def _import_attr(field: str, entry_point: str) -> Any:
    """The object 'package.module:Name' (Name may be dotted, Outer.Inner) names; a ConfigError naming ``field``."""
    module_name, _, attr = entry_point.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"{field}={entry_point!r}: cannot import module {module_name!r} ({exc})") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise ConfigError(f"{field}={entry_point!r}: module {module_name!r} has no {attr!r}")
        obj = getattr(obj, part)
    return obj


def _register_custom(entry_point: str) -> str:
    """Register a class or factory under ``custom/<Name>-v0`` (checked: an Env subclass or a Python function)."""
    obj = _import_attr("env", entry_point)
    if isinstance(obj, type):
        if not issubclass(obj, gym.Env):
            raise ConfigError(f"env={entry_point!r} is a class that does not subclass gymnasium.Env: {ENTRY_POINT_RULE}")
        creator: Any = entry_point
    elif inspect.isfunction(obj) or inspect.ismethod(obj):  # not builtins: os:system is no env factory
        creator = partial(_call_factory, entry_point)
    else:
        raise ConfigError(f"env={entry_point!r} is a {type(obj).__name__}, not an environment: {ENTRY_POINT_RULE}")
    name = entry_point.partition(":")[2]
    env_id = f"custom/{name}-v0"
    if _CUSTOM.get(env_id, entry_point) != entry_point:  # another module's class of the same name
        env_id = f"custom/{entry_point.replace(':', '.')}-v0"
    if env_id not in gym.registry:
        gym.register(id=env_id, entry_point=creator)
        _CUSTOM[env_id] = entry_point
    return env_id


def _call_factory(entry_point: str, **kwargs: Any) -> gym.Env:
    env = _import_attr("env", entry_point)(**kwargs)
    if not isinstance(env, gym.Env):
        raise ConfigError(f"env={entry_point!r} returned a {type(env).__name__}, not a gymnasium.Env: {ENTRY_POINT_RULE}")
    return env


def _load_wrapper(name: str) -> Callable[[gym.Env], gym.Env]:
    if name.startswith(MEMORY):
        if name not in _OBJECTS:
            raise ConfigError(f"wrappers: {name!r} was a Python function given to the API in the process that "
                              "trained this run; pass it again, e.g. PPO.load(path, wrappers=[...])")
        return _OBJECTS[name]
    wrapper = _import_attr("wrappers", name)
    if not callable(wrapper):
        raise ConfigError(f"wrappers: {name!r} is a {type(wrapper).__name__}: a wrapper must be a function fn(env) -> env")
    return wrapper


def _apply_wrappers(env: gym.Env, wrappers: tuple[str, ...]) -> gym.Env:
    for name in wrappers:
        wrapped = _load_wrapper(name)(env)
        if not isinstance(wrapped, gym.Env):
            env.close()
            raise ConfigError(f"wrappers: {name!r} returned a {type(wrapped).__name__}, not a gymnasium.Env: "
                              "a wrapper must be a function fn(env) -> env")
        env = wrapped
    return env


# ---- Python objects handed to the API ----

class _Instance:
    """An env instance without a spec: the first environment built is the instance itself; evaluation
    environments are deep copies of it."""

    def __init__(self, env: gym.Env):
        self.env = env
        self.handed_out = False

    def __call__(self, **kwargs: Any) -> gym.Env:
        if kwargs:
            raise ConfigError(f"env_kwargs={kwargs!r}: an env instance takes no constructor arguments")
        if not self.handed_out:
            self.handed_out = True
            return self.env
        return copy.deepcopy(self.env)


def _importable_name(obj: Any) -> str | None:
    """'module:qualname' when another process can import ``obj`` by that name."""
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not module or not qualname or module == "__main__" or "<" in qualname:
        return None
    try:
        found: Any = importlib.import_module(module)
        for part in qualname.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError):
        return None
    return f"{module}:{qualname}" if found is obj else None


def object_name(obj: Any, label: str) -> str:
    """How config.json names a Python object handed to the API: 'module:qualname' when another process
    can import it, else a ``memory:`` name valid in this process only."""
    return _importable_name(obj) or _remember(obj, label)


def remembered(name: str) -> Any | None:
    """The object behind a ``memory:`` name, if this process was given it."""
    return _OBJECTS.get(name)


def _remember(obj: Any, label: str) -> str:
    name = f"{MEMORY}{label}-{len(_OBJECTS) + 1}"
    _OBJECTS[name] = obj
    return name


def _format_kwarg(key: str, value: Any) -> str | None:
    """``key=value`` when parsing it gives ``value`` back (see config.parse_env_kwargs)."""
    if value is None or isinstance(value, (bool, int, float, str)):
        text = {True: "true", False: "false"}.get(value, "none") if value is None or isinstance(value, bool) else (
            repr(value) if isinstance(value, float) else str(value))
        back = parse_env_kwargs([f"{key}={text}"])[key]
        if back == value and type(back) is type(value):
            return f"{key}={text}"
    return None


def _spec_as_id(spec: gym.envs.registration.EnvSpec) -> tuple[str, tuple[str, ...]] | None:
    """An instance's spec as (registered id, env_kwargs) when ``gym.make`` rebuilds it from those alone."""
    if spec.id not in gym.registry or spec.additional_wrappers:
        return None
    registered = gym.spec(spec.id)
    changed = {k: v for k, v in spec.kwargs.items() if k not in registered.kwargs or registered.kwargs[k] != v}
    if spec.max_episode_steps != registered.max_episode_steps:
        changed["max_episode_steps"] = spec.max_episode_steps
    items = [_format_kwarg(k, v) for k, v in changed.items()]
    if any(item is None for item in items):
        return None
    return spec.id, tuple(item for item in items if item is not None)


def env_source(env: Any) -> tuple[str, tuple[str, ...]]:
    """What the Python API was given as ``env``, as ``(RunConfig.env, extra env_kwargs)``.

    - a name (id, short name, 'package.module:Name'): itself;
    - a ``gymnasium.Env`` with a spec that ``gym.make`` rebuilds from its id and scalar kwargs: that id and
      those kwargs (portable; copies are made, the instance itself is not stepped); with another spec
      (e.g. wrappers applied to it) copies are made with ``gym.make(spec)``, valid in this process only;
      without a spec, the instance itself (``n_envs`` must be 1; evaluation envs are deep copies of it);
    - a callable (class or function) returning an env: called once per env; portable as
      'module:qualname' when importable, else valid in this process only.
    """
    if isinstance(env, str):
        return env, ()
    if isinstance(env, gym.Env):
        spec = env.spec
        if spec is not None:
            rebuilt = _spec_as_id(spec)
            if rebuilt is not None:
                return rebuilt
            return _remember(partial(gym.make, spec), spec.id.replace("/", "_")), ()
        return _remember(_Instance(env), type(env.unwrapped).__name__), ()
    if callable(env):
        name = _importable_name(env)
        if name is not None:
            return name, ()
        return _remember(env, getattr(env, "__name__", type(env).__name__).strip("<>")), ()
    raise ConfigError(f"env={env!r} is not allowed: must be an env id, a gymnasium.Env or a function returning one")


def env_kwargs_items(env_kwargs: Any) -> tuple[str, ...]:
    """API ``env_kwargs=`` (a dict, or "key=value" strings) as RunConfig items, recordable in config.json."""
    if env_kwargs is None:
        return ()
    if not isinstance(env_kwargs, dict):
        items = (env_kwargs,) if isinstance(env_kwargs, str) else tuple(env_kwargs)
        parse_env_kwargs(items)
        return items
    items = []
    for key, value in env_kwargs.items():
        item = _format_kwarg(str(key), value)
        if item is None:
            raise ConfigError(f"env_kwargs: {key}={value!r} cannot be recorded in config.json (values must be "
                              "bool, int, float, str or None): pass a function that makes the env instead")
        items.append(item)
    return tuple(items)


def wrapper_names(wrappers: Any) -> tuple[str, ...]:
    """API ``wrappers=`` (names or callables) as RunConfig names: 'module:qualname' when importable."""
    if isinstance(wrappers, str) or callable(wrappers):
        wrappers = [wrappers]
    names = []
    for wrapper in wrappers:
        if isinstance(wrapper, str):
            names.append(wrapper)
        elif callable(wrapper):
            names.append(object_name(wrapper, getattr(wrapper, "__name__", "wrapper").strip("<>")))
        else:
            raise ConfigError(f"wrappers: {wrapper!r} is not allowed: must be 'package.module:function' or a function")
    return tuple(names)


def required_extra(env_id: str) -> str | None:
    """The distrl extra that provides ``env_id``'s simulator, if any."""
    if env_id not in gym.registry:
        return None
    entry = str(gym.spec(env_id).entry_point)
    return next((extra for pkg, extra in _EXTRAS.items() if entry.startswith(pkg)), None)


def _dependency_error(env_id: str, exc: Exception) -> ConfigError:
    extra = required_extra(env_id)
    if extra is None:
        return ConfigError(f"env={env_id!r} cannot be created: {exc}")
    return ConfigError(f"env={env_id!r} needs the {extra} extra: pip install 'distrl[{extra}]' ({exc})")


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` (resolved) is one of ale-py's Atari games."""
    return env_id in gym.registry and str(gym.spec(env_id).entry_point).startswith("ale_py")


def make_single_env(name: str, env_kwargs: dict[str, Any] | None = None, wrappers: tuple[str, ...] = (),
                    render_mode: str | None = None, atari_wrappers: bool = True, evaluation: bool = False) -> gym.Env:
    """One environment: ``name`` built with ``env_kwargs``, then ``wrappers`` applied in order.

    Atari games get distrl's Atari preprocessing first (unless ``atari_wrappers`` is False); with
    ``evaluation`` it leaves out episodic life and reward clipping. Module-level so that async vector
    envs can run it in their worker processes.
    """
    env_id = resolve_env_id(name)
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        if atari_wrappers and is_atari(env_id):
            from distrl.atari import make_atari

            env = make_atari(env_id, dict(env_kwargs or {}), training=not evaluation, render_mode=render_mode)
        elif env_id in _OBJECTS:
            env = _OBJECTS[env_id](**kwargs)
        else:
            env = gym.make(env_id, **kwargs)
    except TypeError as exc:
        if not env_kwargs:
            raise
        raise ConfigError(f"env_kwargs={_kwargs_text(env_kwargs)} is not accepted by {name}: {exc}") from None
    return _apply_wrappers(env, wrappers)


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in kwargs.items())


def _native_accepts(spec: gym.envs.registration.EnvSpec, env_kwargs: dict[str, Any]) -> bool:
    """Whether the env's vector entry point takes every one of ``env_kwargs``."""
    creator = spec.vector_entry_point
    creator = creator if callable(creator) else load_env_creator(creator)  # type: ignore[arg-type]
    params = inspect.signature(creator).parameters
    return all(k in params for k in env_kwargs) or any(p.kind is p.VAR_KEYWORD for p in params.values())


def make_vector_env(env_id: str, n_envs: int, mode: VecMode = "auto", env_kwargs: dict[str, Any] | None = None,
                    wrappers: tuple[str, ...] = (), atari_wrappers: bool = True,
                    evaluation: bool = False) -> gym.vector.VectorEnv | OneEnv:
    """A Gymnasium vector env with next-step autoreset.

    ``native`` uses the env's own vector implementation (e.g. CartPole's, which steps
    all environments in one numpy call); ``auto`` uses it when the env has one that takes
    ``env_kwargs`` and there are no wrappers, and falls back to ``sync`` otherwise, or to
    :class:`OneEnv` for a single environment.
    """
    env_kwargs = dict(env_kwargs or {})
    spec = gym.spec(env_id) if env_id in gym.registry else None
    has_native = spec is not None and spec.vector_entry_point is not None
    atari = atari_wrappers and is_atari(env_id)
    native_ok = has_native and not wrappers and not atari and _native_accepts(spec, env_kwargs)  # type: ignore[arg-type]
    if mode == "native" and not native_ok:
        why = ("it has no vector entry point" if not has_native else
               "wrappers apply to single envs" if wrappers else
               "distrl's Atari preprocessing applies to single envs (--no-atari-wrappers turns it off)" if atari else
               f"its vector entry point does not take env_kwargs {_kwargs_text(env_kwargs)}")
        raise ConfigError(f"vec='native' is not available for {env_id}: {why}; use sync or async")
    if mode == "auto":  # not ale-py's AtariVectorEnv: it preprocesses in its own way (ask for it with native)
        mode = "native" if native_ok and not is_atari(env_id) else "sync"
        if mode == "sync" and n_envs == 1:
            mode = "one"
    source = _OBJECTS.get(env_id)
    if isinstance(source, _Instance) and not source.handed_out and n_envs != 1:
        raise ConfigError(f"n_envs={n_envs} is not allowed with an env instance that has no spec "
                          f"({type(source.env.unwrapped).__name__}): must be 1, or pass a function that makes the env")
    make_one = partial(make_single_env, portable_env_name(env_id), env_kwargs, tuple(wrappers),
                       atari_wrappers=atari_wrappers, evaluation=evaluation)
    try:
        if mode == "one":
            return OneEnv(make_one())
        if mode == "native":
            env = gym.make_vec(env_id, num_envs=n_envs, vectorization_mode="vector_entry_point", **env_kwargs)
        elif mode == "sync":
            env = gym.vector.SyncVectorEnv([make_one] * n_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
        else:
            if wrappers or env_id in _CUSTOM or env_id in _OBJECTS:  # user code: fail here, not in a worker process
                make_one().close()
            env = gym.vector.AsyncVectorEnv([make_one] * n_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
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
        return _one(obs), {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        if self._needs_reset:  # the step after an episode's end is the reset step
            obs, _ = self.env.reset()
            self._needs_reset = False
            return _one(obs), np.zeros(1), np.zeros(1, dtype=bool), np.zeros(1, dtype=bool), {}
        obs, reward, terminated, truncated, info = self.env.step(actions[0])
        self._needs_reset = bool(terminated or truncated)
        games = {key: np.array([info[key]]) for key in GAME_KEYS if key in info}  # only what VecEnv reads
        return (_one(obs), np.array([reward], dtype=np.float64), np.array([terminated], dtype=bool),
                np.array([truncated], dtype=bool), games)

    def close(self) -> None:
        self.env.close()


GAME_KEYS = ("game_over", "game_return", "game_length")
"""Info keys of envs that keep whole-game statistics (see distrl.atari.GameStats)."""
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
    episode_ends: np.ndarray | None = None
    """[n_envs] bool: where the episodes of episode_returns ended; None means wherever terminated | truncated.
    They differ for envs that count whole games while an episode is a life (distrl.atari)."""


def _one(obs: Any) -> Any:
    """One env's observation with a batch axis of 1 (each part of a Dict observation)."""
    if isinstance(obs, dict):
        return {key: np.asarray(value)[None] for key, value in obs.items()}
    return np.array(obs)[None]


class VecEnv:
    """A next-step-autoreset vector env with valid-step masks and episode statistics.

    Dict observations come out packed, one uint8 row per env (:class:`~distrl.spaces.DictLayout`);
    ``single_observation_space`` stays the env's Dict space, which the encoder is built from.
    """

    def __init__(self, env: gym.vector.VectorEnv | OneEnv, env_id: str):
        self.env = env
        self.env_id = env_id
        self.n_envs = env.num_envs
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        space = self.single_observation_space
        self._layout = DictLayout(space) if isinstance(space, gym.spaces.Dict) else None
        self._ended = np.zeros(self.n_envs, dtype=bool)
        self._returns = np.zeros(self.n_envs, dtype=np.float64)
        self._lengths = np.zeros(self.n_envs, dtype=np.int64)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start fresh episodes everywhere; env i is seeded ``seed + i``."""
        obs, _ = self.env.reset(seed=seed)
        self._ended[:] = False
        self._returns[:] = 0.0
        self._lengths[:] = 0
        return obs if self._layout is None else self._layout.pack(obs)

    def step(self, actions: np.ndarray) -> Step:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self._layout is not None:
            obs = self._layout.pack(obs)
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
        if "game_over" in info:  # the env counts whole games (unclipped) and an episode may be one life
            over = ended & info["game_over"] & info.get("_game_over", True)
            self._returns[ended] = 0.0
            self._lengths[ended] = 0
            if not over.any():
                return Step(obs, reward, terminated, truncated, valid, _NO_EPISODES, _NO_LENGTHS, over)
            return Step(obs, reward, terminated, truncated, valid, info["game_return"][over].astype(np.float64),
                        info["game_length"][over].astype(np.int64), over)
        episode_returns = self._returns[ended]
        episode_lengths = self._lengths[ended]
        self._returns[ended] = 0.0
        self._lengths[ended] = 0
        return Step(obs, reward, terminated, truncated, valid, episode_returns, episode_lengths)

    def close(self) -> None:
        self.env.close()


def make_env(env_id: str, n_envs: int, vec: VecMode = "auto", env_kwargs: dict[str, Any] | None = None,
             wrappers: tuple[str, ...] = (), atari_wrappers: bool = True, evaluation: bool = False) -> VecEnv:
    """Resolve ``env_id`` and build a :class:`VecEnv` of ``n_envs`` environments, each built with
    ``env_kwargs`` and wrapped by ``wrappers`` ('package.module:function', applied in order); Atari
    games are preprocessed first (see :mod:`distrl.atari`; ``evaluation``: no episodic life, no clipping)."""
    env_id = resolve_env_id(env_id)
    return VecEnv(make_vector_env(env_id, n_envs, vec, env_kwargs, tuple(wrappers), atari_wrappers, evaluation), env_id)


def make_run_env(run: RunConfig, n_envs: int, env_id: str | None = None, evaluation: bool = False) -> VecEnv:
    """The run's environments (``run.env``, or ``env_id``) with the run's env_kwargs and wrappers:
    every trainer, evaluation, resume and remote worker builds its envs here."""
    return make_env(env_id or run.env, n_envs, run.vec, parse_env_kwargs(run.env_kwargs), run.wrappers,
                    run.atari_wrappers, evaluation)


def check_spaces(algo: str, env: VecEnv, allowed: tuple[type, ...]) -> None:
    """Fail early when ``algo`` cannot act in ``env``'s action space."""
    space = env.single_action_space
    if not isinstance(space, allowed):
        names = " or ".join(t.__name__ for t in allowed)
        raise ConfigError(f"env={env.env_id!r} has a {type(space).__name__} action space; {algo} needs {names}")
    if not isinstance(env.single_observation_space, gym.spaces.Box):
        raise ConfigError(f"env={env.env_id!r} has a {type(env.single_observation_space).__name__} "
                          "observation space; distrl needs a flat Box")
