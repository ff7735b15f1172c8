"""What a replay buffer would take in memory, checked before it is made."""

from __future__ import annotations

import numpy as np

from distrl.config import require


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
    *,
    action_bytes: int | None = None,
    extra_bytes: int = 0,
) -> None:
    """Refuse a replay buffer larger than ``fraction`` of the available memory, before allocating it.

    numpy's zero-filled arrays are allocated lazily, so an oversized buffer either fails at once
    (CarRacing's 96x96x3 observations at the default 1M transitions asked for 103 GiB) or, worse,
    runs until the buffer fills and the kernel kills the process. ``compact``: a
    :class:`CompactReplayBuffer`, one observation per row. ``action_bytes``: one stored action's
    (``4 * action_dim`` float32 by default; 8 for a discrete int64 action). ``extra_bytes``: what else a
    transition takes: 4 for a float32 discount, 16 for prioritised replay (its sum tree holds up to two
    float64 nodes a row).
    """
    obs_bytes = int(np.prod(obs_shape)) * np.dtype(obs_dtype).itemsize
    action_bytes = 4 * action_dim if action_bytes is None else action_bytes
    per_transition = 2 * obs_bytes + action_bytes + 4 + 4 + extra_bytes  # obs, next_obs, action, reward, terminated
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
