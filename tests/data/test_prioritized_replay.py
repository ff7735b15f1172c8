"""A replay buffer sampled by priority: which rows are drawn, how often, with which weights, and its saved state."""

import numpy as np
import pytest
import torch

from distrl.config import ConfigError
from distrl.data.prioritized import PrioritizedReplay
from distrl.data.replay import CompactReplayBuffer, ReplayBuffer


def episodes(steps: int, n_envs: int = 2):
    """Vector steps with the observation (env, episode, t): env e's episodes last 3 + e steps, each followed by
    its reset step (valid False), as the off-policy loop adds them."""
    episode, t = np.zeros(n_envs, int), np.zeros(n_envs, int)
    for _ in range(steps):
        obs = np.stack([episode, t, np.arange(n_envs)], axis=1).astype(np.float32)
        valid = t < 3 + np.arange(n_envs)
        episode, t = np.where(valid, episode, episode + 1), np.where(valid, t + 1, 0)
        next_obs = np.stack([episode, t, np.arange(n_envs)], axis=1).astype(np.float32)
        actions = obs[:, :2] / 10
        yield obs, actions, obs[:, 1].copy(), next_obs, np.zeros(n_envs, np.float32), valid


def filled(buffer, alpha: float = 0.6, eps: float = 1e-6, steps: int = 40) -> PrioritizedReplay:
    replay = PrioritizedReplay(buffer, alpha, eps)
    for step in episodes(steps):
        replay.add(*step)
    return replay


def test_observation_only_rows_of_a_compact_buffer_are_never_drawn():
    replay = PrioritizedReplay(CompactReplayBuffer(30, 3, 2))
    compact, rng = replay.buffer, np.random.default_rng(0)
    pending, stale = None, 0
    for step in episodes(300):
        replay.add(*step)
        if pending is not None:  # priorities arrive a step late, as an asynchronous learner's do
            stale += int((~compact.starts[pending]).sum())
            replay.update_priorities(pending, rng.exponential(size=len(pending)))
        batch = replay.sample(64, rng, beta=0.4)
        assert compact.starts[batch.rows].all()
        assert torch.equal(batch.next_obs[:, 1], batch.obs[:, 1] + 1)  # a step of one episode
        pending = batch.rows
        only_obs = np.flatnonzero(~compact.starts[: compact.filled])
        assert len(only_obs) > 0 and not replay.sampler.tree.values(only_obs).any()
    assert compact.filled == 30 and stale > 0  # wrapped, and some rows lost their transition before their update


def test_rows_are_drawn_as_often_as_their_updated_priorities_say():
    replay = filled(ReplayBuffer(4, 3, 2), alpha=0.5, eps=1.0, steps=2)
    assert replay.size == 4
    rng = np.random.default_rng(1)

    def counts() -> np.ndarray:
        """How often each row is drawn in 20,000 draws."""
        return sum(np.bincount(replay.sample(32, rng, beta=0.4).rows, minlength=4) for _ in range(625))

    # priorities^alpha (|td| + 1)^0.5 = 9, 1, 1, 1: row 0 is drawn 9/12 of the time, the others 1/12 each.
    # The binomial standard errors, sqrt(20,000 p (1 - p)): 61 and 39 draws (stratified draws vary less).
    replay.update_priorities(np.arange(4), np.array([80.0, 0.0, 0.0, 0.0]))
    np.testing.assert_allclose(counts(), [15_000, 1_667, 1_667, 1_667], atol=4 * 61)
    replay.update_priorities(np.array([0, 3]), torch.tensor([0.0, -80.0]))  # the sign does not count
    first = counts()
    np.testing.assert_allclose(first, [1_667, 1_667, 1_667, 15_000], atol=4 * 61)
    assert 8 < first[3] / first[:3].mean() < 10
    replay.add(*next(episodes(1, n_envs=1)))  # row 0 rewritten: the largest priority so far, 81^0.5
    assert replay.sampler.tree.values(np.array([0])).tolist() == [9.0]


def test_weights_are_the_ratio_of_probabilities_to_the_minus_beta_by_hand():
    replay = filled(ReplayBuffer(3, 3, 2), alpha=1.0, eps=0.5, steps=2)
    replay.update_priorities(np.arange(3), np.array([0.5, 0.5, 1.5]))  # priorities 1, 1, 2 of a total of 4
    batch = replay.sample(4, np.random.default_rng(2), beta=0.5)
    # Four strata of the total, each 1 wide: rows 0, 1, 2, 2 whatever the draws. P = 1/4, 1/4, 1/2, 1/2, and
    # (N P_i)^-beta divided by the batch's largest is (P_i / P_min)^-beta: 1, 1, 2^-0.5, 2^-0.5.
    assert batch.rows.tolist() == [0, 1, 2, 2]
    assert batch.weights.dtype == torch.float32
    torch.testing.assert_close(batch.weights, torch.tensor([1.0, 1.0, 2**-0.5, 2**-0.5]))
    assert torch.equal(batch.obs, torch.from_numpy(replay.buffer.obs[[0, 1, 2, 2]]))
    assert replay.buffer.sample(4, np.random.default_rng(2), beta=0.5).weights is None  # the uniform one: none


