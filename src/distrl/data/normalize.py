"""Running statistics for observation normalisation and reward scaling.

Statistics are frozen while a rollout is collected and updated once at its end from
the rollout's moments (count, sum, sum of squares). Moments add up, so workers can
all-reduce them and every worker ends with identical statistics.
"""

from __future__ import annotations

import math

import numpy as np
from gymnasium import spaces

from distrl.envs.masks import MASK_KEY
from distrl.envs.spaces import DictLayout, is_vector, stored_layout


def moments(batch: np.ndarray) -> np.ndarray:
    """``[count, sum..., sum of squares...]`` of ``batch`` [n, *shape], float64, flattened."""
    batch = np.asarray(batch, dtype=np.float64).reshape(len(batch), -1)
    return np.concatenate([[len(batch)], batch.sum(0), np.square(batch).sum(0)])


class RunningMeanStd:
    """Mean and variance of a stream, merged batch by batch (Chan et al. 1979)."""

    def __init__(self, shape: tuple[int, ...] = ()):
        self.shape = shape
        self.mean = np.zeros(shape, dtype=np.float64)
        self.var = np.ones(shape, dtype=np.float64)
        self.count = 1e-4

    def update_from_moments(self, m: np.ndarray) -> None:
        """Fold in a batch given by :func:`moments` (possibly summed over workers)."""
        count = float(m[0])
        if count == 0:
            return
        size = (len(m) - 1) // 2
        mean = (m[1 : 1 + size] / count).reshape(self.shape)
        var = np.maximum(m[1 + size :] / count - np.square(m[1 : 1 + size] / count), 0.0).reshape(self.shape)
        total = self.count + count
        delta = mean - self.mean
        m2 = self.var * self.count + var * count + np.square(delta) * self.count * count / total
        self.mean = self.mean + delta * count / total
        self.var = m2 / total
        self.count = total

    def state(self) -> dict[str, np.ndarray]:
        return {"mean": self.mean, "var": self.var, "count": np.array(self.count)}

    def load(self, state: dict[str, np.ndarray]) -> None:
        self.mean = np.asarray(state["mean"], dtype=np.float64).reshape(self.shape).copy()
        self.var = np.asarray(state["var"], dtype=np.float64).reshape(self.shape).copy()
        self.count = float(np.asarray(state["count"]).reshape(-1)[0])


class ObsNormalizer:
    """``(obs - mean) / sqrt(var + eps)``, clipped; when disabled, a pass-through that only casts to
    the stored dtype (float32 for vectors; images and Dict rows keep theirs).

    For a Dict observation (packed rows, see :class:`~distrl.envs.spaces.DictLayout`) only its float
    Box parts are normalised, never images nor an action mask: the statistics cover those parts side by side.
    """

    def __init__(
        self,
        shape: tuple[int, ...],
        enabled: bool,
        clip: float = 10.0,
        eps: float = 1e-8,
        dtype: np.dtype | type = np.float32,
        layout: DictLayout | None = None,
    ):
        self.enabled = enabled
        self.dtype = np.dtype(dtype)
        self.layout = layout
        parts = layout.parts if layout else ()  # an action mask stays 0/1, whatever its dtype
        self.parts = [p for p in parts if is_vector(p.space) and p.dtype.kind == "f" and p.key != MASK_KEY]
        if layout is not None:
            shape = (sum(math.prod(p.shape) for p in self.parts),)
        self.stats = RunningMeanStd(shape)
        self.clip = clip
        self.eps = eps
        self.refresh()

    @classmethod
    def for_space(cls, space: spaces.Space, enabled: bool, clip: float = 10.0) -> ObsNormalizer:
        """The normaliser of observations from ``space``, as distrl stores them."""
        shape, dtype = stored_layout(space)
        return cls(
            shape, enabled, clip, dtype=dtype, layout=DictLayout(space) if isinstance(space, spaces.Dict) else None
        )

    def refresh(self) -> None:
        """Recompute the cached float32 mean and 1/std from the statistics."""
        self._mean = self.stats.mean.astype(np.float32)
        self._inv_std = (1.0 / np.sqrt(self.stats.var + self.eps)).astype(np.float32)

    def affine(self) -> tuple[np.ndarray, np.ndarray]:
        """The float32 mean and 1/std that :meth:`__call__` applies (over the vector parts, side by side, for
        a Dict), for a graph that normalises as acting does."""
        return self._mean, self._inv_std

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        obs = np.asarray(obs).astype(self.dtype, copy=False)
        if not self.enabled:
            return obs
        if self.layout is None:
            return np.clip((obs - self._mean) * self._inv_std, -self.clip, self.clip)
        rows = np.array(obs, copy=True).reshape(-1, obs.shape[-1])
        offset = 0
        for part in self.parts:
            size = math.prod(part.shape)
            values = rows[:, part.start : part.end].copy().view(part.dtype)
            mean, inv_std = self._mean[offset : offset + size], self._inv_std[offset : offset + size]
            normalised = np.clip((values - mean) * inv_std, -self.clip, self.clip).astype(part.dtype)
            rows[:, part.start : part.end] = normalised.view(np.uint8)
            offset += size
        return rows.reshape(obs.shape)

    def moments(self, raw: np.ndarray) -> np.ndarray:
        """:func:`moments` of raw observations [n, *shape]: of the vector parts for a Dict."""
        if self.layout is None:
            return moments(raw.reshape(len(raw), -1))
        unpacked = self.layout.unpack_numpy(raw.reshape(len(raw), -1))
        parts = [unpacked[p.key].reshape(len(raw), -1) for p in self.parts]
        return moments(np.concatenate(parts, 1) if parts else np.zeros((len(raw), 0)))

    def update(self, m: np.ndarray) -> None:
        if self.enabled:
            self.stats.update_from_moments(m)
            self.refresh()


class RewardScaler:
    """Divide rewards by the running std of each env's discounted return.

    Reward scaling of Engstrom et al. 2020 (arXiv:2005.12729): the return is reset at
    episode ends, the scale is shared by all envs and frozen within a rollout.
    """

    def __init__(self, n_envs: int, gamma: float, enabled: bool, clip: float = 10.0, eps: float = 1e-8):
        self.enabled = enabled
        self.gamma = gamma
        self.stats = RunningMeanStd(())
        self.returns = np.zeros(n_envs, dtype=np.float64)
        self.clip = clip
        self.eps = eps
        self._seen: list[np.ndarray] = []

    def __call__(self, reward: np.ndarray, ended: np.ndarray, valid: np.ndarray) -> np.ndarray:
        if not self.enabled:
            return reward
        self.returns = np.where(valid, self.returns * self.gamma + reward, self.returns)
        self._seen.append(self.returns[valid])
        self.returns[ended] = 0.0
        scaled = reward / np.sqrt(self.stats.var + self.eps)
        return np.clip(scaled, -self.clip, self.clip).astype(np.float32)

    def take_moments(self) -> np.ndarray:
        """Moments of the discounted returns seen since the last call."""
        seen = np.concatenate(self._seen) if self._seen else np.zeros(0)
        self._seen = []
        return moments(seen[:, None])

    def update(self, m: np.ndarray) -> None:
        if self.enabled:
            self.stats.update_from_moments(m)

    def reset(self) -> None:
        self.returns[:] = 0.0
        self._seen = []
