"""The policy names a model takes before its env (``PPO("MlpPolicy", env)``), as stable-baselines3 spells them, and
the checks on a model's keywords: each name chooses distrl's network for the observations it names, a name that does
not fit the env is refused, and a mistyped keyword names the field it is close to."""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from gymnasium import spaces

from distrl.config import ALGO_CONFIGS, ConfigError, RunConfig, require
from distrl.envs.masks import MASK_KEY
from distrl.envs.names import resolve_env_id
from distrl.envs.spaces import is_image
from distrl.training.common import TrainerBase

POLICY_NAMES = ("MlpPolicy", "CnnPolicy", "MultiInputPolicy")
"""The policy names a model also takes before its env: each chooses distrl's network for the observations it names
(see :class:`distrl.api.Model`)."""


def policy_name_and_env(first: Any, env: Any, policy: Any) -> tuple[str | None, Any, Any]:
    """``(name, env, policy)`` of a model's arguments ``(env)``, ``(name, env)`` or ``(env, policy=name)``: the
    policy name given (one of :data:`POLICY_NAMES`, or None), the env, and the user's network (or None)."""
    name = None
    if env is None:
        if _is_policy_name(first):
            raise ConfigError(f"env=None is not allowed: an env must follow policy={first!r}, e.g. PPO({first!r}, env)")
        if isinstance(first, str) and difflib.get_close_matches(first, POLICY_NAMES, n=1) and not _is_env_id(first):
            raise _unknown_policy_name(first)
        env = first
    elif first is not None:
        if not _is_policy_name(first):
            raise _unknown_policy_name(first)
        name = first
    if _is_policy_name(policy):
        if name is not None:
            raise ConfigError(f"policy={policy!r} is not allowed with {name!r} before the env: name the policy once")
        return policy, env, None
    if name is not None and policy is not None:
        raise ConfigError(
            f"policy={policy!r} is not allowed with {name!r} before the env: a network replaces the named one, "
            "pass one of them"
        )
    return name, env, policy


def _is_policy_name(value: Any) -> bool:
    return isinstance(value, str) and value in POLICY_NAMES


def _is_env_id(name: str) -> bool:
    try:
        resolve_env_id(name)
    except ConfigError:
        return False
    return True


def _unknown_policy_name(value: Any) -> ConfigError:
    close = difflib.get_close_matches(value, POLICY_NAMES, n=1) if isinstance(value, str) else []
    return ConfigError(
        f"policy={value!r} is not allowed: must be one of {', '.join(POLICY_NAMES)}, followed by the env"
        + (f"; did you mean {close[0]}?" if close else "")
    )


def encoder_for(name: str, params: dict[str, Any]) -> None:
    """Set, in the algorithm's ``params``, the encoder policy ``name`` asks for, refusing an ``encoder`` that
    contradicts it. CnnPolicy and MultiInputPolicy keep 'auto' (or a preset's encoder): it gives a CNN for images
    and one encoder per key for Dict observations, which :func:`check_fits` makes sure the env has."""
    encoder = params.get("encoder")
    if name == "MlpPolicy":
        require(encoder in (None, "mlp"), "encoder", encoder, "mlp with 'MlpPolicy'", "CnnPolicy takes the CNNs")
        params["encoder"] = "mlp"
    elif name == "CnnPolicy":
        require(encoder != "mlp", "encoder", encoder, "auto, nature, small or impala with 'CnnPolicy'")


def check_fits(name: str, trainer: TrainerBase) -> None:
    """Refuse policy ``name`` unless it fits the env's observations (those the env gives: without the action mask
    distrl puts beside them for masks from ``info`` or ``action_masks()``)."""
    space = trainer.env.single_observation_space
    if trainer.run.action_mask in ("info", "method") and isinstance(space, spaces.Dict):
        parts = {k: v for k, v in space.spaces.items() if k != MASK_KEY}
        space = parts["observation"] if list(parts) == ["observation"] else spaces.Dict(parts)
    if isinstance(space, spaces.Dict):
        fits, seen = "MultiInputPolicy", f"Dict observations (keys {', '.join(space.spaces)})"
    elif is_image(space):
        fits, seen = "CnnPolicy", f"image observations {space.shape} uint8"
    else:
        shape = f" {space.shape} {space.dtype}" if isinstance(space, spaces.Box) else ""
        fits, seen = "MlpPolicy", f"{type(space).__name__} observations{shape}"
    if name != fits and not (name == "MlpPolicy" and fits == "CnnPolicy"):  # the MLPs flatten images
        raise ConfigError(f"policy={name!r} is not allowed for this env's {seen}: use {fits!r}")


def refuse_close_misses(algo: str, params: dict[str, Any], own: list[str]) -> None:
    """Refuse a keyword that is no field of the algorithm's config (nor of RunConfig, nor the constructor's ``own``)
    and is close to one, naming that one; others are refused with the list of fields as the config is built."""
    cls = ALGO_CONFIGS[algo]
    fields = [f.name for f in dataclasses.fields(cls)]
    known = [*fields, *(f.name for f in dataclasses.fields(RunConfig)), *own]
    for key, value in params.items():
        close = difflib.get_close_matches(key, known, n=1, cutoff=0.75) if key not in fields else []
        if close:
            raise ConfigError(f"{key}={value!r} is not a {cls.__name__} or RunConfig field: did you mean {close[0]}?")
