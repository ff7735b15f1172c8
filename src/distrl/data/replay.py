"""Uniform replay buffers: preallocated numpy arrays, O(1) adds, rows a caller can name, saved without pickle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from distrl.config import ConfigError

EXTRA_PREFIX = "extra."
"""A saved buffer keeps its caller's arrays (prioritised replay's priorities) under this prefix: the buffers' own
columns have no dot in their names, so the two never clash."""


@dataclass(frozen=True)
class Transitions:
    """A batch of transitions; ``next_obs`` is the true successor (the final obs at an episode end)."""

    obs: torch.Tensor
    """[B, *obs_shape] in the stored dtype."""
    actions: torch.Tensor
    """[B, action_dim] float32 in [-1, 1] for SAC, or [B] int64 for discrete actions."""
    rewards: torch.Tensor
    """[B] float32 (an n-step transition's discounted sum of rewards)."""
    next_obs: torch.Tensor
    """[B, *obs_shape]"""
    terminated: torch.Tensor
    """[B] float32: 1.0 where the episode terminated (no bootstrap); truncation bootstraps."""
    discounts: torch.Tensor | None = None
    """[B] float32: the discount of each transition's bootstrap (gamma^k for k steps); None from a buffer that
    stores none (one-step transitions: the learner's gamma)."""
    weights: torch.Tensor | None = None
    """[B] float32 importance weights of prioritised sampling; None from uniform sampling."""
    rows: np.ndarray | None = None
    """[B] int64: the buffer rows the transitions came from, to give them new priorities."""

    @property
    def size(self) -> int:
        return int(self.obs.shape[0])


class RingBuffer(Protocol):
    """A buffer of ``capacity`` rows whose transitions can be named by row: what
    :class:`~distrl.data.prioritized.PrioritizedReplay` needs of the buffer it wraps."""

    capacity: int
    size: int

    def add(self, *args: Any, **kwargs: Any) -> np.ndarray: ...

    def live(self, rows: np.ndarray) -> np.ndarray: ...

    def take(self, rows: np.ndarray, device: torch.device | str = "cpu") -> Transitions: ...

    def save(self, path: Path, extra: dict[str, np.ndarray] | None = None) -> None: ...

    def load(self, path: Path) -> dict[str, np.ndarray]: ...


def _shape(dims: int | tuple[int, ...]) -> tuple[int, ...]:
    return (int(dims),) if isinstance(dims, (int, np.integer)) else tuple(dims)


def _check_discounts(stored: np.ndarray | None, given: np.ndarray | None) -> None:
    if (stored is None) != (given is None):
        raise TypeError("add() takes discounts exactly when the buffer was made with discounts=True")


def _refuse_dead_rows(live: np.ndarray, rows: np.ndarray) -> None:
    if not live.all():
        raise ValueError(f"rows {np.asarray(rows)[~live].tolist()[:8]} hold no transition")


class ReplayBuffer:
    """A ring buffer of ``capacity`` transitions (counted over all envs), one whole transition a row."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(
        self,
        capacity: int,
        obs_dim: int | tuple[int, ...],
        action_shape: int | tuple[int, ...],
        obs_dtype: np.dtype | type = np.float32,
        *,
        action_dtype: np.dtype | type = np.float32,
        discounts: bool = False,
    ):
        """Observations are kept in their stored shape and dtype: a uint8 image takes a quarter of the
        memory it would as float32 (see ``spaces.stored_layout``).

        Args:
            capacity: transitions held; the oldest is overwritten first.
            obs_dim: an observation's stored shape (an int n means ``(n,)``).
            action_shape: an action's shape: an int n means ``(n,)`` (SAC's Box actions), ``()`` one scalar
                per transition (a discrete action).
            obs_dtype: an observation's stored dtype.
            action_dtype: float32 for SAC's actions, int64 for discrete ones.
            discounts: store each transition's bootstrap discount (gamma^k of an n-step transition): ``add``
                then takes ``discounts`` and sampled batches carry them.
        """
        self.capacity = capacity
        obs_shape = _shape(obs_dim)
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((capacity, *_shape(action_shape)), dtype=action_dtype)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.discounts = np.zeros(capacity, dtype=np.float32) if discounts else None
        self.fields = self.FIELDS + (("discounts",) if discounts else ())
        """The stored columns, each [capacity, ...], named as :class:`Transitions`' fields."""
        self.pos = 0
        self.size = 0

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        valid: np.ndarray,
        *,
        discounts: np.ndarray | None = None,
        env_ids: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add one vector step [n_envs, ...]; rows with ``valid == False`` (reset steps) are skipped.

        ``discounts`` [n_envs] float32 is given exactly when the buffer stores discounts; ``env_ids`` (which env
        each row comes from) only matters to the compact buffer. Returns the rows written, [number of valid envs]
        int64 in env order: each is its transition's row."""
        _check_discounts(self.discounts, discounts)
        columns = dict(zip(self.fields, (obs, actions, rewards, next_obs, terminated, discounts)))
        if not valid.all():
            columns = {f: values[valid] for f, values in columns.items()}
        rows = (self.pos + np.arange(len(columns["rewards"]), dtype=np.int64)) % self.capacity
        if len(rows) == 0:
            return rows
        for f, values in columns.items():
            getattr(self, f)[rows] = values
        self.pos = (self.pos + len(rows)) % self.capacity
        self.size = min(self.size + len(rows), self.capacity)
        return rows

    def live(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row [B] holds a transition: every row below ``size``."""
        return np.asarray(rows) < self.size

    def take(self, rows: np.ndarray, device: torch.device | str = "cpu") -> Transitions:
        """The transitions at ``rows`` [B] int64, on ``device``, with ``rows`` kept on the batch."""
        _refuse_dead_rows(self.live(rows), rows)
        return Transitions(**{f: torch.from_numpy(getattr(self, f)[rows]).to(device) for f in self.fields}, rows=rows)

    def sample(
        self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu", beta: float = 1.0
    ) -> Transitions:
        """``batch_size`` transitions drawn uniformly with replacement. ``beta`` is ignored (uniform draws have no
        bias to correct, so no weights): it lets a trainer call this and ``PrioritizedReplay.sample`` alike."""
        return self.take(rng.integers(0, self.size, size=batch_size), device)

    def save(self, path: Path, extra: dict[str, np.ndarray] | None = None) -> None:
        """Write the filled rows where they stand and the ring's position with safetensors (no pickle), atomically,
        and the caller's ``extra`` arrays into the same file."""
        arrays = {f: np.ascontiguousarray(getattr(self, f)[: self.size]) for f in self.fields}
        arrays["ring"] = np.array([self.pos, self.size], dtype=np.int64)
        _save_replay(path, arrays, extra, {"capacity": str(self.capacity)})

    def load(self, path: Path) -> dict[str, np.ndarray]:
        """Restore a saved buffer; returns the ``extra`` arrays saved with it (empty if none).

        At the saved capacity every transition returns to its row, so that sampling goes on as if never saved.
        At another, the newest transitions that fit are kept, oldest first from row 0."""
        data, extra, capacity = _load_replay(path, "full", {f: getattr(self, f) for f in self.fields})
        n = len(data["rewards"])
        # A file saved without the ring's position (by an older distrl) holds its rows oldest first: a ring at n.
        pos = int(data["ring"][0]) if "ring" in data else n % capacity
        if capacity == self.capacity:
            order, self.pos = np.arange(n), pos
        else:
            order = np.roll(np.arange(n), -pos)[max(0, n - self.capacity) :]  # the oldest is at pos once full
            self.pos = len(order) % self.capacity
        for f in self.fields:
            getattr(self, f)[: len(order)] = data[f][order]
        self.size = len(order)
        return extra


class CompactReplayBuffer:
    """A ring buffer of ``capacity`` rows that keeps each observation once (``optimize_memory_usage``).

    A transition is stored in the row of its observation and points to the row of its next one.
    An env's next transition usually starts from that very observation, so it reuses the row:
    it does whenever its observation is byte for byte the one the row holds. After an episode's end
    or a reset (each checkpoint starts a new segment) the observation differs and takes a row of its
    own, so an episode of T steps takes T + 1 rows instead of the 2T rows of :class:`ReplayBuffer`'s
    two observation arrays. Sampling is uniform over the stored transitions; rows are reused oldest
    first, and a transition leaves with its own row (its next row is always the newer of the two).
    """

    FIELDS = ("obs", "actions", "rewards", "terminated", "next_row", "starts")

    def __init__(
        self,
        capacity: int,
        obs_dim: int | tuple[int, ...],
        action_shape: int | tuple[int, ...],
        obs_dtype: np.dtype | type = np.float32,
        *,
        action_dtype: np.dtype | type = np.float32,
        discounts: bool = False,
    ):
        """The arguments are :class:`ReplayBuffer`'s; ``capacity`` counts rows (observations), not transitions."""
        self.capacity = capacity
        self.obs = np.zeros((capacity, *_shape(obs_dim)), dtype=obs_dtype)
        self.actions = np.zeros((capacity, *_shape(action_shape)), dtype=action_dtype)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.next_row = np.zeros(capacity, dtype=np.int64)
        self.starts = np.zeros(capacity, dtype=bool)
        """Whether a row begins a stored transition (else it only holds an observation, or nothing yet)."""
        self.discounts = np.zeros(capacity, dtype=np.float32) if discounts else None
        self.fields = self.FIELDS + (("discounts",) if discounts else ())
        """The stored columns, each [capacity, ...]."""
        self.pos = 0
        self.filled = 0
        self.size = 0
        self.last = np.zeros(0, dtype=np.int64)
        """Per env: the row holding its latest next observation, -1 if none."""

    def _take(self) -> int:
        row = self.pos
        if self.starts[row]:
            self.starts[row] = False
            self.size -= 1
        self.last[self.last == row] = -1
        self.pos = (row + 1) % self.capacity
        self.filled = max(self.filled, row + 1)
        return row

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        valid: np.ndarray,
        *,
        discounts: np.ndarray | None = None,
        env_ids: np.ndarray | None = None,
    ) -> np.ndarray:
        """Add one vector step [n_envs, ...]; rows with ``valid == False`` (reset steps) are skipped.

        ``discounts`` [n_envs] float32 is given exactly when the buffer stores discounts. ``env_ids`` [n_envs]
        names the env each row comes from (default 0..n_envs-1), for a buffer that many actors' envs add to: an
        env's next transition reuses the row of its last observation. Returns every row written, int64: first
        each valid env's transition row (new or reused) in env order, then the rows of their next observations,
        which hold only that observation until the env's next step starts from it."""
        _check_discounts(self.discounts, discounts)
        if env_ids is None:
            env_ids = np.arange(len(valid))
            if len(self.last) != len(valid):
                self.last = np.full(len(valid), -1, dtype=np.int64)
        elif len(self.last) <= env_ids.max(initial=-1):
            self.last = np.concatenate([self.last, np.full(int(env_ids.max()) + 1 - len(self.last), -1, np.int64)])
        transitions, observations = [], []
        for i in np.flatnonzero(valid):
            env = int(env_ids[i])
            row = int(self.last[env])
            if row < 0 or not np.array_equal(self.obs[row], obs[i]):
                row = self._take()
                self.obs[row] = obs[i]
            following = self._take()
            self.obs[following] = next_obs[i]
            self.actions[row] = actions[i]
            self.rewards[row] = rewards[i]
            self.terminated[row] = terminated[i]
            if self.discounts is not None:
                self.discounts[row] = discounts[i]  # type: ignore[index]
            self.next_row[row] = following
            self.starts[row] = True
            self.size += 1
            self.last[env] = following
            transitions.append(row)
            observations.append(following)
        return np.array(transitions + observations, dtype=np.int64)

    def live(self, rows: np.ndarray) -> np.ndarray:
        """Whether each row [B] begins a stored transition (False where it holds only an observation, or nothing)."""
        return self.starts[rows]

    def take(self, rows: np.ndarray, device: torch.device | str = "cpu") -> Transitions:
        """The transitions at ``rows`` [B] int64, on ``device``, with ``rows`` kept on the batch."""
        _refuse_dead_rows(self.live(rows), rows)
        columns = {
            "obs": self.obs[rows],
            "actions": self.actions[rows],
            "rewards": self.rewards[rows],
            "next_obs": self.obs[self.next_row[rows]],
            "terminated": self.terminated[rows],
        }
        if self.discounts is not None:
            columns["discounts"] = self.discounts[rows]
        return Transitions(**{f: torch.from_numpy(v).to(device) for f, v in columns.items()}, rows=rows)

    def sample(
        self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu", beta: float = 1.0
    ) -> Transitions:
        """``batch_size`` stored transitions drawn uniformly with replacement; ``beta`` is ignored, as in
        :meth:`ReplayBuffer.sample`."""
        rows = rng.integers(0, self.filled, size=batch_size)
        redraw = ~self.starts[rows]
        while redraw.any():  # rows that hold only an observation: draw again
            rows[redraw] = rng.integers(0, self.filled, size=int(redraw.sum()))
            redraw = ~self.starts[rows]
        return self.take(rows, device)

    def save(self, path: Path, extra: dict[str, np.ndarray] | None = None) -> None:
        """Write the rows in use and where the ring stands with safetensors (no pickle), atomically, and the
        caller's ``extra`` arrays into the same file."""
        arrays = {f: np.ascontiguousarray(getattr(self, f)[: self.filled]) for f in self.fields}
        arrays["ring"] = np.array([self.pos, self.filled, self.size], dtype=np.int64)
        _save_replay(path, arrays, extra, {"capacity": str(self.capacity), "layout": "compact"})

    def load(self, path: Path) -> dict[str, np.ndarray]:
        """Restore a buffer saved at the same capacity; returns the ``extra`` arrays saved with it (empty if none)."""
        data, extra, capacity = _load_replay(path, "compact", {f: getattr(self, f) for f in self.fields})
        if capacity != self.capacity:
            raise ConfigError(
                f"replay buffer {str(path)!r} holds {capacity:,} rows; this run's buffer_size is "
                f"{self.capacity:,}: resume with the same buffer_size"
            )
        n = len(data["rewards"])
        for f in self.fields:
            getattr(self, f)[:n] = data[f]
        self.pos, self.filled, self.size = (int(v) for v in data["ring"])
        self.last = np.zeros(0, dtype=np.int64)  # a resumed run restarts its envs: no row to reuse
        return extra


