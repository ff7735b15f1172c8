import numpy as np

from distrl.data.normalize import ObsNormalizer, RewardScaler, RunningMeanStd, moments


def test_running_stats_equal_numpy_over_batches():
    rng = np.random.default_rng(0)
    data = rng.normal(3.0, 2.0, size=(1000, 3))
    stats = RunningMeanStd((3,))
    for chunk in np.array_split(data, 7):
        stats.update_from_moments(moments(chunk))
    np.testing.assert_allclose(stats.mean, data.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.var, data.var(0), rtol=1e-4)


def test_summed_moments_of_two_workers_equal_moments_of_all_data():
    rng = np.random.default_rng(1)
    a, b = rng.normal(size=(50, 2)), rng.normal(1.0, size=(70, 2))
    np.testing.assert_allclose(moments(a) + moments(b), moments(np.concatenate([a, b])))


def test_obs_normalizer_state_round_trip_and_clip():
    norm = ObsNormalizer((2,), enabled=True, clip=5.0)
    norm.update(moments(np.array([[0.0, 10.0], [2.0, 10.0]])))
    out = norm(np.array([[1.0, 1e6]], dtype=np.float32))
    assert out.dtype == np.float32 and out[0, 0] < 1e-3 and out[0, 1] == 5.0
    other = ObsNormalizer((2,), enabled=True, clip=5.0)
    other.stats.load(norm.stats.state())
    other.refresh()
    np.testing.assert_array_equal(other(np.ones((1, 2), np.float32)), norm(np.ones((1, 2), np.float32)))


def test_reward_scaler_tracks_discounted_return_and_resets_at_episode_end():
    scaler = RewardScaler(1, gamma=0.5, enabled=True)
    ended = np.array([False])
    valid = np.array([True])
    for r in (1.0, 1.0):
        scaler(np.array([r], np.float32), ended, valid)
    assert scaler.returns[0] == 1.5
    scaler(np.array([1.0], np.float32), np.array([True]), valid)
    assert scaler.returns[0] == 0.0
    m = scaler.take_moments()
    assert m[0] == 3 and m[1] == 1.0 + 1.5 + 1.75
