"""Prioritised replay's sum tree and sampler: sums, prefix search, sampling frequencies, weights, state."""

import numpy as np
import pytest

from distrl.config import ConfigError
from distrl.data.prioritized import PrioritizedSampler, SumTree


@pytest.mark.parametrize("capacity", [1, 5, 8, 1000])
def test_every_node_is_the_sum_of_its_children_after_batched_updates(capacity):
    tree = SumTree(capacity)
    rng = np.random.default_rng(0)
    expected = np.zeros(capacity)
    for _ in range(20):
        leaves = rng.integers(0, capacity, size=7)  # repeats too: the last value of a leaf wins
        values = rng.random(7) * 10
        tree.update(leaves, values)
        for leaf, value in zip(leaves, values):
            expected[leaf] = value
    assert tree.total == pytest.approx(expected.sum(), rel=1e-12)
    np.testing.assert_array_equal(tree.values(np.arange(capacity)), expected)
    inner = np.arange(1, tree.size)
    np.testing.assert_allclose(tree.nodes[inner], tree.nodes[2 * inner] + tree.nodes[2 * inner + 1], rtol=1e-12)


def test_find_returns_the_leaf_whose_cumulative_range_holds_the_prefix():
    tree = SumTree(5)
    tree.update(np.arange(5), np.array([1.0, 0.0, 2.0, 0.5, 1.5]))  # ranges [0,1) [1,1) [1,3) [3,3.5) [3.5,5)
    prefix = np.array([0.0, 0.999, 1.0, 2.999, 3.0, 3.49, 3.5, 4.999])
    np.testing.assert_array_equal(tree.find(prefix), [0, 0, 2, 2, 3, 3, 4, 4])  # leaf 1 (value 0) never
    assert tree.find(np.array([np.nextafter(5.0, 0)])).tolist() == [4]


def test_negative_or_infinite_priorities_are_refused():
    tree = SumTree(4)
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([0]), np.array([-1.0]))
    with pytest.raises(ValueError, match="finite and >= 0"):
        tree.update(np.array([0]), np.array([np.inf]))
    with pytest.raises(ConfigError, match="capacity=0 is not allowed"):
        SumTree(0)


def test_rows_are_drawn_as_often_as_their_priority_to_the_alpha_says():
    sampler = PrioritizedSampler(6, alpha=0.5)
    sampler.added(np.arange(6))
    td_errors = np.array([0.0, 1.0, 4.0, 9.0, 16.0, 0.25])
    sampler.update(np.arange(6), td_errors)
    expected = (np.abs(td_errors) + sampler.eps) ** 0.5
    expected /= expected.sum()
    rng = np.random.default_rng(1)
    counts = np.zeros(6)
    draws = 4000
    for _ in range(draws):
        rows, _ = sampler.sample(32, rng, beta=0.4)
        counts += np.bincount(rows, minlength=6)
    frequencies = counts / counts.sum()
    # 128,000 draws: each frequency's standard error is below 0.0014
    np.testing.assert_allclose(frequencies, expected, atol=0.005)
    assert counts[0] < 0.01 * counts.sum()  # |td| = 0 leaves only eps: almost never drawn


def test_a_batch_is_stratified_over_the_total():
    sampler = PrioritizedSampler(4, alpha=1.0)
    sampler.added(np.arange(4))
    sampler.update(np.arange(4), np.array([1.0, 1.0, 1.0, 1.0]))
    rows, _ = sampler.sample(4, np.random.default_rng(0), beta=1.0)
    assert sorted(rows.tolist()) == [0, 1, 2, 3]  # one draw per quarter: each row once


def test_weights_by_hand_and_new_rows_take_the_largest_priority():
    sampler = PrioritizedSampler(3, alpha=1.0, eps=1e-6)
    sampler.added(np.arange(3))
    sampler.update(np.array([0, 1, 2]), np.array([1.0, 3.0, 0.5]))
    total = 1.0 + 3.0 + 0.5 + 3e-6
    rows, weights = sampler.sample(3, np.random.default_rng(0), beta=0.5)
    p = (np.array([1.0, 3.0, 0.5]) + 1e-6)[rows] / total
    by_hand = (3 * p) ** -0.5 / ((3 * p) ** -0.5).max()
    np.testing.assert_allclose(weights, by_hand, rtol=1e-6)
    assert weights.dtype == np.float32 and weights.max() == 1.0
    assert sampler.max_priority == pytest.approx(3.0 + 1e-6)
    sampler.added(np.array([1]))  # row 1 rewritten with a new transition: the largest priority so far
    assert sampler.tree.values(np.array([1]))[0] == pytest.approx(3.0 + 1e-6)


def test_the_state_round_trips_and_sampling_goes_on_alike():
    a = PrioritizedSampler(10, alpha=0.6)
    a.added(np.arange(10))
    a.update(np.arange(10), np.linspace(0.1, 5.0, 10))
    b = PrioritizedSampler(10, alpha=0.6)
    b.load({k: v.copy() for k, v in a.state().items()})
    assert b.max_priority == a.max_priority
    rows_a, weights_a = a.sample(16, np.random.default_rng(3), beta=0.4)
    rows_b, weights_b = b.sample(16, np.random.default_rng(3), beta=0.4)
    np.testing.assert_array_equal(rows_a, rows_b)
    np.testing.assert_array_equal(weights_a, weights_b)
    with pytest.raises(ValueError, match="priorities of shape"):
        PrioritizedSampler(5).load(a.state())


def test_sampling_an_empty_sampler_is_refused():
    with pytest.raises(ConfigError, match="sample after the buffer holds a row"):
        PrioritizedSampler(4).sample(2, np.random.default_rng(0), beta=0.4)
