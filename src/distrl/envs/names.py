"""Environment names: short names, Gymnasium ids, entry points, and the Python objects the API is given.

Everything that turns what a user typed or passed (``cartpole``, ``ALE/Pong-v5``,
``package.module:ClassName``, ``package.module:function``, a ``gymnasium.Env``, a wrapper function)
into something every process of a run can rebuild, and refuses what is not an environment.
"""

from __future__ import annotations

import copy
import difflib
import importlib
import inspect
import os
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import gymnasium as gym

from distrl.config import ConfigError, RunConfig, call_as, parse_env_kwargs
from distrl.envs.pettingzoo import is_multiagent
from distrl.envs.selfplay import is_turn_based_game
from distrl.envs.short_names import SHORT_NAMES

# Entry-point packages whose simulators come from an optional extra.
_EXTRAS = {"gymnasium.envs.mujoco": "mujoco", "gymnasium.envs.box2d": "box2d"}


ENTRY_POINT_RULE = "an entry point must be a gymnasium.Env subclass or a function returning a gymnasium.Env"
WRAPPER_SHAPE = "a function fn(env) -> env"
MEMORY = "memory:"
"""Prefix of the names of Python objects handed to the API (env instances, factories, wrappers): they
exist only in the process that was given them."""

_CUSTOM: dict[str, str] = {}
"""Registered ``custom/...`` ids -> the 'package.module:Name' entry point they were registered from."""
_OBJECTS: dict[str, Any] = {}
"""``memory:...`` names -> the object (an EnvInstance, an env factory or a wrapper)."""


def resolve_env_id(name: str) -> str:
    """Turn a short name, Gymnasium id, 'package.module:ClassName' or 'package.module:function' into a
    registered id (or the ``memory:`` name of an object given to the API in this process)."""
    if name.startswith(MEMORY):
        if name in _OBJECTS:
            return name
        raise ConfigError(
            f"env={name!r} was a Python object given to the API in the process that trained this run; "
            "it cannot be rebuilt here: pass the env again, e.g. PPO.load(path, env=...)"
        )
    if name.lower() in SHORT_NAMES:
        name = SHORT_NAMES[name.lower()]
    if name in gym.registry:
        return name
    if name.startswith("ALE/") and _register_ale() and name in gym.registry:
        return name
    if name.startswith("custom/"):
        class_name = name[len("custom/") :].rsplit("-v", 1)[0]
        raise ConfigError(
            f"env={name!r} was registered from a 'package.module:{class_name}' entry point in the "
            "process that trained this run, and the run does not record which (runs saved before "
            f"distrl recorded entry points): name it, e.g. --env mypkg.envs:{class_name}"
        )
    if is_multiagent(name) or is_turn_based_game(name):  # PettingZoo envs: distrl builds them, not Gymnasium
        return name
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
    if not os.environ.get("DISTRL_DEBUG"):  # its start-up banner on every env made, unless --debug
        ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Warning)
    gym.register_envs(ale_py)
    return True


def shown_name(env_id: str) -> str:
    """How messages name a resolved env: the 'package.module:Name' the user typed for a custom entry point
    (not the ``custom/`` id it is registered under), else the id."""
    return _CUSTOM.get(env_id, env_id)


def portable_env_name(name: str) -> str:
    """``name`` as any other process can resolve it: the registered id, or for a custom class or function
    its 'package.module:Name' (the ``custom/`` id exists only where it was registered). A ``memory:`` name
    stays as it is: the object it names cannot be rebuilt elsewhere."""
    env_id = resolve_env_id(name)
    return _CUSTOM.get(env_id, env_id)


def import_attr(field: str, entry_point: str) -> Any:
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
    obj = import_attr("env", entry_point)
    if isinstance(obj, type):
        if not issubclass(obj, gym.Env):
            raise ConfigError(
                f"env={entry_point!r} is a class that does not subclass gymnasium.Env: {ENTRY_POINT_RULE}"
            )
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
    env = import_attr("env", entry_point)(**kwargs)
    if not isinstance(env, gym.Env):
        raise ConfigError(
            f"env={entry_point!r} returned a {type(env).__name__}, not a gymnasium.Env: {ENTRY_POINT_RULE}"
        )
    return env


def _load_wrapper(name: str) -> Callable[[gym.Env], gym.Env]:
    if name.startswith(MEMORY):
        if name not in _OBJECTS:
            raise ConfigError(
                f"wrappers: {name!r} was a Python function given to the API in the process that "
                "trained this run; pass it again, e.g. PPO.load(path, wrappers=[...])"
            )
        return _OBJECTS[name]
    wrapper = import_attr("wrappers", name)
    if not callable(wrapper):
        raise ConfigError(f"wrappers: {name!r} is a {type(wrapper).__name__}: a wrapper must be {WRAPPER_SHAPE}")
    return wrapper


