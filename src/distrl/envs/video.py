"""Videos of a policy acting: frames from ``render_mode="rgb_array"``, streamed to the file as they are made.

Memory stays flat in the number of episodes and frames: the policies' environments step in lockstep, each
combined frame goes to the encoder as soon as it exists, and a pane whose episode has ended keeps only
its last frame (shown once as it was, then faded and captioned "episode ended" while the others play on). mp4 frames go down imageio's pipe to ffmpeg. GIF frames are encoded here, one at a time,
with Pillow's public GIF helpers (``getheader``/``getdata``): Pillow's own animated-GIF writer, which
imageio uses, holds every frame until the file closes. Measured with ``distrl eval RUN --record out.gif
--compare-untrained`` on CartPole (501 frames of 1200x420 an episode): 3.1 GB resident for one episode and
5.6 GB for two when every frame was kept, 0.28 GB for one or ten streamed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache, partial
from pathlib import Path
from typing import IO, Any, Protocol

import gymnasium as gym
import numpy as np

from distrl.config import ConfigError

Policy = Callable[[np.ndarray], np.ndarray]


LABEL_HEIGHT = 20
"""Pixels of the strip above each pane that names it and gives the return so far."""

PROGRESS_EVERY_S = 2.0
"""Seconds between two progress lines within an episode."""

ENDED_CAPTION = "episode ended"
"""What a pane whose episode has ended says in the middle of its last frame while another pane plays on."""


@dataclass(frozen=True)
class Recording:
    frames: int
    """Frames written, over all episodes."""
    returns: list[list[float]]
    """returns[p][e]: policy p's return in episode e."""
    cut: list[list[bool]]
    """cut[p][e]: policy p's episode e was stopped at ``max_steps`` before the env ended it."""


class FrameWriter(Protocol):
    """What ``record`` writes to: imageio's writers have this shape, and so has ``GifStream``."""

    def append_data(self, im: np.ndarray) -> None: ...

    def close(self) -> None: ...


class GifStream:
    """An animated GIF written frame by frame: only the frame before is kept, to find what changed.

    Each frame carries its own palette (256 colours by median cut, as Pillow's writer chooses them)
    and only the rectangle that changed since the frame before; earlier pixels stay (disposal 1).
    """

    def __init__(self, path: Path, fps: int):
        self._file = Path(path).open("wb")
        self._duration_ms = 1000.0 / fps
        self._previous: np.ndarray | None = None

    def append_data(self, im: np.ndarray) -> None:
        from PIL import GifImagePlugin, Image

        frame = np.array(im[..., :3], dtype=np.uint8)  # a copy: the caller may reuse its buffer
        top, left = 0, 0
        if self._previous is None:
            part = frame
        else:
            changed = frame != self._previous  # reduced row-wise and column-wise: numpy is slow over a last axis of 3
            rows = np.flatnonzero(changed.reshape(len(frame), -1).any(axis=1))
            cols = np.flatnonzero(changed.any(axis=0).any(axis=-1))
            if rows.size == 0:  # nothing moved: one unchanged pixel carries the frame's time
                part = frame[:1, :1]
            else:
                top, left = int(rows[0]), int(cols[0])
                part = frame[top : rows[-1] + 1, left : cols[-1] + 1]
        image = Image.fromarray(part).convert("P", palette=Image.Palette.ADAPTIVE)
        if self._previous is None:
            header, _ = GifImagePlugin.getheader(image, info={"loop": 0})  # loop 0: play forever
            self._file.write(b"".join(header))
        chunks = GifImagePlugin.getdata(
            image, (left, top), duration=self._duration_ms, disposal=1, include_color_table=True
        )
        self._file.write(b"".join(chunks))
        self._previous = frame

    def close(self) -> None:
        if not self._file.closed:
            self._file.write(b";")  # the GIF trailer
            self._file.close()


