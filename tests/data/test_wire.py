"""The message format between distrl's processes: exact round trips, and no code on read."""

import pickle

import numpy as np
import pytest

from distrl.data.episodes import EpisodeBatch
from distrl.data.wire import pack, unpack
from distrl.strategies.actor_learner import unpack_batch


def test_arrays_and_values_round_trip_exactly():
    fields = {
        "version": 7,
        "params": np.arange(5, dtype=np.float32) / 3,
        "stats": {"mean": np.ones((2, 3)), "count": np.array(4.0)},
        "returns": [0.1, 1e-300, -2.5],
        "empty": np.zeros((0, 4), np.int64),
        "none": None,
        "scalar": np.float64(0.3),
    }
    out = unpack(pack(fields))
    assert out["version"] == 7 and out["returns"] == [0.1, 1e-300, -2.5] and out["none"] is None
    assert out["scalar"] == 0.3
    for got, want in [
        (out["params"], fields["params"]),
        (out["stats"]["mean"], fields["stats"]["mean"]),
        (out["stats"]["count"], fields["stats"]["count"]),
        (out["empty"], fields["empty"]),
    ]:
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    out["params"][0] = 99.0  # writable, and not shared with the sender
    assert fields["params"][0] == 0.0


def test_a_worker_batch_comes_back_as_the_same_batch():
    batch = EpisodeBatch(
        obs=np.random.default_rng(0).standard_normal((6, 4), dtype=np.float32),
        actions=np.array([0, 1, 1, 0, 1, 0]),
        rewards=np.ones(6, np.float32),
        starts=np.array([0, 2, 6]),
        policy_version=3,
        steps=8,
        episode_returns=[2.0, 4.0],
        episode_lengths=[2, 4],
        collect_s=0.25,
    )
    got = unpack_batch(pack({"type": "EpisodeBatch", **vars(batch)}))
    assert isinstance(got, EpisodeBatch) and got.policy_version == 3 and got.steps == 8 and got.collect_s == 0.25
    assert got.episode_returns == [2.0, 4.0] and got.episode_lengths == [2, 4]
    for name in ("obs", "actions", "rewards", "starts"):
        assert np.array_equal(getattr(got, name), getattr(batch, name))


def test_reading_a_message_never_unpickles():
    class Boom:
        def __reduce__(self):
            return (exec, ("raise SystemExit('ran')",))

    with pytest.raises(TypeError):  # what cannot be said in JSON cannot be packed
        pack({"x": Boom()})
    message = pickle.dumps({"x": 1})  # a pickle is not a message: rejected, never run
    with pytest.raises(ValueError):
        unpack(message)