def _save_replay(
    path: Path, arrays: dict[str, np.ndarray], extra: dict[str, np.ndarray] | None, metadata: dict[str, str]
) -> None:
    from safetensors.numpy import save_file

    arrays = {**arrays, **{EXTRA_PREFIX + k: np.ascontiguousarray(v) for k, v in (extra or {}).items()}}
    tmp = path.with_suffix(".tmp")
    save_file(arrays, str(tmp), metadata=metadata)
    tmp.replace(path)


def _load_replay(
    path: Path, layout: str, columns: dict[str, np.ndarray]
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], int]:
    """A saved replay buffer's arrays, the caller's extra arrays and its capacity; refused unless it has the
    ``layout`` and the ``columns`` (each's dtype and shape after the row) of the buffer loading it."""
    from safetensors import SafetensorError, safe_open
    from safetensors.numpy import load_file

    try:
        data = load_file(str(path))
        with safe_open(str(path), "numpy") as f:
            metadata = f.metadata() or {}
    except (SafetensorError, OSError) as exc:
        raise ConfigError(f"replay buffer {str(path)!r} is missing, truncated or corrupt ({exc})") from None
    saved = metadata.get("layout", "full")
    if saved != layout:
        raise ConfigError(
            f"replay buffer {str(path)!r} was saved with optimize_memory_usage={saved == 'compact'}: "
            f"resume with the same setting"
        )
    if ("discounts" in data) != ("discounts" in columns):
        raise ConfigError(
            f"replay buffer {str(path)!r} was saved with discounts={'discounts' in data}: resume with the same n-step "
            f"setting"
        )
    for name, column in columns.items():
        if name not in data:
            raise ConfigError(f"replay buffer {str(path)!r} is missing, truncated or corrupt (no {name!r})")
        stored = data[name]
        if stored.dtype != column.dtype or stored.shape[1:] != column.shape[1:]:
            raise ConfigError(
                f"replay buffer {str(path)!r} stores {name} as {stored.dtype} {list(stored.shape[1:])}; this run's "
                f"buffer stores {column.dtype} {list(column.shape[1:])}: resume with the same environment and algorithm"
            )
    extra = {k.removeprefix(EXTRA_PREFIX): v for k, v in data.items() if k.startswith(EXTRA_PREFIX)}
    return data, extra, int(metadata.get("capacity", len(data["rewards"])))
