"""A uniform replay buffer: preallocated numpy arrays, O(1) adds, saved without pickle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distrl.config import ConfigError, require


@dataclass(frozen=True)
class Transitions:
    """A batch of transitions; ``next_obs`` is the true successor (the final obs at an episode end)."""

    obs: torch.Tensor  # [B, *obs_shape] in the stored dtype
    actions: torch.Tensor  # [B, action_dim], in [-1, 1]
    rewards: torch.Tensor  # [B]
    next_obs: torch.Tensor  # [B, *obs_shape]
    terminated: torch.Tensor  # [B] 1.0 where the episode terminated (no bootstrap); truncation bootstraps

    @property
    def size(self) -> int:
        return int(self.obs.shape[0])


class ReplayBuffer:
    """A ring buffer of ``capacity`` transitions (counted over all envs)."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(
        self, capacity: int, obs_dim: int | tuple[int, ...], action_dim: int, obs_dtype: np.dtype | type = np.float32
    ):
        """Observations are kept in their stored shape and dtype: a uint8 image takes a quarter of the
        memory it would as float32 (see ``spaces.stored_layout``)."""
        self.capacity = capacity
        obs_shape = (obs_dim,) if isinstance(obs_dim, int) else tuple(obs_dim)
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((capacity, action_dim), dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.next_obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.terminated = np.zeros(capacity, dtype=np.float32)
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
    ) -> None:
        """Add one vector step [n_envs, ...]; rows with ``valid == False`` (reset steps) are skipped."""
        if not valid.all():
            obs, actions, rewards, next_obs, terminated = (
                a[valid] for a in (obs, actions, rewards, next_obs, terminated)
            )
        n = len(rewards)
        if n == 0:
            return
        idx = (self.pos + np.arange(n)) % self.capacity
        self.obs[idx] = obs
        self.actions[idx] = actions
        self.rewards[idx] = rewards
        self.next_obs[idx] = next_obs
        self.terminated[idx] = terminated
        self.pos = (self.pos + n) % self.capacity
        self.size = min(self.size + n, self.capacity)

    def sample(self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu") -> Transitions:
        idx = rng.integers(0, self.size, size=batch_size)
        return Transitions(*(torch.from_numpy(getattr(self, f)[idx]).to(device) for f in self.FIELDS))

    def save(self, path: Path) -> None:
        """Write the filled part with safetensors (no pickle), atomically."""
        from safetensors.numpy import save_file

        order = (
            np.arange(self.size) if self.size < self.capacity else (self.pos + np.arange(self.capacity)) % self.capacity
        )
        tmp = path.with_suffix(".tmp")
        save_file(
            {f: np.ascontiguousarray(getattr(self, f)[order]) for f in self.FIELDS},
            str(tmp),
            metadata={"capacity": str(self.capacity)},
        )
        tmp.replace(path)

    def load(self, path: Path) -> None:
        data, _ = _load_replay(path, "full")
        n = len(data["rewards"])
        keep = min(n, self.capacity)
        for f in self.FIELDS:
            getattr(self, f)[:keep] = data[f][n - keep :]
        self.size = keep
        self.pos = keep % self.capacity


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
        self, capacity: int, obs_dim: int | tuple[int, ...], action_dim: int, obs_dtype: np.dtype | type = np.float32
    ):
        self.capacity = capacity
        obs_shape = (obs_dim,) if isinstance(obs_dim, int) else tuple(obs_dim)
        self.obs = np.zeros((capacity, *obs_shape), dtype=obs_dtype)
        self.actions = np.zeros((capacity, action_dim), dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.next_row = np.zeros(capacity, dtype=np.int64)
        self.starts = np.zeros(capacity, dtype=bool)
        """Whether a row begins a stored transition (else it only holds an observation, or nothing yet)."""
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
    ) -> None:
        """Add one vector step [n_envs, ...]; rows with ``valid == False`` (reset steps) are skipped."""
        if len(self.last) != len(valid):
            self.last = np.full(len(valid), -1, dtype=np.int64)
        for env in np.flatnonzero(valid):
            row = int(self.last[env])
            if row < 0 or not np.array_equal(self.obs[row], obs[env]):
                row = self._take()
                self.obs[row] = obs[env]
            following = self._take()
            self.obs[following] = next_obs[env]
            self.actions[row] = actions[env]
            self.rewards[row] = rewards[env]
            self.terminated[row] = terminated[env]
            self.next_row[row] = following
            self.starts[row] = True
            self.size += 1
            self.last[env] = following

    def sample(self, batch_size: int, rng: np.random.Generator, device: torch.device | str = "cpu") -> Transitions:
        idx = rng.integers(0, self.filled, size=batch_size)
        redraw = ~self.starts[idx]
        while redraw.any():  # rows that hold only an observation: draw again
            idx[redraw] = rng.integers(0, self.filled, size=int(redraw.sum()))
            redraw = ~self.starts[idx]
        fields = (
            self.obs[idx],
            self.actions[idx],
            self.rewards[idx],
            self.obs[self.next_row[idx]],
            self.terminated[idx],
        )
        return Transitions(*(torch.from_numpy(f).to(device) for f in fields))

    def save(self, path: Path) -> None:
        """Write the rows in use and where the ring stands, with safetensors (no pickle), atomically."""
        from safetensors.numpy import save_file

        n = self.filled
        arrays = {f: np.ascontiguousarray(getattr(self, f)[:n]) for f in self.FIELDS}
        arrays["ring"] = np.array([self.pos, self.filled, self.size], dtype=np.int64)
        tmp = path.with_suffix(".tmp")
        save_file(arrays, str(tmp), metadata={"capacity": str(self.capacity), "layout": "compact"})
        tmp.replace(path)

    def load(self, path: Path) -> None:
        data, capacity = _load_replay(path, "compact")
        if capacity != self.capacity:
            raise ConfigError(
                f"replay buffer {str(path)!r} holds {capacity:,} rows; this run's buffer_size is "
                f"{self.capacity:,}: resume with the same buffer_size"
            )
        n = len(data["rewards"])
        for f in self.FIELDS:
            getattr(self, f)[:n] = data[f]
        self.pos, self.filled, self.size = (int(v) for v in data["ring"])
        self.last = np.zeros(0, dtype=np.int64)  # a resumed run restarts its envs: no row to reuse