def open_writer(path: Path, fps: int) -> FrameWriter:
    """A streaming writer for ``path`` (.gif or .mp4); the parent folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".gif":
        return GifStream(path, fps)
    import imageio.v2 as imageio

    return imageio.get_writer(path, fps=fps, macro_block_size=1)


@dataclass
class _Pane:
    """One policy's environment during one episode: only its newest frame is held."""

    env: gym.Env
    policy: Policy
    frame: np.ndarray
    obs: Any
    total: float = 0.0
    steps: int = 0
    ended: bool = False
    cut: bool = False
    held: bool = False
    """Past the end of its episode, waiting for another pane's: ``frame`` is its last one, marked as such."""

    @classmethod
    def start(cls, env: gym.Env, policy: Policy, seed: int) -> _Pane:
        reset = getattr(policy, "reset", None)
        if reset is not None:  # a policy with a memory (distrl.api.Player) begins the episode afresh
            reset()
        obs, _ = env.reset(seed=seed)
        frame = env.render()
        if not isinstance(frame, np.ndarray):
            raise ConfigError(f"render_mode={env.render_mode!r} is not allowed: recording needs 'rgb_array' frames")
        return cls(env, policy, frame, obs)

    def step(self, max_steps: int) -> None:
        self.obs, reward, terminated, truncated, _ = self.env.step(self.policy(self.obs))
        self.total += float(reward)
        self.steps += 1
        self.frame = self.env.render()
        self.ended = bool(terminated or truncated) or self.steps >= max_steps
        self.cut = self.steps >= max_steps and not (terminated or truncated)

    def hold(self) -> None:
        """Stay on the last frame, after it has been shown once as it was, marked as ended (see :func:`_held`)."""
        if not self.held:
            self.frame = _held(self.frame)
            self.held = True


@lru_cache(maxsize=64)
def _strip(text: str, width: int) -> np.ndarray:
    """A dark strip ``width`` pixels wide carrying ``text`` (kept: a pane that has ended repeats its strip)."""
    from PIL import Image, ImageDraw

    strip = Image.new("RGB", (width, LABEL_HEIGHT), (24, 24, 24))
    ImageDraw.Draw(strip).text((6, 4), text, fill=(240, 240, 240), font=_font())
    return np.asarray(strip, dtype=np.uint8)


@lru_cache(maxsize=4)
def _font(size: int | None = None) -> Any:
    """Pillow's built-in font, loaded once per size (``ImageDraw.text`` would load it again for every strip). A
    size other than the default's (10 pixels) needs FreeType, which Pillow's wheels bring; without it, the
    default size."""
    from PIL import ImageFont, features

    if size is None or not features.check("freetype2"):
        return ImageFont.load_default()
    return ImageFont.load_default(size=size)


