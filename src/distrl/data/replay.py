"""A uniform replay buffer: preallocated numpy arrays, O(1) adds, saved without pickle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from distrl.config import ConfigError


@dataclass(frozen=True)
class Transitions:
    """A batch of transitions; ``next_obs`` is the true successor (the final obs at an episode end)."""

    obs: torch.Tensor         # [B, obs_dim]
    actions: torch.Tensor     # [B, action_dim], in [-1, 1]
    rewards: torch.Tensor     # [B]
    next_obs: torch.Tensor    # [B, obs_dim]
    terminated: torch.Tensor  # [B] 1.0 where the episode terminated (no bootstrap); truncation bootstraps

    @property
    def size(self) -> int:
        return int(self.obs.shape[0])


class ReplayBuffer:
    """A ring buffer of ``capacity`` transitions (counted over all envs)."""

    FIELDS = ("obs", "actions", "rewards", "next_obs", "terminated")

    def __init__(self, capacity: int, obs_dim: int, action_dim: int):
        self.capacity = capacity
        self.obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.actions = np.zeros((capacity, action_dim), dtype=np.float32)
        self.rewards = np.zeros(capacity, dtype=np.float32)
        self.next_obs = np.zeros((capacity, obs_dim), dtype=np.float32)
        self.terminated = np.zeros(capacity, dtype=np.float32)
        self.pos = 0
        self.size = 0

    def add(self, obs: np.ndarray, actions: np.ndarray, rewards: np.ndarray, next_obs: np.ndarray,
            terminated: np.ndarray, valid: np.ndarray) -> None:
        """Add one vector step [n_envs, ...]; rows with ``valid == False`` (reset steps) are skipped."""
        if not valid.all():
            obs, actions, rewards, next_obs, terminated = (a[valid] for a in (obs, actions, rewards, next_obs, terminated))
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

        order = np.arange(self.size) if self.size < self.capacity else (self.pos + np.arange(self.capacity)) % self.capacity
        tmp = path.with_suffix(".tmp")
        save_file({f: np.ascontiguousarray(getattr(self, f)[order]) for f in self.FIELDS}, str(tmp),
                  metadata={"capacity": str(self.capacity)})
        tmp.replace(path)

    def load(self, path: Path) -> None:
        from safetensors import SafetensorError
        from safetensors.numpy import load_file

        try:
            data = load_file(str(path))
        except (SafetensorError, OSError) as exc:
            raise ConfigError(f"replay buffer {str(path)!r} is missing, truncated or corrupt ({exc})") from None
        n = len(data["rewards"])
        keep = min(n, self.capacity)
        for f in self.FIELDS:
            getattr(self, f)[:keep] = data[f][n - keep:]
        self.size = keep
        self.pos = keep % self.capacity


class VersionedReplay:
    """Scored slices tagged with the policy version that drew them, for an asynchronous learner.

    Oldest-first eviction past ``capacity``; sampling takes slices out of the buffer (each slice
    is trained on once), uniformly or with probability proportional to version + 1; slices more
    than ``max_policy_lag`` versions behind the learner are dropped. The counters always add up:
    ``added == sampled + evicted + dropped_for_lag + len(self)``.
    """

    def __init__(self, capacity: int, max_policy_lag: int, sampling: str = "uniform", seed: int = 0):
        if sampling not in ("uniform", "version"):
            raise ConfigError(f"sampling={sampling!r} is not allowed: must be uniform or version")
        self.capacity = capacity
        self.max_policy_lag = max_policy_lag
        self.sampling = sampling
        self.rng = np.random.default_rng(seed)
        self._slices: list[tuple[int, object]] = []  # (version, slice), oldest first
        self.added = self.sampled = self.evicted = self.dropped_for_lag = 0
        self.max_size = 0

    def __len__(self) -> int:
        return len(self._slices)

    def add(self, version: int, item: object) -> None:
        self._slices.append((version, item))
        self.added += 1
        if len(self._slices) > self.capacity:
            self._slices.pop(0)
            self.evicted += 1
        self.max_size = max(self.max_size, len(self._slices))

    def drop_stale(self, learner_version: int) -> int:
        """Drop slices drawn more than ``max_policy_lag`` versions before ``learner_version``; returns how many."""
        keep = [(v, s) for v, s in self._slices if learner_version - v <= self.max_policy_lag]
        dropped = len(self._slices) - len(keep)
        self._slices = keep
        self.dropped_for_lag += dropped
        return dropped

    def sample(self, k: int, learner_version: int) -> list[tuple[int, object]] | None:
        """Take ``k`` slices out (after dropping stale ones); None while fewer than ``k`` are held."""
        self.drop_stale(learner_version)
        if len(self._slices) < k:
            return None
        versions = np.array([v for v, _ in self._slices], dtype=np.float64)
        p = None if self.sampling == "uniform" else (versions + 1) / (versions + 1).sum()
        chosen = set(self.rng.choice(len(self._slices), size=k, replace=False, p=p).tolist())
        taken = [item for i, item in enumerate(self._slices) if i in chosen]
        self._slices = [item for i, item in enumerate(self._slices) if i not in chosen]
        self.sampled += k
        return taken

    def counters(self) -> dict[str, int]:
        return {"slices_added": self.added, "slices_trained": self.sampled, "slices_evicted": self.evicted,
                "slices_dropped_for_lag": self.dropped_for_lag, "slices_left_in_buffer": len(self._slices)}
