"""The replay buffers: the compact one (--optimize-memory-usage) holds the full one's transitions in about half the
rows; both store discrete actions and n-step discounts, name the rows they write and save in place."""

from collections import Counter

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file

from distrl.cli import main
from distrl.config import ConfigError, SACConfig
from distrl.data import replay_memory
from distrl.data.replay import CompactReplayBuffer, ReplayBuffer
from distrl.run import checkpoint


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
    monkeypatch.setattr(replay_memory, "available_memory_bytes", lambda: 10 * 2**30)  # budget 8 GiB
    image = ((96, 96, 3), np.uint8)  # 27,648 bytes
    with pytest.raises(ConfigError, match="buffer_size=200000 is not allowed: must be at most 155,"):
        replay_memory.check_replay_memory(200_000, *image, 3)
    replay_memory.check_replay_memory(200_000, *image, 3, compact=True)
    with pytest.raises(ConfigError, match="at most 310,"):
        replay_memory.check_replay_memory(400_000, *image, 3, compact=True)
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


DISCOUNTS = np.array([[0.9, 0.81, 0.729], [0.5, 0.25, 0.125]], np.float32)
"""[env, t]: the discount stored with env e's transition from step t."""


def discrete_steps(steps: int = 3):
    """Two envs, observation [env, t], the int64 action 3t + env, reward t - env, discount DISCOUNTS[env, t]."""
    obs = np.array([[0, 0], [1, 0]], np.float32)
    for t in range(steps):
        next_obs = obs + np.array([0, 1], np.float32)
        step = (obs, np.array([3 * t, 3 * t + 1]), np.array([t, t - 1], np.float32), next_obs, np.zeros(2, np.float32))
        yield *step, np.ones(2, bool), DISCOUNTS[:, t].copy()
        obs = next_obs


@pytest.mark.parametrize("buffer", [ReplayBuffer, CompactReplayBuffer])
def test_discrete_actions_and_discounts_are_stored_sampled_and_saved(tmp_path, buffer):
    rb = buffer(16, 2, (), action_dtype=np.int64, discounts=True)
    for *step, discounts in discrete_steps():
        rb.add(*step, discounts=discounts)
    batch = rb.sample(64, np.random.default_rng(0))
    env, t = batch.obs[:, 0].long(), batch.obs[:, 1].long()
    assert batch.actions.dtype == torch.int64 and batch.actions.shape == (64,)
    assert torch.equal(batch.actions, 3 * t + env)
    assert torch.equal(batch.rewards, (t - env).float())
    assert torch.equal(batch.discounts, torch.from_numpy(DISCOUNTS)[env, t])
    assert torch.equal(batch.next_obs[:, 1], batch.obs[:, 1] + 1)
    assert len(set(zip(env.tolist(), t.tolist()))) == 6  # every transition drawn
    assert batch.weights is None and batch.rows.dtype == np.int64

    rb.save(tmp_path / "replay.safetensors", extra={"seen": np.arange(3)})
    again = buffer(16, 2, (), action_dtype=np.int64, discounts=True)
    extra = again.load(tmp_path / "replay.safetensors")
    assert extra.keys() == {"seen"} and extra["seen"].tolist() == [0, 1, 2]
    same = again.take(batch.rows)  # every transition back in its row
    assert all(torch.equal(getattr(same, f), getattr(batch, f)) for f in ("obs", "actions", "discounts", "next_obs"))
    with pytest.raises(ConfigError, match="was saved with discounts=True: resume with the same n-step setting"):
        buffer(16, 2, (), action_dtype=np.int64).load(tmp_path / "replay.safetensors")
    with pytest.raises(ConfigError, match=r"stores actions as int64 \[\]; this run's buffer stores float32 \[1\]"):
        buffer(16, 2, 1, discounts=True).load(tmp_path / "replay.safetensors")
    with pytest.raises(TypeError, match="takes discounts exactly when the buffer was made with discounts=True"):
        rb.add(*next(discrete_steps())[:-1])


@pytest.mark.parametrize("buffer", [ReplayBuffer, CompactReplayBuffer])
def test_without_discounts_nothing_is_stored_sampled_or_saved_for_them(tmp_path, buffer):
    rb = buffer(16, 2, (), action_dtype=np.int64)
    for *step, _ in discrete_steps():
        rb.add(*step)
    assert rb.sample(4, np.random.default_rng(0)).discounts is None
    rb.save(tmp_path / "replay.safetensors")
    assert set(load_file(str(tmp_path / "replay.safetensors"))) == {*rb.FIELDS, "ring"}
    assert buffer(16, 2, (), action_dtype=np.int64).load(tmp_path / "replay.safetensors") == {}


