"""What distrl makes of Gymnasium spaces: action layouts, images, and Dict observations as one row.

Observations keep their space's dtype from the env to the network: a uint8 image stays
uint8 in rollouts, replay buffers and wire messages, and is scaled to [0, 1] inside the
encoder. A Dict observation travels as one uint8 row per sample holding each part's raw
bytes (:class:`DictLayout`); the encoder reads the parts back with their own dtype and
shape. Every array path in distrl (rollouts, episode batches, fragments merged over
workers, wire messages, the decoupled scatter) then handles Dict observations as it
handles any Box, and nothing is converted on the way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces

from distrl.config import ConfigError

ActionKind = Literal["categorical", "multi_categorical", "gaussian"]

_WRAPPER_HINTS = {
    "Tuple": "gymnasium.wrappers.FlattenObservation, or a wrapper that turns it into a Dict",
    "Text": "a wrapper that encodes the text as a Box of token ids",
    "Sequence": "a wrapper that pads it to a fixed-size Box",
    "Graph": "a wrapper that pads nodes and edges to fixed-size Boxes in a Dict",
    "MultiDiscrete": "gymnasium.wrappers.FlattenObservation (one-hot parts)",
    "MultiBinary": "gymnasium.wrappers.FlattenObservation",
}


@dataclass(frozen=True)
class ActionSpec:
    """How a policy head maps to an action space.

    ``categorical``: one Discrete choice, ``head_size`` logits, actions int64 []. ``multi_categorical``:
    independent choices with ``nvec`` options each (MultiDiscrete, and MultiBinary as choices of 2),
    ``sum(nvec)`` logits, actions int64 [len(nvec)]. ``gaussian``: a diagonal Gaussian over a Box,
    ``head_size`` means and a state-independent log-std, actions float32 [action_dim].
    """

    kind: ActionKind
    nvec: tuple[int, ...]
    action_dim: int
    """Discrete: the number of choices; otherwise the length of an action vector."""
    start: tuple[int, ...] = ()
    """MultiDiscrete: the value of each part's first choice (Gymnasium's ``start``)."""
    low: np.ndarray | None = None
    high: np.ndarray | None = None
    shape: tuple[int, ...] = ()
    """The env's action shape (a Box or MultiDiscrete of any shape is flattened for the policy)."""

    @property
    def discrete(self) -> bool:
        return self.kind != "gaussian"

    @property
    def head_size(self) -> int:
        return sum(self.nvec) if self.kind == "multi_categorical" else self.action_dim

    @property
    def action_shape(self) -> tuple[int, ...]:
        """Shape of one stored action: [] for a choice, [parts] or [action_dim] otherwise."""
        return () if self.kind == "categorical" else (self.action_dim,)

    @property
    def action_dtype(self) -> type:
        return np.float32 if self.kind == "gaussian" else np.int64

    @property
    def noise_shape(self) -> tuple[int, ...]:
        """Per-step sampling noise of one env: uniforms for choices, standard normals for a Gaussian."""
        return self.action_shape

    def draw_noise(self, rng: np.random.Generator, lead: tuple[int, ...]) -> np.ndarray:
        """Sampling noise of shape ``lead + noise_shape`` from one env's stream (see ``nets.sample_actions``)."""
        shape = (*lead, *self.noise_shape)
        if self.kind == "gaussian":
            return rng.standard_normal(shape, dtype=np.float32)
        return rng.random(shape, dtype=np.float32)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """The action to send to the env: Gaussian samples clipped to the bounds, choices offset by ``start``."""
        if self.kind == "gaussian":
            return np.clip(action, self.low, self.high).reshape(len(action), *self.shape)
        if self.kind == "multi_categorical":
            return (action + np.asarray(self.start, dtype=np.int64)).reshape(len(action), *self.shape)
        return action


