"""Action masks: finding them in an environment, carrying them in the observation, and applying them.

Users put masks in three places: a Dict observation's ``action_mask`` key (PettingZoo's classic games),
``info["action_mask"]`` (Gymnasium's Taxi) or an ``action_masks()`` method (the MaskablePPO convention).
distrl moves the last two into the observation (:class:`MaskInObservation`), so a mask is always the
``action_mask`` part of a Dict observation. From there it travels wherever observations travel — rollouts,
remote workers' fragments, replay buffers, recurrent sequences, checkpoints' evaluation — and the network
that acts and the learner that recomputes log-probs read the same mask from the same stored row. A mask moved
there masks the logits and is no input of distrl's networks (:func:`encoded_keys`): they see the env's
observation as the env gives it.

A mask holds 1 for a legal choice and 0 for an illegal one: ``n`` entries for Discrete(n), ``sum(nvec)``
for MultiDiscrete (each part's choices side by side). A masked choice's logit becomes
:data:`MASKED_LOGIT`, so its probability is exactly 0: it is never sampled nor taken by argmax, and
log-probs and entropies are those of the masked distribution.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import torch
from gymnasium import spaces

from distrl.config import ConfigError

MASK_KEY = "action_mask"
MASKED_LOGIT = -1e9
"""The logit of an illegal choice: exp(MASKED_LOGIT - max) is exactly 0 in float32, and unlike -inf it
keeps p * log p (0 * finite) and every gradient finite."""
SOURCES = ("observation", "info", "method")
MOVED = ("info", "method")
"""The sources whose masks :class:`MaskInObservation` moves into the observation."""


def mask_size(action_space: spaces.Space) -> int | None:
    """Entries of a mask for ``action_space``, or None for a space masks do not apply to (Box)."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete) and np.ndim(action_space.nvec) == 1:
        return int(np.sum(action_space.nvec))
    return None


def has_mask_key(observation_space: spaces.Space) -> bool:
    return isinstance(observation_space, spaces.Dict) and MASK_KEY in observation_space.spaces


def detect(env: gym.Env) -> str:
    """Where ``env`` puts its masks ("observation", "method", "info"), or "off" when it has none or its
    actions cannot be masked. May reset ``env`` once (to read a reset's info)."""
    if mask_size(env.action_space) is None:
        return "off"
    if has_mask_key(env.observation_space):
        return "observation"
    if _method(env) is not None:
        return "method"
    _, info = env.reset(seed=0)
    return "info" if MASK_KEY in info else "off"


def _method(env: gym.Env) -> Any:
    try:
        method = env.get_wrapper_attr("action_masks")
    except AttributeError:
        return None
    return method if callable(method) else None


def resolve(mode: str, env: gym.Env) -> str:
    """``--action-mask`` for ``env``: "auto" becomes the detected source (or "off"); a named source must be
    there."""
    if mode == "auto":
        return detect(env)
    if mode == "off":
        return mode
    found = detect(env)
    if found != mode:
        raise ConfigError(
            f"action_mask={mode!r} is not allowed for this env: "
            + (f"its masks come from {found!r}" if found != "off" else "it has no action masks")
            + "; use auto, off or the source it has"
        )
    return mode


def check_mask(mask: np.ndarray, action_space: spaces.Space, where: str, needs_legal: bool = True) -> np.ndarray:
    """``mask`` as int8 [size] (or [B, size]), refusing a wrong shape and, with ``needs_legal`` (an observation an
    action must follow: not an episode's last), a row with no legal choice."""
    size = mask_size(action_space)
    mask = np.asarray(mask)
    if size is None or mask.shape[-1:] != (size,):
        raise ConfigError(
            f"{where} has shape {mask.shape}, which is not allowed: the action space {action_space} needs "
            f"{size} entries (1: legal, 0: illegal)"
        )
    nvec = np.asarray(action_space.nvec) if isinstance(action_space, spaces.MultiDiscrete) else np.array([size])
    for part in np.split(mask.astype(bool), np.cumsum(nvec)[:-1], -1) if needs_legal else ():
        if not part.any(-1).all():
            raise ConfigError(f"{where}={mask.astype(int).tolist()} is not allowed: it leaves no legal action")
    return mask.astype(np.int8)


