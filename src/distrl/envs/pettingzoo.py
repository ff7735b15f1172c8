"""Which names are PettingZoo Parallel envs, and building them (for :mod:`distrl.envs.multiagent`)."""

from __future__ import annotations

import functools
import importlib
import inspect
import warnings
from collections.abc import Callable
from functools import partial
from typing import Any

import gymnasium as gym

from distrl.config import ConfigError

INSTALL_HINT = "pip install 'distrl[pettingzoo]'"


def is_parallel_env(obj: Any) -> bool:
    """Whether ``obj`` is a PettingZoo ParallelEnv (False when PettingZoo is not installed)."""
    try:
        from pettingzoo import ParallelEnv
    except ImportError:
        return False
    return isinstance(obj, ParallelEnv)


@functools.cache
def is_multiagent(name: str) -> bool:
    """Whether ``name`` is a PettingZoo Parallel env: an id of PettingZoo's parallel registry ("classic/rps-v2"),
    a module whose ``parallel_env`` builds one ("mpe2.simple_spread_v3"), or 'package.module:Name' naming a
    ParallelEnv class or a function that returns one (called once here, without arguments, to find out)."""
    if name in gym.registry or name.startswith(("ALE/", "custom/", "memory:")):  # Gymnasium's, or an API object
        return False
    try:
        import pettingzoo
    except ImportError:
        return False
    if name in getattr(pettingzoo, "parallel_registry", {}):
        return True
    module_name, _, attr = name.partition(":")
    if "." not in module_name and not attr:
        return False
    try:
        with warnings.catch_warnings():  # PettingZoo deprecates importing its own envs by module path
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(module_name)
    except ImportError:
        return False
    if not attr:
        return callable(getattr(module, "parallel_env", None))
    return names_a(module, attr, pettingzoo.ParallelEnv)


def names_a(module: Any, attr: str, kind: type) -> bool:
    """Whether ``module.attr`` is a subclass of ``kind`` (a PettingZoo env class) or a function that returns an
    instance of it (called once here, without arguments, to find out)."""
    obj = getattr(module, attr, None)
    if isinstance(obj, type):
        return issubclass(obj, kind)
    if not inspect.isfunction(obj):
        return False
    try:
        made = obj()
    except Exception:  # noqa: BLE001 - not callable bare: the Gymnasium path reports it
        return False
    found = isinstance(made, kind)
    if found or isinstance(made, gym.Env):
        made.close()
    return found


def make_parallel_env(name: str, env_kwargs: dict[str, Any] | None = None) -> Callable[[], Any]:
    """A zero-argument function that builds the ParallelEnv ``name`` with ``env_kwargs``.

    ``name`` is an id of PettingZoo's parallel registry ("classic/rps-v2", PettingZoo >= 1.27), a
    PettingZoo-style module whose ``parallel_env`` builds the env ("mpe2.simple_spread_v3",
    "pettingzoo.classic.rps_v2", which PettingZoo 1.27 deprecates for its own envs in favour of the
    registry), or "package.module:function" for a function returning a ParallelEnv.
    :class:`ParallelAgents` checks what the function builds, as it builds every copy. The function names
    the module rather than holding its ``parallel_env`` (often a closure), so it pickles for worker processes.
    """
    try:
        import pettingzoo
    except ImportError:
        raise ConfigError(f"env={name!r} is a PettingZoo env, which needs PettingZoo: {INSTALL_HINT}") from None
    if name in getattr(pettingzoo, "parallel_registry", {}):  # the registry came with 1.27
        return partial(pettingzoo.make, "parallel", name, **dict(env_kwargs or {}))
    module_name, _, attr = name.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"env={name!r} cannot be built: cannot import module {module_name!r} ({exc})") from None
    attr = attr or "parallel_env"
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(
            f"env={name!r} is not allowed: module {module_name!r} has no function {attr!r}; name a PettingZoo "
            "module with parallel_env (e.g. mpe2.simple_spread_v3) or 'package.module:function'"
        )
    return partial(_build, module_name, attr, dict(env_kwargs or {}))


def _build(module_name: str, attr: str, env_kwargs: dict[str, Any]) -> Any:
    return getattr(importlib.import_module(module_name), attr)(**env_kwargs)


def factory_name(make_env: Callable[[], Any]) -> str:
    if isinstance(make_env, partial) and make_env.func is _build:
        return ":".join(make_env.args[:2])
    func = make_env.func if isinstance(make_env, partial) else make_env
    return f"{getattr(func, '__module__', '?')}:{getattr(func, '__qualname__', type(func).__name__)}"