def action_spec(space: spaces.Space, algo: str = "ppo") -> ActionSpec:
    """The :class:`ActionSpec` of ``space``; a ConfigError for a space no policy head fits."""
    if isinstance(space, spaces.Discrete):
        if int(space.start) != 0:
            raise ConfigError(
                f"action space Discrete(n={space.n}, start={space.start}) is not supported: start must be 0"
            )
        return ActionSpec("categorical", (int(space.n),), int(space.n))
    if isinstance(space, spaces.MultiDiscrete):
        nvec = tuple(int(n) for n in np.asarray(space.nvec).ravel())
        start = tuple(int(s) for s in np.asarray(space.start).ravel())
        return ActionSpec("multi_categorical", nvec, len(nvec), start=start, shape=tuple(space.shape))
    if isinstance(space, spaces.MultiBinary):
        n = int(np.prod(space.shape))
        return ActionSpec("multi_categorical", (2,) * n, n, start=(0,) * n, shape=tuple(space.shape))
    if isinstance(space, spaces.Box):
        return ActionSpec(
            "gaussian",
            (),
            int(np.prod(space.shape)),
            low=space.low.astype(np.float32).ravel(),
            high=space.high.astype(np.float32).ravel(),
            shape=tuple(space.shape),
        )
    raise ConfigError(
        f"action space {type(space).__name__} is not supported by {algo}: "
        "must be Discrete, MultiDiscrete, MultiBinary or Box"
    )


def is_image(space: spaces.Space) -> bool:
    """A uint8 Box of 2 or 3 dimensions: (H, W), (H, W, C) or (C, H, W)."""
    return isinstance(space, spaces.Box) and space.dtype == np.uint8 and len(space.shape) in (2, 3)


def channels_first(shape: tuple[int, ...]) -> bool:
    """Whether an image shape is (C, H, W): its first axis is no longer than its last.

    (84, 84, 3) and (8, 8, 3) are channels-last, (4, 84, 84) and (3, 8, 8) channels-first;
    a 2-D (H, W) image is treated as one channel.
    """
    return len(shape) == 3 and shape[0] <= shape[-1]


def image_chw(shape: tuple[int, ...]) -> tuple[int, int, int]:
    """(channels, height, width) of an image observation shape."""
    if len(shape) == 2:
        return 1, shape[0], shape[1]
    return (shape[0], shape[1], shape[2]) if channels_first(shape) else (shape[2], shape[0], shape[1])


@dataclass(frozen=True)
class Part:
    """One key of a Dict observation inside the packed row: bytes ``[start, end)``."""

    key: str
    space: spaces.Space
    dtype: np.dtype
    shape: tuple[int, ...]
    start: int
    end: int


