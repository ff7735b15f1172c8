"""Videos of a policy acting: frames from ``render_mode="rgb_array"``, written with imageio."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import gymnasium as gym
import numpy as np

from distrl.config import ConfigError

Policy = Callable[[np.ndarray], np.ndarray]


LABEL_HEIGHT = 20
"""Pixels of the strip above each pane that names it and gives the episode's return."""


@dataclass(frozen=True)
class Recording:
    frames: int
    returns: list[list[float]]
    """returns[p][e]: policy p's return in episode e."""


def _episode_frames(env: gym.Env, policy: Policy, seed: int, max_steps: int) -> tuple[list[np.ndarray], float]:
    reset = getattr(policy, "reset", None)
    if reset is not None:  # a policy with a memory (distrl.api.Player) begins the episode afresh
        reset()
    obs, _ = env.reset(seed=seed)
    frames = [env.render()]
    total = 0.0
    for _ in range(max_steps):
        obs, reward, terminated, truncated, _ = env.step(policy(obs))
        total += float(reward)
        frames.append(env.render())
        if terminated or truncated:
            break
    return frames, total


def _labelled(frames: list[np.ndarray], text: str) -> list[np.ndarray]:
    """``frames`` under a dark strip carrying ``text`` (one strip, drawn once, stacked on every frame)."""
    from PIL import Image, ImageDraw

    height, width = frames[0].shape[:2]
    strip = Image.new("RGB", (width, LABEL_HEIGHT), (24, 24, 24))
    ImageDraw.Draw(strip).text((6, 4), text, fill=(240, 240, 240))
    top = np.asarray(strip, dtype=np.uint8)
    return [np.concatenate([top, frame[..., :3]], axis=0) for frame in frames]


def record(
    make_env: str | Callable[[], gym.Env],
    policies: list[Policy],
    path: Path,
    episodes: int = 1,
    seed: int = 0,
    fps: int = 30,
    max_steps: int = 2_000,
    labels: list[str] | None = None,
) -> Recording:
    """Record ``episodes`` episodes per policy, side by side (one column per policy).

    ``make_env`` builds one environment rendering ``rgb_array`` frames (with the run's env_kwargs and
    wrappers), or is a Gymnasium id. With ``labels`` (one per policy) each pane carries a strip with
    its label and that episode's return.

    Every policy plays the same episodes (same seeds); a policy whose episode ended early
    shows its last frame until the slowest one ends.
    """
    path = Path(path)
    if path.suffix.lower() not in (".gif", ".mp4"):
        raise ConfigError(f"record={str(path)!r} is not allowed: the file must end in .gif or .mp4")
    if labels is not None and len(labels) != len(policies):
        raise ConfigError(f"labels={labels!r} is not allowed: must name each of the {len(policies)} policies")
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise ConfigError("recording needs imageio: pip install 'distrl[plot]'") from None
    for name in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):  # pygame-rendered envs: no display, no sound card
        os.environ.setdefault(name, "dummy")
    if isinstance(make_env, str):
        make_env = partial(gym.make, make_env, render_mode="rgb_array")
    frames: list[np.ndarray] = []
    returns: list[list[float]] = [[] for _ in policies]
    for episode in range(episodes):
        columns = []
        for p, policy in enumerate(policies):
            env = make_env()
            try:
                column, episode_return = _episode_frames(env, policy, seed + episode, max_steps)
            finally:
                env.close()
            returns[p].append(episode_return)
            if labels is not None:
                column = _labelled(column, f"{labels[p]}  return {episode_return:,.1f}")
            columns.append(column)
        length = max(len(c) for c in columns)
        for t in range(length):
            frames.append(np.concatenate([c[min(t, len(c) - 1)] for c in columns], axis=1))
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
    else:
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    return Recording(len(frames), returns)