def test_add_returns_the_rows_written_and_live_marks_the_rows_that_begin_a_transition():
    compact = CompactReplayBuffer(5, 1, (), action_dtype=np.int64)
    a, zero, one, yes, no = np.zeros(1, np.int64), np.zeros(1, np.float32), np.ones(1, np.float32), [True], [False]

    def add(obs: float, next_obs: float, terminated=zero, valid=yes) -> list[int]:
        """One env's step from observation [obs] to [next_obs]; the rows written."""
        rows = compact.add(
            np.full((1, 1), obs, np.float32),
            a,
            zero,
            np.full((1, 1), next_obs, np.float32),
            terminated,
            np.array(valid),
        )
        assert rows.dtype == np.int64
        return rows.tolist()

    assert add(1, 2) == [0, 1]  # a new row and its next one
    assert compact.live(np.array([0, 1])).tolist() == [True, False]
    assert add(2, 3) == [1, 2]  # row 1 now begins a transition
    assert add(3, 4, terminated=one) == [2, 3]
    assert add(4, 5, valid=no) == []  # the reset step
    assert add(5, 6) == [4, 0]  # a new episode: a row of its own, and row 0, the oldest, for its next observation
    assert compact.live(np.arange(5)).tolist() == [False, True, True, False, True]
    assert compact.size == 3
    batch = compact.take(np.array([1, 2, 4]))
    assert batch.obs.flatten().tolist() == [2, 3, 5] and batch.next_obs.flatten().tolist() == [3, 4, 6]
    with pytest.raises(ValueError, match=r"rows \[0, 3\] hold no transition"):
        compact.take(np.array([1, 0, 3]))

    full = ReplayBuffer(3, 1, 1)
    step = (np.zeros((2, 1), np.float32), np.zeros((2, 1), np.float32), np.zeros(2, np.float32))
    step += (np.zeros((2, 1), np.float32), np.zeros(2, np.float32))
    assert full.add(*step, np.array([True, False])).tolist() == [0]
    assert full.live(np.arange(3)).tolist() == [True, False, False]
    assert full.add(*step, np.array([True, True])).tolist() == [1, 2]
    assert full.add(*step, np.array([False, True])).tolist() == [0]  # wrapped
    assert full.live(np.arange(3)).tolist() == [True, True, True]


def test_uniform_samples_draw_the_rows_the_rng_draws_as_before():
    full = ReplayBuffer(100, 3, 2)
    for step in stream(3, 50, seed=4):
        full.add(*step)
    assert full.size == 100  # wrapped
    batch = full.sample(32, np.random.default_rng(5), beta=0.4)  # beta: ignored
    rows = np.random.default_rng(5).integers(0, full.size, size=32)
    np.testing.assert_array_equal(batch.rows, rows)
    for f in ReplayBuffer.FIELDS:
        assert torch.equal(getattr(batch, f), torch.from_numpy(getattr(full, f)[rows]))
    assert batch.discounts is None and batch.weights is None

    compact = CompactReplayBuffer(100, 3, 2)
    for step in stream(3, 50, seed=4):
        compact.add(*step)
    rng = np.random.default_rng(5)
    rows = rng.integers(0, compact.filled, size=32)  # the draws of the sampler before rows could be taken
    while not compact.starts[rows].all():
        rows[~compact.starts[rows]] = rng.integers(0, compact.filled, size=int((~compact.starts[rows]).sum()))
    batch = compact.sample(32, np.random.default_rng(5))
    np.testing.assert_array_equal(batch.rows, rows)
    assert torch.equal(batch.obs, torch.from_numpy(compact.obs[rows]))
    assert torch.equal(batch.next_obs, torch.from_numpy(compact.obs[compact.next_row[rows]]))
    assert torch.equal(batch.actions, torch.from_numpy(compact.actions[rows]))


def test_a_full_buffer_loads_in_place_at_its_capacity_and_newest_first_at_another(tmp_path):
    rb = ReplayBuffer(10, 3, 2)
    for step in stream(1, 14, seed=5):
        rb.add(*step)
    assert rb.size == 10 and rb.pos != 0
    path = tmp_path / "replay.safetensors"
    rb.save(path)
    same = ReplayBuffer(10, 3, 2)
    same.load(path)
    assert (same.pos, same.size) == (rb.pos, rb.size)
    assert all(np.array_equal(getattr(same, f), getattr(rb, f)) for f in rb.FIELDS)
    oldest_first = (rb.pos + np.arange(10)) % 10
    smaller, larger = ReplayBuffer(4, 3, 2), ReplayBuffer(20, 3, 2)
    smaller.load(path)
    larger.load(path)
    assert (smaller.pos, smaller.size, larger.pos, larger.size) == (0, 4, 10, 10)
    np.testing.assert_array_equal(smaller.obs, rb.obs[oldest_first[-4:]])
    np.testing.assert_array_equal(larger.obs[:10], rb.obs[oldest_first])
    # A file saved before the ring's position was (rows oldest first, no "ring") loads as it always did.
    save_file({f: np.ascontiguousarray(getattr(rb, f)[oldest_first]) for f in rb.FIELDS}, str(path), {"capacity": "10"})
    old = ReplayBuffer(10, 3, 2)
    old.load(path)
    assert (old.pos, old.size) == (0, 10)
    np.testing.assert_array_equal(old.next_obs, rb.next_obs[oldest_first])


def test_the_memory_check_counts_discrete_actions_discounts_and_priorities(monkeypatch):
    monkeypatch.setattr(replay_memory, "available_memory_bytes", lambda: 10 * 2**30)  # budget 8,589,934,592 bytes
    # [4] float32 observations: 2 * 16 + an int64 action 8 + reward 4 + terminated 4 + discount 4 + sum tree 16 = 68
    dqn = dict(action_bytes=8, extra_bytes=4 + 16)
    replay_memory.check_replay_memory(126_322_567, (4,), np.float32, 1, **dqn)
    with pytest.raises(ConfigError, match="must be at most 126,322,567 here: 126,322,568 transitions of 68 bytes"):
        replay_memory.check_replay_memory(126_322_568, (4,), np.float32, 1, **dqn)
    # compact: one observation, the next row's index 8 and whether it starts one 1: 68 - 16 + 9 = 61
    with pytest.raises(ConfigError, match="at most 140,818,599 here: 140,818,600 transitions of 61 bytes"):
        replay_memory.check_replay_memory(140_818_600, (4,), np.float32, 1, compact=True, **dqn)