def apply_wrappers(env: gym.Env, wrappers: tuple[str, ...]) -> gym.Env:
    """``env`` wrapped by each of ``wrappers`` in order; a wrapper that is no such function, that raises or that
    returns something else than an env is a ConfigError naming it (``env`` closed first)."""
    for name in wrappers:
        wrapper = _load_wrapper(name)
        try:
            wrapped = call_as("wrappers", repr(name), wrapper, (env,), WRAPPER_SHAPE, "when applied to the env")
        except ConfigError:
            env.close()
            raise
        if not isinstance(wrapped, gym.Env):
            env.close()
            raise ConfigError(
                f"wrappers: {name!r} returned a {type(wrapped).__name__}, not a gymnasium.Env: a wrapper must be "
                f"{WRAPPER_SHAPE}"
            )
        env = wrapped
    return env


# ---- Python objects handed to the API ----


class EnvInstance:
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


def policy_name(policy: Any) -> str:
    """``policy=`` as RunConfig.policy: a name as it is, an object as 'module:qualname' or a ``memory:`` name."""
    if isinstance(policy, str):
        return policy
    return object_name(policy, getattr(policy, "__name__", type(policy).__name__).strip("<>"))


def is_user_code(env_id: str) -> bool:
    """Whether building ``env_id`` runs the user's code (a custom entry point or an object given to the API)."""
    return env_id in _CUSTOM or env_id in _OBJECTS


TRUST_FLAG = "--trust-code (trust_code=True in Python)"


def named_code(run: RunConfig, cfg: Any = None) -> list[tuple[str, str]]:
    """``(field, 'package.module:Name')`` for each piece of code a run's config names: a custom env entry
    point or a PettingZoo env's module, its wrappers, its policy factory, and (``cfg``, GRPO's) its reward
    functions. Registered Gymnasium ids, short names and built-in rewards are not code, nor are ``memory:``
    names (objects that exist only in the process that was given them)."""

    def code(name: str) -> bool:  # 'package.module:Name', or a module path (a PettingZoo env) imported to build it
        dotted = "." in name and name not in gym.registry and name.lower() not in SHORT_NAMES
        return (":" in name or dotted) and not name.startswith(MEMORY)

    found = [("env", run.env)] if code(run.env) else []
    found += [("wrapper", name) for name in run.wrappers if code(name)]
    if code(run.policy):
        found.append(("policy", run.policy))
    found += [("reward", name) for name in getattr(cfg, "rewards", ()) if code(name)]
    return found


# How a user names each kind of code again themselves, on the command line and in Python.
_OWN_FLAGS = {
    "env": "ENV or --env (env=)",
    "wrapper": "--wrapper (wrappers=)",
    "policy": "--policy (policy=)",
    "reward": "--reward",
}


def refuse_named_code(run: RunConfig, source: str, trusted: bool, own: Iterable[str] = (), cfg: Any = None) -> None:
    """Stop, before anything is imported, when a loaded run's config (read from ``source``) names code the
    user did not name themselves (``own``: what they passed again on the command line or to ``load``) and
    that is not ``trusted`` (``--trust-code``, or a run this user wrote here; see :mod:`distrl.run.trust`):
    importing 'package.module:Name' runs that module, calling it runs more."""
    own = set(own)
    foreign = [(field, name) for field, name in named_code(run, cfg) if name not in own]
    if foreign and not trusted:
        listed = ", ".join(f"{field}={name!r}" for field, name in foreign)
        flags = ", ".join(dict.fromkeys(_OWN_FLAGS[field] for field, _ in foreign))
        raise ConfigError(
            f"{source} names code that loading it would import and run: {listed}; nothing was imported, "
            f"as the run was not written by you on this machine or its config changed since: if you trust "
            f"where it came from, allow it once with `distrl trust RUN` or every time with {TRUST_FLAG}, "
            f"or pass that code yourself: {flags}"
        )


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
        text = (
            {True: "true", False: "false"}.get(value, "none")
            if value is None or isinstance(value, bool)
            else (repr(value) if isinstance(value, float) else str(value))
        )
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
        return _remember(EnvInstance(env), type(env.unwrapped).__name__), ()
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
            raise ConfigError(
                f"env_kwargs: {key}={value!r} cannot be recorded in config.json (values must be "
                "bool, int, float, str or None): pass a function that makes the env instead"
            )
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


def dependency_error(env_id: str, exc: Exception) -> ConfigError:
    extra = required_extra(env_id)
    if extra is None:
        return ConfigError(f"env={shown_name(env_id)!r} cannot be created: {exc}")
    return ConfigError(f"env={shown_name(env_id)!r} needs the {extra} extra: pip install 'distrl[{extra}]' ({exc})")


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` (resolved) is one of ale-py's Atari games."""
    return env_id in gym.registry and str(gym.spec(env_id).entry_point).startswith("ale_py")
