"""The compact replay buffer (--optimize-memory-usage) holds the same transitions as the full one in half the rows."""

from collections import Counter

import numpy as np
import pytest

from distrl import checkpoint
from distrl.cli import main
from distrl.config import ConfigError, SACConfig
from distrl.data import replay
from distrl.data.replay import CompactReplayBuffer, ReplayBuffer


def stream(n_envs: int, steps: int, seed: int = 0, cut_every: int = 0):
    """Vector steps as the off-policy loop adds them: observations (env, episode, t), episodes of random
    length that end by termination or truncation, the reset step after each (valid False), and every
    ``cut_every`` steps a reset of every env in mid-episode (a checkpoint's new segment)."""
    rng = np.random.default_rng(seed)
    episode, t = np.zeros(n_envs, int), np.zeros(n_envs, int)
    length = rng.integers(1, 6, n_envs)
    resetting = np.zeros(n_envs, bool)
    for step in range(steps):
        if cut_every and step and step % cut_every == 0:
            episode += 1
            t[:] = 0
            resetting[:] = False
        obs = np.stack([np.array([e, episode[e], t[e]], np.float32) for e in range(n_envs)])
        valid = ~resetting
        terminated = np.zeros(n_envs, np.float32)
        for e in range(n_envs):
            if resetting[e]:
                episode[e] += 1
                t[e] = 0
                length[e] = rng.integers(1, 6)
                resetting[e] = False
            else:
                t[e] += 1
                if t[e] == length[e]:
                    resetting[e] = True
                    terminated[e] = float(rng.random() < 0.5)  # else truncated: its next observation matters
        next_obs = np.stack([np.array([e, episode[e], t[e]], np.float32) for e in range(n_envs)])
        actions = rng.uniform(-1, 1, (n_envs, 2)).astype(np.float32)
        yield obs, actions, rng.standard_normal(n_envs).astype(np.float32), next_obs, terminated, valid


def transitions(rb) -> Counter:
    """The stored transitions as (obs, action, reward, next obs, terminated) tuples."""
    if isinstance(rb, CompactReplayBuffer):
        rows = np.flatnonzero(rb.starts)
        nxt = rb.obs[rb.next_row[rows]]
    else:
        rows = np.arange(rb.size)
        nxt = rb.next_obs[rows]
    return Counter(
        zip(
            map(tuple, rb.obs[rows].tolist()),
            map(tuple, rb.actions[rows].tolist()),
            rb.rewards[rows].tolist(),
            map(tuple, nxt.tolist()),
            rb.terminated[rows].tolist(),
        )
    )


@pytest.mark.parametrize("n_envs, cut_every", [(1, 0), (3, 0), (3, 7)])
def test_the_compact_buffer_holds_the_full_buffers_transitions_in_about_half_the_rows(n_envs, cut_every):
    full, compact = ReplayBuffer(2000, 3, 2), CompactReplayBuffer(2000, 3, 2)
    for step in stream(n_envs, 200, cut_every=cut_every):
        full.add(*step)
        compact.add(*step)
    assert compact.size == full.size == sum(transitions(full).values()) > 100
    assert transitions(compact) == transitions(full)  # truncated episodes keep their last observation
    episodes = len({tuple(o[:2]) for o in compact.obs[: compact.filled].tolist()})
    assert compact.filled == full.size + episodes  # one row per step and one per episode (env, episode)
    assert compact.filled < 0.8 * 2 * full.size


def test_a_full_compact_buffer_keeps_only_whole_recent_transitions():
    compact, full = CompactReplayBuffer(40, 3, 2), ReplayBuffer(10_000, 3, 2)
    for step in stream(3, 300, seed=1, cut_every=11):
        compact.add(*step)
        full.add(*step)
    kept = transitions(compact)
    assert compact.size == sum(kept.values()) == compact.starts.sum() > 20
    assert not kept - transitions(full)  # every stored transition is one that happened, next observation included
    latest = set(map(tuple, full.obs[: full.size][-40:].tolist()))
    assert {key[0] for key in kept} <= latest  # and one of the latest


