"""Reward functions of text tasks: the built-ins, a user's own, and calling them so that none can stall a run.

A reward function scores a batch of completions: ``fn(prompts, completions, **fields) -> list[float]``,
one float per completion. ``prompts`` are the dataset's prompts (a string, or a list of chat messages)
and ``completions`` the decoded completions, both aligned (a prompt is repeated for each of its G
completions); every other field of the dataset's lines arrives as a keyword argument, a list aligned
the same way (``answer=[...]``). This is TRL's convention, so its users' functions work unchanged. A
function that lists a field in its signature without a default needs it: every dataset line must
have it (checked before the run starts). ``None`` (or NaN) means "does not apply" and counts 0.

Several functions are combined with weights; each one's score is logged. Each call runs on a thread
of its own with a timeout, so a reward that hangs ends the run with its name instead of stalling it,
and one that raises or returns the wrong number of values is reported by name.
"""

from __future__ import annotations

import inspect
import math
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distrl.config import ConfigError
from distrl.env_names import import_attr

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def extract_answer(completion: str) -> str:
    """The text inside the last ``<answer>...</answer>`` of a completion, else the whole completion; stripped."""
    found = _ANSWER.findall(completion)
    return (found[-1] if found else completion).strip()


def exact_match(prompts: list[Any], completions: list[str], answer: list[Any], **fields: Any) -> list[float]:
    """1 where the completion's answer (see :func:`extract_answer`) equals the line's ``answer`` field, else 0."""
    return [float(extract_answer(c) == str(a).strip()) for c, a in zip(completions, answer)]


def format_reward(prompts: list[Any], completions: list[str], **fields: Any) -> list[float]:
    """1 where the completion is ``<think>...</think>`` then ``<answer>...</answer>`` and nothing else, else 0."""
    return [float(_THINK_ANSWER.match(c) is not None) for c in completions]


BUILTINS: dict[str, Callable[..., Sequence[Any]]] = {"exact_match": exact_match, "format": format_reward}
"""Rewards named without a module: ``--reward exact_match --reward format``."""


class RewardError(RuntimeError):
    """A reward function raised, returned something other than one number per completion, or did not
    return in time; the message names it."""


@dataclass(frozen=True)
class RewardFunction:
    name: str
    """As the user named it: a built-in's name or 'package.module:function'."""
    fn: Callable[..., Any]
    weight: float
    needs: tuple[str, ...]
    """Dataset fields its signature requires."""
    accepts_any: bool
    """Whether it takes ``**fields`` (else it is passed only the fields it names)."""
    accepts: tuple[str, ...]


def load_reward(name: str, weight: float) -> RewardFunction:
    """A built-in by name or a function by 'package.module:function' (imported: the user named it)."""
    if ":" not in name:
        if name not in BUILTINS:
            raise ConfigError(
                f"rewards={name!r} is not known: must be a built-in ({', '.join(BUILTINS)}) or "
                "'package.module:function'"
            )
        fn = BUILTINS[name]
    else:
        fn = import_attr("rewards", name)
    if not callable(fn):
        raise ConfigError(
            f"rewards={name!r} is a {type(fn).__name__}, not a function "
            "fn(prompts, completions, **fields) -> list[float]"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: pass it everything
        return RewardFunction(name, fn, weight, (), True, ())
    params = signature.parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params)
    if not {"prompts", "completions"} <= named and not accepts_any:
        raise ConfigError(
            f"rewards={name!r} has the signature {signature}: a reward function takes "
            "(prompts, completions, **fields) by those names"
        )
    needs = tuple(
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.default is p.empty
        and p.name not in ("prompts", "completions")
    )
    return RewardFunction(name, fn, weight, needs, accepts_any, tuple(sorted(named)))


class RewardSet:
    """Weighted reward functions, called in turn, each on a thread of its own with a timeout."""

    def __init__(self, names: Sequence[str], weights: Sequence[float] = (), timeout_s: float = 60.0):
        if not names:
            raise ConfigError(
                "rewards=() is not allowed: must name at least one reward function "
                f"(--reward NAME, a built-in ({', '.join(BUILTINS)}) or package.module:function)"
            )
        if weights and len(weights) != len(names):
            raise ConfigError(
                f"reward_weights={tuple(weights)!r} is not allowed: must give one weight per reward "
                f"({len(names)}: {', '.join(names)}), or none for weight 1 each"
            )
        self.functions = [load_reward(name, float(w)) for name, w in zip(names, weights or [1.0] * len(names))]
        self.timeout_s = timeout_s

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions)

    @property
    def weights(self) -> np.ndarray:
        return np.array([f.weight for f in self.functions], dtype=np.float32)

    def needs(self) -> dict[str, tuple[str, ...]]:
        """Reward name → the dataset fields it requires."""
        return {f.name: f.needs for f in self.functions if f.needs}

    def __call__(self, prompts: list[Any], completions: list[str], fields: dict[str, list[Any]]) -> np.ndarray:
        """``[n, K]`` scores of ``n`` completions by the K functions; raises :class:`RewardError` naming the culprit."""
        out = np.zeros((len(completions), len(self.functions)), dtype=np.float32)
        for k, f in enumerate(self.functions):
            given = fields if f.accepts_any else {key: v for key, v in fields.items() if key in f.accepts}
            values = self._call(f, prompts, completions, given)
            out[:, k] = _as_scores(f.name, values, len(completions))
        return out

    def _call(self, f: RewardFunction, prompts: list[Any], completions: list[str], fields: dict[str, list[Any]]) -> Any:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = f.fn(prompts=prompts, completions=completions, **fields)
            except BaseException as exc:  # noqa: BLE001 - reported by name below
                box["error"] = exc

        # a daemon thread, not an executor: a hung reward must not keep the process from exiting
        thread = threading.Thread(target=run, name=f"reward {f.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():
            raise RewardError(
                f"reward {f.name!r} did not return within reward_timeout_s={self.timeout_s:g} s "
                f"(scoring {len(completions)} completions)"
            )
        if "error" in box:
            exc = box["error"]
            raise RewardError(f"reward {f.name!r} raised {type(exc).__name__}: {exc}")
        return box["value"]


def _as_scores(name: str, values: Any, n: int) -> np.ndarray:
    """A reward's return value as ``n`` floats (None and NaN as 0), or a RewardError saying what is wrong."""
    if hasattr(values, "tolist"):  # numpy arrays, torch tensors
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise RewardError(
            f"reward {name!r} returned a {type(values).__name__}: must return a list of {n} floats, one per completion"
        )
    if len(values) != n:
        raise RewardError(
            f"reward {name!r} returned {len(values)} values for {n} completions: must return one float per completion"
        )
    out = np.zeros(n, dtype=np.float32)
    for i, v in enumerate(values):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RewardError(f"reward {name!r} returned {v!r} at index {i}: must return floats (or None)")
        if math.isinf(v):
            raise RewardError(f"reward {name!r} returned {v!r} at index {i}: must return finite floats")
        out[i] = 0.0 if math.isnan(v) else v
    return out