@pytest.mark.parametrize("buffer", [ReplayBuffer, CompactReplayBuffer])
def test_a_saved_replay_comes_back_with_its_priorities_and_samples_alike(tmp_path, buffer):
    replay, rng = filled(buffer(12, 3, 2)), np.random.default_rng(3)
    for _ in range(5):
        batch = replay.sample(8, rng, beta=0.4)
        replay.update_priorities(batch.rows, rng.normal(size=8))
    replay.save(tmp_path / "replay.safetensors")
    again = PrioritizedReplay(buffer(12, 3, 2))
    again.load(tmp_path / "replay.safetensors")
    np.testing.assert_array_equal(again.sampler.tree.nodes, replay.sampler.tree.nodes)
    assert again.sampler.max_priority == replay.sampler.max_priority > 1.0
    one, two = (r.sample(16, np.random.default_rng(4), beta=0.4) for r in (replay, again))
    np.testing.assert_array_equal(one.rows, two.rows)
    for f in ("obs", "actions", "rewards", "next_obs", "terminated", "weights"):
        assert torch.equal(getattr(one, f), getattr(two, f))


def test_a_plain_replay_or_another_size_is_refused(tmp_path):
    plain = ReplayBuffer(12, 3, 2)
    plain.add(*next(episodes(1)))
    plain.save(tmp_path / "plain.safetensors")
    with pytest.raises(ConfigError) as refused:
        PrioritizedReplay(ReplayBuffer(12, 3, 2)).load(tmp_path / "plain.safetensors")
    message = str(refused.value)
    assert message.endswith("plain.safetensors' was saved without prioritized replay: resume with the same setting")
    assert "\n" not in message
    filled(ReplayBuffer(12, 3, 2)).save(tmp_path / "prioritized.safetensors")
    with pytest.raises(ConfigError, match="holds priorities for 12 rows; this run's buffer_size is 8"):
        PrioritizedReplay(ReplayBuffer(8, 3, 2)).load(tmp_path / "prioritized.safetensors")


@pytest.mark.parametrize("buffer_cls", [ReplayBuffer, CompactReplayBuffer])
def test_initial_priorities_given_with_an_add_are_those_of_its_transitions(buffer_cls):
    # an actor's initial priorities (Ape-X): one |TD error| per transition added, in order
    replay = PrioritizedReplay(buffer_cls(20, 3, 2), alpha=1.0, eps=0.5)
    step = next(episodes(1, n_envs=3))
    rows = replay.add(*step, priorities=np.array([1.5, 0.0, 3.5]))
    transition_rows = rows[:3]
    assert replay.buffer.live(transition_rows).all()
    np.testing.assert_allclose(replay.sampler.tree.values(transition_rows), [2.0, 0.5, 4.0])  # (|td| + eps)^alpha
    np.testing.assert_allclose(replay.sampler.tree.values(rows[3:]), 0.0)  # a compact buffer's observation rows


def test_many_actors_envs_share_a_compact_buffer_by_their_env_ids():
    # two actors' envs (ids 0-1 and 2-3) take turns: each env's next transition still reuses its last observation
    # row, and every stored transition's next observation is its own
    compact, full = CompactReplayBuffer(200, 3, 2), ReplayBuffer(200, 3, 2)
    actors = [episodes(30, n_envs=2), episodes(30, n_envs=2)]
    for _ in range(30):
        for a, stream in enumerate(actors):
            obs, actions, rewards, next_obs, terminated, valid = next(stream)
            obs, next_obs = obs.copy(), next_obs.copy()
            obs[:, 2] += 2 * a  # the global env id in the observation
            next_obs[:, 2] += 2 * a
            ids = np.array([2 * a, 2 * a + 1])
            compact.add(obs, actions, rewards, next_obs, terminated, valid, env_ids=ids)
            full.add(obs, actions, rewards, next_obs, terminated, valid, env_ids=ids)
    assert compact.size == full.size
    assert compact.filled < 1.5 * full.size  # rows reused across the interleaving (2 x size without it)
    rows = np.flatnonzero(compact.starts[: compact.filled])
    batch = compact.take(rows)
    pairs = {(tuple(o), tuple(n)) for o, n in zip(batch.obs.numpy().tolist(), batch.next_obs.numpy().tolist())}
    every = full.take(np.arange(full.size))
    assert pairs == {(tuple(o), tuple(n)) for o, n in zip(every.obs.numpy().tolist(), every.next_obs.numpy().tolist())}
