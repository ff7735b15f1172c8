"""A Minari dataset's transitions for BC, IQL, CQL and TD3+BC: one rank's shard of its episodes loaded as flat
numpy arrays (in chunks, in memory or in files), and the same global batch drawn on every rank.

Opening, checking and writing datasets is :mod:`distrl.data.minari_store`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import gymnasium as gym
import numpy as np
import torch

from distrl.config import ConfigError
from distrl.data.minari_store import one_line
from distrl.data.replay import Transitions

if TYPE_CHECKING:
    import minari

CHUNK_BYTES = 64 * 2**20
"""What one read of a dataset's episodes decodes, about, unless told how many episodes to read at a time: Minari's
reader holds what it reads (and more, in its Arrow buffers) until the read is consumed."""


def _layout(
    dataset: minari.MinariDataset, name: str, space: gym.Space, box_dtype: type | None
) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and dtype of one value of ``space`` in the flat arrays."""
    if isinstance(space, gym.spaces.Box):
        return space.shape, np.dtype(box_dtype or space.dtype)
    if isinstance(space, gym.spaces.Discrete):
        return (), np.dtype(np.int64)
    raise ConfigError(
        f"dataset={dataset.id!r} has {name} {one_line(space)}: offline data supports Box and Discrete spaces"
    )


