"""Recording videos (distrl.envs.video, ``distrl eval --record``): frames are streamed, so memory stays flat."""

import io
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from distrl.cli import main
from distrl.cli.runs import EvalArgs
from distrl.config import ConfigError
from distrl.envs.video import LABEL_HEIGHT, GifStream, record

WIDTH, HEIGHT = 320, 240


class Sweep(gym.Env):
    """A square crossing a picture, a step at a time; action 1 ends the episode."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 30}

    def __init__(self, render_mode: str = "rgb_array"):
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0.0, np.inf, (1,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.t += 1
        return np.array([self.t], np.float32), 1.0, bool(action == 1), False, {}

    def render(self):
        frame = np.full((HEIGHT, WIDTH, 3), 250, np.uint8)
        x = (3 * self.t) % (WIDTH - 16)
        frame[100:116, x : x + 16] = (40, 90 + self.t % 100, 200)
        return frame


def stop_after(steps: int):
    """A policy that ends Sweep's episode at its ``steps``-th step."""
    return lambda obs: int(obs[0] + 1 >= steps)


FRAMES_PER_EPISODE, EPISODES = 500, 4
MEMORY_BOUND_MIB = 64
MEASURE = f"""
import resource, sys
from test_video import Sweep
from distrl.envs.video import record

def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB

out, suffix = sys.argv[1], sys.argv[2]
policies = [lambda obs: 0, lambda obs: 0]
record(Sweep, policies, out + "/warm" + suffix, max_steps=20)  # imports and the encoder
before = peak_mib()
recording = record(Sweep, policies, out + "/long" + suffix, {EPISODES}, max_steps={FRAMES_PER_EPISODE})
print(recording.frames, peak_mib() - before)
"""


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_recording_many_frames_keeps_resident_memory_flat(tmp_path, suffix):
    # 4 episodes x 501 frames of two 320x240 panes: 2,004 frames of 640x240x3 bytes, 880 MiB if they were kept
    # (the recorder before issue 44 kept every frame, then Pillow's GIF writer kept each once more). Streamed,
    # the peak resident memory of the recording process grows by at most MEMORY_BOUND_MB (measured: a few MiB).
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(tmp_path), suffix],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).parent,  # where `from test_video import Sweep` finds this module
    )
    assert result.returncode == 0, result.stderr
    frames, growth_mib = result.stdout.split()
    kept_mib = int(frames) * 2 * WIDTH * HEIGHT * 3 / 2**20
    assert int(frames) == EPISODES * (FRAMES_PER_EPISODE + 1) and kept_mib > 10 * MEMORY_BOUND_MIB
    assert float(growth_mib) < MEMORY_BOUND_MIB, (
        f"peak RSS grew {growth_mib} MiB over {frames} frames ({kept_mib:.0f} MiB)"
    )
    assert (tmp_path / f"long{suffix}").stat().st_size > 0


def test_a_streamed_gif_decodes_to_the_frames_written(tmp_path):
    import imageio.v2 as imageio

    env = Sweep()
    env.reset()
    frames = []
    for t in range(40):
        frames.append(env.render())
        if t % 5 != 4:  # every fifth frame repeats the one before: nothing changed, one pixel carries its time
            env.step(0)
    frames[10] = frames[10].copy()
    frames[10][3, 200] = (255, 0, 0)  # a change of one pixel, far from the bar
    writer = GifStream(tmp_path / "v.gif", fps=25)
    for frame in frames:
        writer.append_data(frame)
    writer.close()
    decoded = imageio.mimread(tmp_path / "v.gif")
    assert len(decoded) == len(frames)
    for t, (got, want) in enumerate(zip(decoded, frames)):
        np.testing.assert_array_equal(got[..., :3], want, err_msg=f"frame {t}")  # few colours: exact


def test_panes_step_together_and_an_ended_pane_holds_its_last_frame(tmp_path):
    import imageio.v2 as imageio

    recording = record(Sweep, [stop_after(3), lambda obs: 0], tmp_path / "v.gif", episodes=2, max_steps=8)
    assert recording.frames == 2 * 9  # per episode: the reset frame and one per step of the longer pane
    assert recording.returns == [[3.0, 3.0], [8.0, 8.0]]
    assert recording.cut == [[False, False], [True, True]]  # the env ended the first, max_steps the second
    decoded = [f[..., :3] for f in imageio.mimread(tmp_path / "v.gif")]
    left, right = [f[:, :WIDTH] for f in decoded], [f[:, WIDTH:] for f in decoded]
    for t in range(9):
        np.testing.assert_array_equal(left[t], left[9 + t])  # episode 2 replays episode 1 (same seeds)
        np.testing.assert_array_equal(left[min(t, 3)], right[min(t, 3)])  # the panes step together
    # ended after 3 steps: its last frame stays, marked as ended from the next frame on
    assert all(np.array_equal(left[t], left[4]) for t in range(5, 9)) and not np.array_equal(left[3], left[4])
    assert not np.array_equal(right[3], right[8])  # while the other pane goes on


