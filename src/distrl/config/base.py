"""The pieces every config shares: the error users see, the checks that raise it, the value types."""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, Literal

Schedule = Literal["constant", "linear"]
Strategy = Literal["single", "ddp", "actor-learner", "decoupled", "pipeline"]
ReplaySampling = Literal["uniform", "version"]
Engine = Literal["ray", "monarch"]
OnWorkerError = Literal["restart", "abort"]
Scaling = Literal["per-worker", "equivalent"]
Launcher = Literal["auto", "local", "ray", "spark"]
Device = Literal["auto", "cpu", "cuda"]
VecMode = Literal["auto", "native", "sync", "async", "envpool"]
ActionMask = Literal["auto", "off", "observation", "info", "method"]
AgentPolicies = Literal["shared", "per-agent"]
Critic = Literal["local", "centralised"]
OpponentSampling = Literal["uniform", "pfsp"]
Activation = Literal["tanh", "relu"]
Encoder = Literal["auto", "mlp", "nature", "small", "impala"]
Core = Literal["none", "lstm", "gru"]
Precision = Literal["fp32", "bf16"]
Tracker = Literal["wandb", "mlflow"]
GRPOLoss = Literal["grpo", "dr_grpo", "dapo"]
RewardScaling = Literal["group", "batch", "none"]


class ConfigError(Exception):
    """A mistake in what the user asked for; printed as one line, exit status 2.

    Deliberately not a ValueError: the command-line parser would catch it and print a
    multi-line box instead of distrl's one-line message.
    """


def require(ok: bool, field: str, value: Any, allowed: str, fix: str = "") -> None:
    """Raise a ConfigError naming ``field``, ``value`` and the allowed range unless ``ok``."""
    if not ok:
        message = f"{field}={value!r} is not allowed: must be {allowed}"
        raise ConfigError(f"{message}; {fix}" if fix else message)


def require_positive(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        require(value > 0, name, value, "> 0")


def require_fraction(cfg: Any, name: str, *, inclusive_zero: bool = True) -> None:
    value = getattr(cfg, name)
    low_ok = value >= 0 if inclusive_zero else value > 0
    require(low_ok and value <= 1, name, value, "in [0, 1]" if inclusive_zero else "in (0, 1]")


def nearest_divisor(n: int, target: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - target), d))


def split_by_config(values: dict[str, Any], *classes: type) -> list[dict[str, Any]]:
    """``values`` split by which of ``classes`` has a field of that name (first match); the last dict
    holds the names none of them has (the algorithm's hyperparameters, checked later)."""
    parts: list[dict[str, Any]] = [{} for _ in range(len(classes) + 1)]
    names = [{f.name for f in dataclasses.fields(cls)} for cls in classes]
    for key, value in values.items():
        index = next((i for i, n in enumerate(names) if key in n), len(classes))
        parts[index][key] = value
    return parts


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples become lists)."""
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build ``cls`` from a dict written by :func:`to_dict`, rejecting unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    require(not unknown, f"{cls.__name__} keys", unknown, f"among {sorted(names)}")
    values = dict(data)
    for f in dataclasses.fields(cls):
        if f.name in values and isinstance(values[f.name], list):
            values[f.name] = tuple(values[f.name])
    return cls(**values)


def check_types(cls: type, values: dict[str, Any]) -> None:
    """Raise a ConfigError unless each value has the type of ``cls``'s field of that name (a value read from
    a file: JSON lists stand for tuples, ints for floats)."""
    hints = typing.get_type_hints(cls)
    for name, value in values.items():
        if name in hints:
            hint = hints[name]
            require(_fits(value, hint), name, value, _type_name(hint))


def _fits(value: Any, hint: Any) -> bool:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_fits(v, args[0]) for v in value)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if hint in (bool, str):
        return isinstance(value, hint)
    return True


def _type_name(hint: Any, plural: bool = False) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in args)
    if origin is tuple:
        return f"a list of {_type_name(args[0], plural=True)}"
    if hint is type(None):
        return "null"
    name = {int: "integer", float: "number", bool: "boolean (true/false)", str: "string"}.get(hint, str(hint))
    return f"{name}s" if plural else f"an {name}" if name[0] in "aeiou" else f"a {name}"


def require_callable_as(field: str, name: str, fn: Any, args: tuple[Any, ...], shape: str) -> None:
    """Raise a ConfigError naming ``field`` and ``name`` when ``fn`` cannot take ``args`` (read from its
    signature before it is called, so a mistake in the user's own code is not mistaken for this)."""
    import inspect

    try:
        inspect.signature(fn).bind(*args)
    except ValueError:  # no signature to read (some built-ins): the call itself will say
        return
    except TypeError as exc:
        raise ConfigError(f"{field}={name} is not allowed: must be {shape} ({exc})") from None


def call_as(field: str, name: str, fn: Any, args: tuple[Any, ...], shape: str, doing: str) -> Any:
    """``fn(*args)``, the user's code named ``name`` by ``field`` (a wrapper, a policy factory): checked to take
    ``args`` first (:func:`require_callable_as`), and an exception it raises told as :func:`user_code_failed`."""
    require_callable_as(field, name, fn, args, shape)
    try:
        return fn(*args)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the user's code raises is told on one line
        raise user_code_failed(field, name, exc, doing) from exc


def user_code_failed(field: str, name: str, exc: Exception, doing: str) -> ConfigError:
    """The one line for ``exc``, raised by the user's code named ``name`` by ``field`` while distrl was ``doing``
    something with it: the exception, its message and the line that raised it. Raise it ``from exc``: with
    ``--debug`` the command line prints the user's traceback under it."""
    import traceback

    origin = exc
    while origin.__cause__ is not None:  # an exception re-raised as another (gymnasium.make does): where it began
        origin = origin.__cause__
    frames = traceback.extract_tb(origin.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    detail = " ".join(str(exc).split())  # one line, whatever the exception's message holds
    if len(detail) > 300:
        detail = detail[:299] + "…"
    return ConfigError(f"{field}={name} raised {type(exc).__name__} {doing}{where}" + (f": {detail}" if detail else ""))
