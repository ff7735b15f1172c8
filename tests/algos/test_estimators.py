import numpy as np
import pytest

from distrl.algos.estimators import discounted_returns, gae

GAMMA, LAM = 0.9, 0.8
VALUES = np.array([[0.5], [0.4], [0.3], [0.2], [0.1]], dtype=np.float32)  # [T + 1, N]
REWARDS = np.ones((4, 1), dtype=np.float32)


def flags(**steps):
    out = np.zeros((4, 1), dtype=bool)
    for t in steps.get("at", ()):
        out[t, 0] = True
    return out


def test_gae_without_episode_end_matches_hand_computation():
    # delta_t = 1 + 0.9 v_{t+1} - v_t = 0.86, 0.87, 0.88, 0.89; A_t = delta_t + 0.72 A_{t+1}
    adv, ret = gae(REWARDS, VALUES, flags(), flags(), ~flags(), GAMMA, LAM)
    expected = [2.27478272, 1.964976, 1.5208, 0.89]
    np.testing.assert_allclose(adv[:, 0], expected, rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], np.array(expected) + VALUES[:4, 0], rtol=1e-6)


def test_truncation_bootstraps_from_final_observation_and_skips_reset_step():
    # step 1 is truncated; VALUES[2] is the value of its true final observation;
    # step 2 is the reset step (invalid); step 3 starts a new episode.
    adv, ret = gae(REWARDS, VALUES, flags(), flags(at=[1]), ~flags(at=[2]), GAMMA, LAM)
    np.testing.assert_allclose(adv[:, 0], [0.86 + 0.72 * 0.87, 0.87, 0.0, 0.89], rtol=1e-6)
    assert ret[2, 0] == 0.0


def test_a_restarted_truncation_bootstraps_from_its_recorded_final_value():
    # step 1 is truncated and the next episode began at once: VALUES[2] is its first observation's value and
    # 0.25 the recorded value of step 1's true final observation. Step 2 is a real step (valid), no reset step:
    # delta_1 = 1 + 0.9 * 0.25 - 0.4 = 0.825 and no trace past it; steps 2 and 3 as without an end.
    final = np.zeros((4, 1), dtype=np.float32)
    final[1, 0] = 0.25
    adv, ret = gae(REWARDS, VALUES, flags(), flags(at=[1]), ~flags(), GAMMA, LAM, final_values=final)
    np.testing.assert_allclose(adv[:, 0], [0.86 + 0.72 * 0.825, 0.825, 0.88 + 0.72 * 0.89, 0.89], rtol=1e-6)
    np.testing.assert_allclose(ret[:, 0], adv[:, 0] + VALUES[:4, 0], rtol=1e-6)
    # a termination ignores the recorded value (0 by the collector, here not even that)
    final[1, 0] = 7.0
    adv, _ = gae(REWARDS, VALUES, flags(at=[1]), flags(), ~flags(), GAMMA, LAM, final_values=final)
    np.testing.assert_allclose(adv[:2, 0], [0.86 + 0.72 * 0.6, 0.6], rtol=1e-6)


def test_termination_does_not_bootstrap():
    adv, _ = gae(REWARDS, VALUES, flags(at=[1]), flags(), ~flags(at=[2]), GAMMA, LAM)
    np.testing.assert_allclose(adv[:, 0], [0.86 + 0.72 * 0.6, 0.6, 0.0, 0.89], rtol=1e-6)


def test_gae_lambda_one_gives_discounted_return_minus_value():
    rewards = np.array([[1.0], [2.0], [3.0]], dtype=np.float32)
    values = np.array([[0.3], [0.2], [0.1], [0.0]], dtype=np.float32)
    no = np.zeros((3, 1), dtype=bool)
    adv, ret = gae(rewards, values, no, no, ~no, 0.5, 1.0)
    np.testing.assert_allclose(ret[:, 0], [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0], rtol=1e-6)


def test_envs_are_independent_columns():
    rewards = np.stack([REWARDS[:, 0], 2 * REWARDS[:, 0]], 1)
    values = np.concatenate([VALUES, VALUES], 1)
    term = np.zeros((4, 2), dtype=bool)
    term[1, 1] = True
    valid = np.ones((4, 2), dtype=bool)
    valid[2, 1] = False
    adv, _ = gae(rewards, values, term, np.zeros_like(term), valid, GAMMA, LAM)
    np.testing.assert_allclose(adv[:, 0], [2.27478272, 1.964976, 1.5208, 0.89], rtol=1e-6)
    assert adv[2, 1] == 0.0 and adv[1, 1] == pytest.approx(2 - 0.4)


def test_discounted_returns_by_hand():
    np.testing.assert_allclose(discounted_returns(np.array([1.0, 0.0, 2.0]), 0.5), [1.5, 1.0, 2.0])
