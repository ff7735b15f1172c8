"""Videos of a policy acting: frames from ``render_mode="rgb_array"``, written with imageio."""

from __future__ import annotations

import os
from collections.abc import Callable
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np

from distrl.config import ConfigError

Policy = Callable[[np.ndarray], np.ndarray]


def _episode_frames(env: gym.Env, policy: Policy, seed: int, max_steps: int) -> list[np.ndarray]:
    obs, _ = env.reset(seed=seed)
    frames = [env.render()]
    for _ in range(max_steps):
        obs, _, terminated, truncated, _ = env.step(policy(obs))
        frames.append(env.render())
        if terminated or truncated:
            break
    return frames


def record(make_env: str | Callable[[], gym.Env], policies: list[Policy], path: Path, episodes: int = 1, seed: int = 0,
           fps: int = 30, max_steps: int = 2_000) -> int:
    """Record ``episodes`` episodes per policy, side by side (one column per policy); returns the frame count.

    ``make_env`` builds one environment rendering ``rgb_array`` frames (with the run's env_kwargs and
    wrappers), or is a Gymnasium id.

    Every policy plays the same episodes (same seeds); a policy whose episode ended early
    shows its last frame until the slowest one ends.
    """
    path = Path(path)
    if path.suffix.lower() not in (".gif", ".mp4"):
        raise ConfigError(f"record={str(path)!r} is not allowed: the file must end in .gif or .mp4")
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise ConfigError("recording needs imageio: pip install 'distrl[plot]'") from None
    for name in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):  # pygame-rendered envs: no display, no sound card
        os.environ.setdefault(name, "dummy")
    if isinstance(make_env, str):
        make_env = partial(gym.make, make_env, render_mode="rgb_array")
    frames: list[np.ndarray] = []
    for episode in range(episodes):
        columns = []
        for policy in policies:
            env = make_env()
            try:
                columns.append(_episode_frames(env, policy, seed + episode, max_steps))
            finally:
                env.close()
        length = max(len(c) for c in columns)
        for t in range(length):
            frames.append(np.concatenate([c[min(t, len(c) - 1)] for c in columns], axis=1))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    return len(frames)