class MaskInObservation(gym.Wrapper):
    """The mask from ``info["action_mask"]`` or ``action_masks()`` as the ``action_mask`` part of a Dict
    observation; the env's own observation is the ``observation`` part (or its keys, for a Dict)."""

    def __init__(self, env: gym.Env, source: str):
        super().__init__(env)
        if source not in MOVED:
            raise ValueError(f"source={source!r}: must be 'info' or 'method'")
        self.source = source
        size = mask_size(env.action_space)
        assert size is not None
        inner = env.observation_space
        parts = dict(inner.spaces) if isinstance(inner, spaces.Dict) else {"observation": inner}
        self.observation_space = spaces.Dict({**parts, MASK_KEY: spaces.Box(0, 1, (size,), np.int8)})

    def _wrap(self, obs: Any, info: dict[str, Any], ended: bool = False) -> dict[str, Any]:
        if self.source == "info":
            if MASK_KEY not in info:
                raise ConfigError(
                    f"info[{MASK_KEY!r}] is missing on a step, which is not allowed: every step needs one"
                )
            mask = info[MASK_KEY]
        else:
            mask = _method(self.env)()
        where = f"info[{MASK_KEY!r}]" if self.source == "info" else "action_masks()"
        mask = check_mask(mask, self.action_space, where, needs_legal=not ended)
        parts = dict(obs) if isinstance(obs, dict) else {"observation": obs}
        return {**parts, MASK_KEY: mask}

    def reset(self, **kwargs: Any) -> tuple[dict[str, Any], dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return self._wrap(obs, info), info

    def step(self, action: Any) -> tuple[dict[str, Any], Any, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        return self._wrap(obs, info, terminated or truncated), reward, terminated, truncated, info


def with_masks(env: gym.Env, mode: str) -> gym.Env:
    """``env`` with its masks in the observation, as ``--action-mask`` (auto, off or a source) says; a named source
    is taken as it is (a run checks it once, in ``distrl.envs.vector.resolve_action_mask``), auto is found here."""
    source = detect(env) if mode == "auto" else mode
    return MaskInObservation(env, source) if source in MOVED else env


def mask_logits(head: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``head`` [..., size] logits with the illegal choices (``mask == 0``) at :data:`MASKED_LOGIT`.

    A row with no legal choice is left as it is: it is an episode's last observation (a finished board), which
    the vector env's next step resets without using the action taken there; :class:`~distrl.envs.vector.VecEnv`
    refuses such a mask on any other observation."""
    illegal = mask == 0
    return head.masked_fill(illegal & ~illegal.all(-1, keepdim=True), MASKED_LOGIT)


class MaskReader:
    """Reads the ``action_mask`` part of packed Dict observation rows (:class:`~distrl.envs.spaces.DictLayout`)."""

    def __init__(self, observation_space: spaces.Dict, action_space: spaces.Space):
        from distrl.envs.spaces import DictLayout

        (self.part,) = [p for p in DictLayout(observation_space).parts if p.key == MASK_KEY]
        self.action_space = action_space
        if mask_size(action_space) is None or self.part.shape != (mask_size(action_space),):
            raise ConfigError(
                f"observation_space[{MASK_KEY!r}] has shape {self.part.shape}, which is not allowed: the action "
                f"space {action_space} needs ({mask_size(action_space)},) (1: legal, 0: illegal)"
            )

    def __call__(self, rows: torch.Tensor) -> torch.Tensor:
        """The masks [..., size] of packed rows [..., nbytes]."""
        raw = rows[..., self.part.start : self.part.end].contiguous()
        return raw.view(getattr(torch, self.part.dtype.name)).reshape(*rows.shape[:-1], *self.part.shape)

    def numpy(self, rows: np.ndarray) -> np.ndarray:
        """The masks [B, size] of packed numpy rows [B, nbytes]."""
        raw = np.ascontiguousarray(np.asarray(rows)[..., self.part.start : self.part.end])
        return raw.view(self.part.dtype).reshape(-1, *self.part.shape)

    def check(self, rows: np.ndarray) -> None:
        """Refuse acting on an observation whose mask leaves no legal action."""
        check_mask(self.numpy(rows), self.action_space, f"observation[{MASK_KEY!r}]")


def reader_for(observation_space: spaces.Space, action_space: spaces.Space, mode: str) -> MaskReader | None:
    """What masks a network of a run with ``--action-mask mode`` (None: nothing, where it is off or the
    observation holds no mask)."""
    return MaskReader(observation_space, action_space) if mode != "off" and has_mask_key(observation_space) else None


def encoded_keys(observation_space: spaces.Space, mode: str) -> tuple[str, ...] | None:
    """The parts of the observation distrl's built-in encoders read in a run with ``--action-mask mode``: every part
    (None), but the mask :class:`MaskInObservation` moved there from ``info`` or ``action_masks()``.

    That mask masks the logits and nothing else, so the network is the one the env's own observation gets (for a
    Box, the plain MLP and its initialisation). Fed to the network, random masks are inputs its policy and critic
    must learn to ignore: at the default PPO settings that cost 0.3-0.9 of a best return of 10 on two masked tasks
    (docs/benchmarks.md, "Action masks"). A mask in the env's own Dict observation is part of what the env
    observes and stays an input.
    """
    if mode not in MOVED or not has_mask_key(observation_space):
        return None
    return tuple(key for key in observation_space.spaces if key != MASK_KEY)


def random_actions(rngs: list[np.random.Generator], n: int, legal: np.ndarray | None) -> np.ndarray:
    """One uniformly random choice of ``n`` per stream (int64 [B]); with ``legal`` [B, n], among each row's legal
    choices alone (epsilon-greedy exploration never takes an illegal action)."""
    if legal is None:
        return np.array([rng.integers(n) for rng in rngs], dtype=np.int64)
    choices = [np.flatnonzero(row) if row.any() else np.arange(n) for row in legal]  # a last observation: any
    return np.array([c[rng.integers(len(c))] for c, rng in zip(choices, rngs)], dtype=np.int64)


def with_mask(observation: Any, action_mask: Any, space: spaces.Space, source: str) -> Any:
    """An observation as the user's env gives it, with ``action_mask`` added as a masked run stores it (the Python
    API's ``predict``): for masks from ``info`` or ``action_masks()``, the observation's parts and the mask (every
    action legal when None); otherwise the observation as it is, which holds its own mask if it has one."""
    if source not in MOVED:
        if action_mask is not None:
            raise ConfigError(
                "action_mask= is not allowed here: this model's env gives its masks "
                + (
                    "in the observation (its action_mask key)"
                    if source == "observation"
                    else "nowhere (action_mask off)"
                )
            )
        return observation
    if isinstance(observation, dict) and MASK_KEY in observation:
        return observation
    parts = dict(observation) if isinstance(observation, dict) else {"observation": observation}
    key = next(k for k in space.spaces if k != MASK_KEY)
    own_shape = space[key].shape
    batch = np.shape(parts[key])[: np.ndim(parts[key]) - len(own_shape)]
    size = space[MASK_KEY].shape[0]
    mask = np.ones((*batch, size), np.int8) if action_mask is None else np.asarray(action_mask)
    if mask.shape != (*batch, size):
        raise ConfigError(
            f"action_mask with shape {mask.shape} is not allowed: this observation needs {(*batch, size)}"
        )
    if not mask.astype(bool).any(-1).all():
        raise ConfigError(f"action_mask={mask.astype(int).tolist()} is not allowed: it leaves no legal action")
    return {**parts, MASK_KEY: mask}