@lru_cache(maxsize=8)
def _caption(text: str, size: int | None = None) -> np.ndarray:
    """``text`` in light letters on a dark box, in Pillow's built-in font (as the strips above the panes)."""
    from PIL import Image, ImageDraw

    font = _font(size)
    pad = max(4, (size or 0) // 3)
    left, top, right, bottom = ImageDraw.Draw(Image.new("RGB", (1, 1))).textbbox((0, 0), text, font=font)
    box = Image.new("RGB", (right - left + 2 * pad, bottom - top + 2 * pad), (24, 24, 24))
    ImageDraw.Draw(box).text((pad - left, pad - top), text, fill=(240, 240, 240), font=font)
    return np.asarray(box, dtype=np.uint8)


def _held(frame: np.ndarray) -> np.ndarray:
    """A pane's last frame as it stays while another pane plays on: faded halfway to grey, with ``ENDED_CAPTION``
    in its middle, its letters 10 to 30 pixels high, as fits in half the pane's width."""
    scene = ((frame[..., :3].astype(np.uint16) + 128) // 2).astype(np.uint8)
    height, width = scene.shape[:2]
    size = int(np.clip(10 * width / (2 * _caption(ENDED_CAPTION).shape[1]), 10, 30))
    caption = _caption(ENDED_CAPTION, size)[:height, :width]  # a pane too small for it: cut to fit
    top, left = (height - caption.shape[0]) // 2, (width - caption.shape[1]) // 2
    scene[top : top + caption.shape[0], left : left + caption.shape[1]] = caption
    return scene


def _combined(panes: list[_Pane], labels: list[str] | None, episode: str) -> np.ndarray:
    columns = []
    for p, pane in enumerate(panes):
        scene = pane.frame[..., :3]
        if labels is not None:
            text = f"{labels[p]}  return {pane.total:,.1f}{episode}"
            scene = np.concatenate([_strip(text, scene.shape[1]), scene], axis=0)
        columns.append(scene)
    return np.concatenate(columns, axis=1)


@dataclass
class _Progress:
    """Plain lines on ``out``: one when recording starts, one every few seconds, one per episode."""

    out: IO[str] | None
    names: list[str]
    started: float = field(default_factory=time.monotonic)
    last: float = field(default_factory=time.monotonic)

    def say(self, text: str) -> None:
        if self.out is not None:
            print(text, file=self.out, flush=True)

    def returns(self, panes: list[_Pane]) -> str:
        return " | ".join(
            f"{name} {pane.total:,.1f}{' (cut)' if pane.cut else ''}" for name, pane in zip(self.names, panes)
        )

    def frame(self, frames: int, episode: str, panes: list[_Pane]) -> None:
        now = time.monotonic()
        if now - self.last >= PROGRESS_EVERY_S:
            self.last = now
            rate = frames / max(now - self.started, 1e-9)
            self.say(f"recording episode {episode}: {frames:,} frames ({rate:,.0f}/s), return {self.returns(panes)}")


def record(
    make_env: str | Callable[[], gym.Env],
    policies: list[Policy],
    path: Path,
    episodes: int = 1,
    seed: int = 0,
    fps: int = 30,
    max_steps: int = 1_000,
    labels: list[str] | None = None,
    progress: IO[str] | None = None,
) -> Recording:
    """Record ``episodes`` episodes per policy, side by side (one column per policy), streamed to ``path``.

    ``make_env`` builds one environment rendering ``rgb_array`` frames (with the run's env_kwargs and
    wrappers), or is a Gymnasium id. With ``labels`` (one per policy) each pane carries a strip with
    its label and its return so far. Every policy plays the same episodes (same seeds), all stepping
    together; a policy whose episode ended shows its last frame until the slowest one ends, from the frame
    after it faded and captioned "episode ended" (``ENDED_CAPTION``). An episode
    stops after ``max_steps`` steps (``Recording.cut`` says which). With ``progress`` (e.g. sys.stderr)
    a line says where the recording is every few seconds and at the end of each episode.
    """
    path = Path(path)
    if path.suffix.lower() not in (".gif", ".mp4"):
        raise ConfigError(f"record={str(path)!r} is not allowed: the file must end in .gif or .mp4")
    if labels is not None and len(labels) != len(policies):
        raise ConfigError(f"labels={labels!r} is not allowed: must name each of the {len(policies)} policies")
    if episodes <= 0:
        raise ConfigError(f"episodes={episodes} is not allowed: must be > 0")
    if max_steps <= 0:
        raise ConfigError(f"max_steps={max_steps} is not allowed: must be > 0")
    try:
        import imageio.v2  # noqa: F401 - mp4 goes through it; a GIF needs Pillow, which it brings
    except ImportError:
        raise ConfigError("recording needs imageio: pip install 'distrl[plot]'") from None
    for name in ("SDL_VIDEODRIVER", "SDL_AUDIODRIVER"):  # pygame-rendered envs: no display, no sound card
        os.environ.setdefault(name, "dummy")
    if isinstance(make_env, str):
        make_env = partial(gym.make, make_env, render_mode="rgb_array")
    names = labels if labels is not None else [f"policy {p}" for p in range(len(policies))]
    report = _Progress(progress, names)
    report.say(f"recording {episodes} episode(s) of at most {max_steps:,} steps to {path}")
    frames = 0
    returns: list[list[float]] = [[] for _ in policies]
    cut: list[list[bool]] = [[] for _ in policies]
    writer = open_writer(path, fps)
    try:
        for e in range(episodes):
            episode = f"{e + 1}/{episodes}"
            envs = [make_env() for _ in policies]
            try:
                panes = [_Pane.start(env, policy, seed + e) for env, policy in zip(envs, policies)]
                while True:
                    writer.append_data(_combined(panes, labels, f"  episode {episode}" if episodes > 1 else ""))
                    frames += 1
                    report.frame(frames, episode, panes)
                    if all(pane.ended for pane in panes):
                        break
                    for pane in panes:
                        if pane.ended:
                            pane.hold()
                        else:
                            pane.step(max_steps)
            finally:
                for env in envs:
                    env.close()
            for p, pane in enumerate(panes):
                returns[p].append(pane.total)
                cut[p].append(pane.cut)
            report.say(f"episode {episode}: {frames:,} frames so far, return {report.returns(panes)}")
    finally:
        writer.close()
    return Recording(frames, returns, cut)