class DictLayout:
    """A Dict observation of Box and Discrete parts as one uint8 row of raw bytes per sample.

    Parts are laid out in sorted-key order (Gymnasium's order for Dict spaces), each at an
    offset aligned to 8 bytes so that a part can be viewed in its own dtype without a copy.
    Discrete parts are stored as int64 choices.
    """

    def __init__(self, space: spaces.Dict):
        self.space = space
        parts = []
        offset = 0
        for key, sub in space.spaces.items():
            if isinstance(sub, spaces.Box):
                dtype, shape = np.dtype(sub.dtype), tuple(sub.shape)
            elif isinstance(sub, spaces.Discrete):
                dtype, shape = np.dtype(np.int64), ()
            else:
                raise unsupported_observation(sub, f"key {key!r} of a Dict")
            size = dtype.itemsize * math.prod(shape)
            parts.append(Part(str(key), sub, dtype, shape, offset, offset + size))
            offset = -(-(offset + size) // 8) * 8
        self.parts = tuple(parts)
        self.nbytes = max(offset, 8)

    @property
    def packed_space(self) -> spaces.Box:
        return spaces.Box(0, 255, (self.nbytes,), np.uint8)

    def pack(self, obs: dict[str, np.ndarray]) -> np.ndarray:
        """A batch of Dict observations (each part [B, *shape]) as uint8 rows [B, nbytes]."""
        first = np.asarray(obs[self.parts[0].key])
        batch = first.shape[0] if first.ndim > len(self.parts[0].shape) else None
        rows = np.zeros((1 if batch is None else batch, self.nbytes), dtype=np.uint8)
        for part in self.parts:
            value = np.ascontiguousarray(np.asarray(obs[part.key], dtype=part.dtype))
            rows[:, part.start : part.end] = value.reshape(rows.shape[0], -1).view(np.uint8)
        return rows[0] if batch is None else rows

    def unpack(self, rows: torch.Tensor) -> dict[str, torch.Tensor]:
        """The parts of packed rows [B, nbytes] (uint8 tensor), each [B, *shape] in its own dtype."""
        out = {}
        for part in self.parts:
            raw = rows[:, part.start : part.end].contiguous()
            out[part.key] = raw.view(getattr(torch, part.dtype.name)).reshape(rows.shape[0], *part.shape)
        return out

    def unpack_numpy(self, rows: np.ndarray) -> dict[str, np.ndarray]:
        """:meth:`unpack` for numpy rows."""
        rows = np.ascontiguousarray(rows)
        return {p.key: rows[:, p.start : p.end].copy().view(p.dtype).reshape(len(rows), *p.shape) for p in self.parts}


def unsupported_observation(space: spaces.Space, where: str = "the observation") -> ConfigError:
    """The one-line error for an observation space distrl cannot encode, naming a wrapper that would fix it."""
    name = type(space).__name__
    hint = _WRAPPER_HINTS.get(name, "a wrapper that turns it into a Box or a Dict of Boxes")
    return ConfigError(
        f"observation space {name} ({where}) is not supported: distrl encodes Box, Discrete and "
        f"Dict of Box/Discrete observations; wrap the env with {hint} (--wrapper package.module:function)"
    )


def check_observation_space(space: spaces.Space) -> None:
    """Fail with :func:`unsupported_observation` unless distrl can encode ``space``."""
    if isinstance(space, spaces.Dict):
        DictLayout(space)
    elif not isinstance(space, (spaces.Box, spaces.Discrete)):
        raise unsupported_observation(space)


def to_bounds(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Actions in [-1, 1] (a tanh policy's) rescaled to a Box's bounds ``[low, high]``."""
    return low + 0.5 * (actions + 1.0) * (high - low)


def from_bounds(actions: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Actions in a Box's bounds ``[low, high]`` in [-1, 1], clipped: the inverse of :func:`to_bounds`."""
    return np.clip(2.0 * (actions - low) / (high - low) - 1.0, -1.0, 1.0).astype(np.float32)


def stored_layout(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    """Shape and dtype of one observation as distrl stores it: images as uint8, Discrete as int64,
    Dict as packed uint8 rows, every other Box as float32 (as networks consume vectors)."""
    if isinstance(space, spaces.Dict):
        return (DictLayout(space).nbytes,), np.dtype(np.uint8)
    if isinstance(space, spaces.Discrete):
        return (), np.dtype(np.int64)
    if is_image(space):
        return tuple(space.shape), np.dtype(np.uint8)
    return tuple(space.shape), np.dtype(np.float32)


def is_vector(space: spaces.Space) -> bool:
    """A Box that is not an image: the observations running normalisation applies to."""
    return isinstance(space, spaces.Box) and not is_image(space)


def check_observation(observation: Any, space: spaces.Space) -> None:
    """Refuse what is neither one observation of ``space`` nor a batch of them (one more leading dimension)."""
    if isinstance(observation, tuple) and len(observation) == 2 and isinstance(observation[1], dict):
        raise ConfigError(
            "observation=(obs, info) is not allowed: pass obs alone, as `obs, info = env.reset()` gives it"
        )
    if isinstance(space, spaces.Dict):
        keys = sorted(observation) if isinstance(observation, dict) else None
        if keys != sorted(space.spaces):
            raise ConfigError(f"observation with keys {keys} is not allowed: the keys must be {sorted(space.spaces)}")
        shapes = {f"observation[{k!r}]": (np.shape(observation[k]), stored_layout(space[k])[0]) for k in keys}
    else:
        shapes = {"observation": (np.shape(observation), stored_layout(space)[0])}
    for name, (got, want) in shapes.items():
        if got != want and got[1:] != want:
            batch = str(("n", *want)).replace("'", "")
            raise ConfigError(f"{name} of shape {got} is not allowed: {want} (one observation) or {batch} (a batch)")
    leading = {got[:1] if got != want else None for got, want in shapes.values()}
    if len(leading) > 1:
        raise ConfigError(
            f"observation with shapes {[got for got, _ in shapes.values()]} is not allowed: every key "
            "one observation, or every key a batch of the same size"
        )


def start_flags(episode_start: Any, n: int) -> np.ndarray:
    """``episode_start`` as one bool per observation [n]."""
    starts = np.asarray(episode_start, dtype=bool)
    if starts.size != n:
        raise ConfigError(
            f"episode_start of shape {starts.shape} is not allowed for {n} observation(s): one bool each, shape ({n},)"
        )
    return starts.reshape(n)