class KeptFrames:
    """A FrameWriter that keeps the frames it is given, exactly."""

    def __init__(self):
        self.frames: list[np.ndarray] = []

    def append_data(self, im: np.ndarray) -> None:
        self.frames.append(np.array(im))

    def close(self) -> None:
        pass


def sweep_at(t: int) -> np.ndarray:
    """Sweep's picture after ``t`` steps."""
    env = Sweep()
    env.t = t
    return env.render()


def test_a_pane_whose_episode_has_ended_says_so_while_the_other_plays_on(tmp_path, monkeypatch):
    from distrl.envs import video

    kept = KeptFrames()
    monkeypatch.setattr(video, "open_writer", lambda path, fps: kept)
    record(Sweep, [stop_after(3), stop_after(6)], tmp_path / "v.gif", labels=["short", "long"])
    assert len(kept.frames) == 7  # the reset frame and one per step of the longer episode
    strips = [f[:LABEL_HEIGHT] for f in kept.frames]
    left, right = [f[LABEL_HEIGHT:, :WIDTH] for f in kept.frames], [f[LABEL_HEIGHT:, WIDTH:] for f in kept.frames]
    for t in range(7):
        np.testing.assert_array_equal(right[t], sweep_at(t), err_msg=f"frame {t}")  # the other pane: untouched
    for t in range(4):
        np.testing.assert_array_equal(left[t], sweep_at(t), err_msg=f"frame {t}")  # its last frame once as it was
    held = left[4]
    assert np.array_equal(held, left[5]) and np.array_equal(held, left[6])  # then a still
    assert all(np.array_equal(strip[:, :WIDTH], strips[3][:, :WIDTH]) for strip in strips[4:])  # "short return 3.0"
    faded = (sweep_at(3).astype(np.int64) + 128) // 2  # halfway to grey
    caption = (held != faded).any(axis=-1)
    rows, cols = np.flatnonzero(caption.any(axis=1)), np.flatnonzero(caption.any(axis=0))
    box = held[rows[0] : rows[-1] + 1, cols[0] : cols[-1] + 1]
    assert caption.sum() == pytest.approx(box.shape[0] * box.shape[1], rel=0.1)  # one box; elsewhere only faded
    assert abs((rows[0] + rows[-1]) / 2 - HEIGHT / 2) <= 1 and abs((cols[0] + cols[-1]) / 2 - WIDTH / 2) <= 1
    assert 20 <= box.shape[0] < HEIGHT / 4 and WIDTH / 4 < box.shape[1] <= WIDTH / 2  # a caption, in the middle
    assert (box < 40).all(axis=-1).mean() > 0.5 and (box > 200).all(axis=-1).sum() > 100  # light letters on dark


def test_progress_says_where_the_recording_is_and_which_episodes_were_cut(tmp_path):
    out = io.StringIO()
    record(Sweep, [stop_after(2), lambda obs: 0], tmp_path / "v.mp4", 2, max_steps=5, labels=["a", "b"], progress=out)
    assert out.getvalue().splitlines() == [
        f"recording 2 episode(s) of at most 5 steps to {tmp_path / 'v.mp4'}",
        "episode 1/2: 6 frames so far, return a 2.0 | b 5.0 (cut)",
        "episode 2/2: 12 frames so far, return a 2.0 | b 5.0 (cut)",
    ]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"episodes": 0}, "episodes=0 is not allowed: must be > 0"),
        ({"max_steps": 0}, "max_steps=0 is not allowed: must be > 0"),
        ({"labels": ["one"]}, "must name each of the 2 policies"),
    ],
)
def test_record_rejects_impossible_settings_before_writing(tmp_path, kwargs, message):
    with pytest.raises(ConfigError, match=message):
        record(Sweep, [lambda obs: 0, lambda obs: 0], tmp_path / "v.gif", **kwargs)
    assert not (tmp_path / "v.gif").exists()


def test_eval_records_one_episode_by_default_and_says_when_it_was_cut(tmp_path, capsys):
    assert EvalArgs("run").episodes_to_run == 10 and EvalArgs("run", record="v.gif").episodes_to_run == 1
    run = tmp_path / "run"
    fast = ["--total-steps", "256", "--n-envs", "2", "--n-steps", "16", "--batch-size", "32", "--quiet"]
    assert main(["train", "ppo", "cartpole", *fast, "--run-dir", str(run)]) == 0
    capsys.readouterr()
    video = tmp_path / "v.gif"
    assert main(["eval", str(run), "--record", str(video), "--compare-untrained", "--max-steps", "5"]) == 0
    out, err = capsys.readouterr()
    # CartPole cannot fall within 5 steps: both panes are cut, and the output says so
    assert out.strip() == (
        f"wrote {video}: 6 frames, 1 episode(s): untrained (returns 5.0*) | trained (returns 5.0*); "
        "* cut at --max-steps 5"
    )
    assert err.splitlines()[0] == f"recording 1 episode(s) of at most 5 steps to {video}"
    assert main(["eval", str(run), "--record", str(video), "--max-steps", "0"]) == 2
    assert capsys.readouterr().err.strip() == "distrl: error: max_steps=0 is not allowed: must be > 0"