def _load_replay(path: Path, layout: str) -> tuple[dict[str, np.ndarray], int]:
    """A saved replay buffer's arrays and capacity, refused when its layout is not ``layout``."""
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
    return data, int(metadata.get("capacity", len(data["rewards"])))


class VersionedReplay:
    """Scored slices tagged with the policy version that drew them, for an asynchronous learner.

    Oldest-first eviction past ``capacity``. A sample is ``k`` distinct slices, drawn uniformly
    or with probability proportional to version + 1; a slice leaves the buffer after
    ``max_reuse`` samples have included it (1: each slice is trained on once), and slices
    more than ``max_policy_lag`` versions behind the learner are dropped. Nothing leaves
    unaccounted: ``added == retired + evicted + dropped_for_lag + len(self)``, and of the
    added slices ``trained`` were in at least one sample.
    """

    def __init__(
        self, capacity: int, max_policy_lag: int, sampling: str = "uniform", seed: int = 0, max_reuse: int = 1
    ):
        if sampling not in ("uniform", "version"):
            raise ConfigError(f"sampling={sampling!r} is not allowed: must be uniform or version")
        self.capacity = capacity
        self.max_policy_lag = max_policy_lag
        self.sampling = sampling
        self.max_reuse = max_reuse
        self.rng = np.random.default_rng(seed)
        self._slices: list[list] = []  # [version, slice, times sampled], oldest first
        self.added = self.trained = self.retired = self.evicted = self.dropped_for_lag = self.uses = 0
        self.max_size = 0

    def __len__(self) -> int:
        return len(self._slices)

    def untrained(self) -> int:
        """Slices held that no sample has included yet."""
        return sum(1 for entry in self._slices if entry[2] == 0)

    def add(self, version: int, item: object) -> None:
        self._slices.append([version, item, 0])
        self.added += 1
        if len(self._slices) > self.capacity:
            self._slices.pop(0)
            self.evicted += 1
        self.max_size = max(self.max_size, len(self._slices))

    def drop_stale(self, learner_version: int) -> int:
        """Drop slices drawn more than ``max_policy_lag`` versions before ``learner_version``; returns how many."""
        keep = [entry for entry in self._slices if learner_version - entry[0] <= self.max_policy_lag]
        dropped = len(self._slices) - len(keep)
        self._slices = keep
        self.dropped_for_lag += dropped
        return dropped

    def sample(self, k: int, learner_version: int) -> list[tuple[int, object]] | None:
        """``k`` distinct (version, slice) pairs after dropping stale ones; None while fewer than ``k`` are held."""
        self.drop_stale(learner_version)
        if len(self._slices) < k:
            return None
        if self.sampling == "uniform":
            chosen = np.sort(self.rng.choice(len(self._slices), size=k, replace=False))
        else:  # k distinct slices drawn one after another with probability ∝ version + 1 (Gumbel top-k)
            versions = np.fromiter((entry[0] for entry in self._slices), dtype=np.float64, count=len(self._slices))
            keys = np.log(versions + 1) - np.log(-np.log(self.rng.random(len(versions))))
            chosen = np.sort(np.argpartition(-keys, k - 1)[:k])
        taken = [self._slices[i] for i in chosen]
        for entry in taken:
            self.trained += entry[2] == 0
            entry[2] += 1
        self.uses += k
        spent = {id(entry) for entry in taken if entry[2] >= self.max_reuse}
        if spent:
            self._slices = [entry for entry in self._slices if id(entry) not in spent]
            self.retired += len(spent)
        return [(entry[0], entry[1]) for entry in taken]

    def counters(self) -> dict[str, int]:
        return {
            "slices_added": self.added,
            "slices_trained": self.trained,
            "slice_uses": self.uses,
            "slices_never_trained": self.added - self.trained,
            "slices_retired": self.retired,
            "slices_evicted": self.evicted,
            "slices_dropped_for_lag": self.dropped_for_lag,
            "slices_left_in_buffer": len(self._slices),
        }