def test_compact_samples_are_stored_transitions_drawn_uniformly(tmp_path):
    compact = CompactReplayBuffer(500, 3, 2)
    for step in stream(2, 120, seed=2):
        compact.add(*step)
    stored = {(k[0], k[3]) for k in transitions(compact)}
    batch = compact.sample(20_000, np.random.default_rng(0))
    drawn = Counter(zip(map(tuple, batch.obs.tolist()), map(tuple, batch.next_obs.tolist())))
    assert set(drawn) == stored
    expected = 20_000 / len(stored)
    assert all(abs(count - expected) < 5 * expected**0.5 for count in drawn.values())

    compact.save(tmp_path / "replay.safetensors")
    again = CompactReplayBuffer(500, 3, 2)
    again.load(tmp_path / "replay.safetensors")
    one, two = (rb.sample(64, np.random.default_rng(1)) for rb in (compact, again))
    assert all(np.array_equal(getattr(one, f), getattr(two, f)) for f in ("obs", "actions", "rewards", "next_obs"))
    again.add(*next(stream(2, 1, seed=3)))  # the ring goes on where it stood
    assert again.filled == compact.filled + 2 * 2
    with pytest.raises(ConfigError, match="holds 500 rows; this run's buffer_size is 400"):
        CompactReplayBuffer(400, 3, 2).load(tmp_path / "replay.safetensors")
    with pytest.raises(ConfigError, match="was saved with optimize_memory_usage=True: resume with the same setting"):
        ReplayBuffer(500, 3, 2).load(tmp_path / "replay.safetensors")
    ReplayBuffer(500, 3, 2).save(tmp_path / "full.safetensors")
    with pytest.raises(ConfigError, match="was saved with optimize_memory_usage=False"):
        compact.load(tmp_path / "full.safetensors")


def test_the_memory_check_counts_one_observation_per_transition(monkeypatch):
    monkeypatch.setattr(replay, "available_memory_bytes", lambda: 10 * 2**30)  # budget 8 GiB
    image = ((96, 96, 3), np.uint8)  # 27,648 bytes
    with pytest.raises(ConfigError, match="buffer_size=200000 is not allowed: must be at most 155,"):
        replay.check_replay_memory(200_000, *image, 3)
    replay.check_replay_memory(200_000, *image, 3, compact=True)
    with pytest.raises(ConfigError, match="at most 310,"):
        replay.check_replay_memory(400_000, *image, 3, compact=True)
    assert CompactReplayBuffer(10, image[0], 3, image[1]).obs.nbytes * 2 == sum(
        getattr(ReplayBuffer(10, image[0], 3, image[1]), f).nbytes for f in ("obs", "next_obs")
    )
    with pytest.raises(ConfigError, match="buffer_size=8 is not allowed: must be > 2 \\* n_envs \\(8\\)"):
        SACConfig(optimize_memory_usage=True, n_envs=4, buffer_size=8, batch_size=8)


@pytest.mark.parametrize("compact", [False, True])
def test_a_sac_run_resumed_with_its_replay_buffer_equals_the_uninterrupted_run(tmp_path, compact):
    args = [
        "train",
        "sac",
        "Pendulum-v1",
        "--learning-starts",
        "50",
        "--batch-size",
        "32",
        "--net-arch",
        "32",
        "32",
        "--save-replay",
        "--checkpoint-every",
        "150",
        "--quiet",
        *(["--optimize-memory-usage"] if compact else []),
    ]
    for name in ("full", "run"):
        assert main([*args, "--total-steps", "400", "--run-dir", str(tmp_path / name)]) == 0
    assert (
        main([*args, "--total-steps", "400", "--resume", str(tmp_path / "run" / "checkpoints" / f"step-{150:012d}")])
        == 0
    )
    tensors = [checkpoint.load(tmp_path / name / "model")[0] for name in ("full", "run")]
    assert tensors[0].keys() == tensors[1].keys()
    assert all(np.array_equal(tensors[0][k].numpy(), tensors[1][k].numpy()) for k in tensors[0])