def _allocate(folder: Path | None, name: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """An array to fill: in memory, or (with ``folder``) a ``.npy`` file there, mapped."""
    if folder is None or 0 in shape:  # an empty shard stays in memory: there is nothing to map
        return np.empty(shape, dtype=dtype)
    folder.mkdir(parents=True, exist_ok=True)
    return np.lib.format.open_memmap(folder / f"{name}.npy", mode="w+", dtype=dtype, shape=shape)


def _episode_lengths(dataset: minari.MinariDataset) -> np.ndarray:
    """[E] int64: each episode's transitions, in ``dataset.episode_indices`` order.

    Read from the per-episode metadata Minari writes beside the steps (a small JSON file per episode in Arrow, the
    episode group's attributes in HDF5): no step is decoded."""
    episodes = dataset.episode_indices
    metadata = dataset.storage.get_episode_metadata(episodes)
    return np.fromiter((m["total_steps"] for m in metadata), dtype=np.int64, count=len(episodes))


@dataclass(frozen=True)
class OfflineData:
    """The transitions of a dataset, or of one rank's shard of its episodes, as flat arrays of N rows.

    Rows are in the dataset's episode order and, within an episode, in step order, so ``global_index`` increases
    strictly. Actions are in the env's units, as recorded (no rescaling to [-1, 1]).
    """

    obs: np.ndarray
    """[N, *obs_shape] in the observation space's dtype (int64 for Discrete)."""
    actions: np.ndarray
    """[N, *action_shape] float32 for a Box, [N] int64 for a Discrete action space."""
    rewards: np.ndarray
    """[N] float32"""
    next_obs: np.ndarray
    """[N, *obs_shape]: the observation after the action; the final one at an episode's end."""
    terminated: np.ndarray
    """[N] float32: 1.0 where the episode terminated (no bootstrap); truncation bootstraps."""
    global_index: np.ndarray
    """[N] int64, strictly increasing: each transition's index among all the dataset's transitions, counted over its
    episodes in ``dataset.episode_indices`` order; the same on every rank."""
    global_size: int
    """Transitions in the whole dataset, every rank's shard together."""
    episode_returns: list[float]
    """The undiscounted return of each loaded episode, in row order."""

    @property
    def size(self) -> int:
        """N, the transitions held here."""
        return int(self.rewards.shape[0])

    @classmethod
    def load(
        cls,
        dataset: minari.MinariDataset,
        rank: int = 0,
        world_size: int = 1,
        episodes_per_chunk: int | None = None,
        folder: Path | None = None,
    ) -> OfflineData:
        """Load the episodes at positions ``i`` of ``dataset.episode_indices`` with ``i % world_size == rank``.

        The arrays are allocated once at the shard's size (known from the episodes' lengths) and filled
        ``episodes_per_chunk`` episodes at a time (``None``: as many as hold about :data:`CHUNK_BYTES` decoded,
        from the episodes' mean length), so memory peaks at the shard plus one chunk of decoded episodes.

        With ``folder`` the arrays are files there (numpy memory maps, opened read-only once written): memory then
        holds one chunk while they are written, and afterwards what the batches touch, which the operating system
        pages in and out. A shard larger than memory trains from them; the values are the same as in memory.

        Raises:
            ConfigError: the dataset has a space other than Box or Discrete, or an episode's data disagrees with
                the length its metadata gives (the global indices would be wrong).
        """
        if not 0 <= rank < world_size:
            raise ValueError(f"rank={rank} must be in [0, world_size={world_size})")
        if episodes_per_chunk is not None and episodes_per_chunk < 1:
            raise ValueError(f"episodes_per_chunk={episodes_per_chunk} must be at least 1 (or None: by size)")
        obs_shape, obs_dtype = _layout(dataset, "observation_space", dataset.observation_space, None)
        action_shape, action_dtype = _layout(dataset, "action_space", dataset.action_space, np.float32)

        episodes = dataset.episode_indices
        lengths = _episode_lengths(dataset)
        firsts = np.cumsum(lengths) - lengths  # the global index of each episode's first transition
        mine = np.arange(rank, len(episodes), world_size)  # positions in episode order
        n = int(lengths[mine].sum())
        layouts = {
            "obs": ((n, *obs_shape), obs_dtype),
            "next_obs": ((n, *obs_shape), obs_dtype),
            "actions": ((n, *action_shape), action_dtype),
            "rewards": ((n,), np.dtype(np.float32)),
            "terminated": ((n,), np.dtype(np.float32)),
            "global_index": ((n,), np.dtype(np.int64)),
        }
        arrays = {name: _allocate(folder, name, shape, dtype) for name, (shape, dtype) in layouts.items()}
        obs, next_obs, actions = arrays["obs"], arrays["next_obs"], arrays["actions"]
        rewards, terminated, global_index = arrays["rewards"], arrays["terminated"], arrays["global_index"]
        episode_returns: list[float] = []

        row_bytes = sum(int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize for shape, dtype in layouts.values())
        mean_length = float(lengths[mine].mean()) if len(mine) else 1.0
        chunk = episodes_per_chunk or max(1, int(CHUNK_BYTES // max(mean_length * row_bytes, 1.0)))
        row = 0
        for start in range(0, len(mine), chunk):
            positions = mine[start : start + chunk]
            for position, episode in zip(positions, dataset.iterate_episodes(episodes[positions]), strict=True):
                steps = len(episode.rewards)
                if steps != lengths[position] or len(episode.observations) != steps + 1:
                    raise ConfigError(
                        f"dataset={dataset.id!r}: episode {episode.id} holds {steps} rewards and "
                        f"{len(episode.observations)} observations but its metadata says {lengths[position]} steps"
                    )
                rows = slice(row, row + steps)
                observations = np.asarray(episode.observations, dtype=obs_dtype)
                obs[rows] = observations[:-1]
                next_obs[rows] = observations[1:]
                actions[rows] = episode.actions
                rewards[rows] = episode.rewards
                terminated[rows] = episode.terminations
                global_index[rows] = firsts[position] + np.arange(steps)
                episode_returns.append(float(np.sum(episode.rewards, dtype=np.float64)))
                row += steps
        if folder is not None:  # written: flushed, and read back read-only
            for array in arrays.values():
                if isinstance(array, np.memmap):
                    array.flush()
            arrays = {
                name: np.load(folder / f"{name}.npy", mmap_mode="r") if isinstance(array, np.memmap) else array
                for name, array in arrays.items()
            }
        return cls(
            arrays["obs"],
            arrays["actions"],
            arrays["rewards"],
            arrays["next_obs"],
            arrays["terminated"],
            arrays["global_index"],
            int(lengths.sum()),
            episode_returns,
        )

    def moments(self, rows_per_read: int | None = None) -> np.ndarray:
        """[1 + 2 D] float64: the count, the sum and the sum of squares of the observations' D values, read
        ``rows_per_read`` rows at a time (default: about 16 MiB of float64 values; the arrays may be files larger
        than memory)."""
        flat = self.obs.reshape(self.size, -1)
        rows_per_read = rows_per_read or max(1, 2**21 // max(flat.shape[1], 1))
        sums = np.zeros((2, flat.shape[1]), dtype=np.float64)
        for start in range(0, self.size, rows_per_read):
            block = np.asarray(flat[start : start + rows_per_read], dtype=np.float64)
            sums[0] += block.sum(0)
            sums[1] += np.square(block).sum(0)
        return np.concatenate([[self.size], sums[0], sums[1]])

    def locate(self, global_indices: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where this shard holds those of ``global_indices`` [B] it has: their positions [M] int64 in
        ``global_indices`` (increasing, repeats kept) and their rows [M] int64 here. Indices held by other ranks are
        left out."""
        if self.size == self.global_size:  # every transition, row i holding transition i: no search
            return np.arange(len(global_indices)), global_indices
        if self.size == 0:
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        rows = np.minimum(np.searchsorted(self.global_index, global_indices), self.size - 1)
        (positions,) = np.nonzero(self.global_index[rows] == global_indices)
        return positions, rows[positions]

    def take(self, rows: np.ndarray, device: torch.device | str = "cpu") -> Transitions:
        """The transitions at ``rows`` [B], on ``device``, with ``rows`` kept on the batch."""
        columns = (self.obs, self.actions, self.rewards, self.next_obs, self.terminated)
        return Transitions(*(torch.from_numpy(c[rows]).to(device) for c in columns), rows=rows)


class GlobalSampler:
    """Uniform batches with replacement over a whole dataset, drawn identically on every rank.

    Every rank draws the same ``batch_size`` global transition indices from a generator seeded with
    ``[seed, segment]`` and keeps those its shard holds (see :meth:`OfflineData.load`). Each global index lives on
    exactly one rank, so the ranks' batches together are the single-process batch, repeats included: the sum of the
    per-sample losses over all ranks equals the single-process sum, and dividing it by the global batch size that
    :meth:`batch` returns (after the gradient sync, as every algorithm does) gives the single-process mean. A rank's
    own share varies from batch to batch and may be empty.

    Every rank must call :meth:`batch` (or :meth:`draw`) equally often with the same ``batch_size``: the generators
    advance in lockstep. ``segment`` starts a fresh stream for the same seed (a resumed run's next segment).
    """

    def __init__(self, seed: int, segment: int = 0):
        self.rng = np.random.default_rng([seed, segment])

    def draw(self, global_size: int, batch_size: int) -> np.ndarray:
        """The next global batch: ``batch_size`` global transition indices [B] int64 in [0, ``global_size``)."""
        return self.rng.integers(0, global_size, size=batch_size)

    def batch(self, data: OfflineData, batch_size: int, device: torch.device | str = "cpu") -> tuple[Transitions, int]:
        """This rank's share of the next global batch, and the global batch size (``batch_size``).

        The transitions' ``rows`` are their positions in the global batch (increasing), None where this rank holds
        the whole batch: an algorithm that draws something per sample for the whole batch (TD3's smoothing noise)
        indexes it with them, so a sample meets the same draw on whichever rank holds it."""
        positions, rows = data.locate(self.draw(data.global_size, batch_size))
        return replace(data.take(rows, device), rows=None if len(positions) == batch_size else positions), batch_size