def available_memory_bytes() -> int | None:
    """Memory the system can give this process without swapping (MemAvailable), or None if unknown."""
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_replay_memory(
    buffer_size: int,
    obs_shape: tuple[int, ...],
    obs_dtype: np.dtype | type,
    action_dim: int,
    compact: bool = False,
    fraction: float = 0.8,
) -> None:
    """Refuse a replay buffer larger than ``fraction`` of the available memory, before allocating it.

    numpy's zero-filled arrays are allocated lazily, so an oversized buffer either fails at once
    (CarRacing's 96x96x3 observations at the default 1M transitions asked for 103 GiB) or, worse,
    runs until the buffer fills and the kernel kills the process. ``compact``: a
    :class:`CompactReplayBuffer`, one observation per row.
    """
    obs_bytes = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
    per_transition = 2 * obs_bytes + 4 * action_dim + 4 + 4  # obs, next_obs, actions, reward, terminated
    if compact:
        per_transition += 8 + 1 - obs_bytes  # one observation, its next row's index and whether it starts one
    available = available_memory_bytes()
    if available is None:
        return
    budget = int(fraction * available)
    fits = budget // per_transition
    gib = 2**30
    require(
        buffer_size <= fits,
        "buffer_size",
        buffer_size,
        f"at most {fits:,} here: {buffer_size:,} transitions of {per_transition:,} bytes would take "
        f"{buffer_size * per_transition / gib:.1f} GiB and this machine has {available / gib:.1f} GiB available",
        f"e.g. --buffer-size {fits}",
    )
