"""n-step transitions worked out by hand: full windows, an episode's end (terminated or truncated) inside a window,
reset steps, several environments, a segment's cut, and n = 1 as distrl's one-step transitions."""

import numpy as np
import pytest

from distrl.algos.nstep import NStepAccumulator
from distrl.config import ConfigError


def step(acc, t, reward, terminated=False, truncated=False, valid=True, envs=1):
    """Env i's observation at time t is [10 i + t]; its action at t is t."""
    obs = np.array([[10.0 * i + t] for i in range(envs)], np.float32)
    next_obs = obs + 1
    actions = np.full(envs, t, np.int64)
    flags = np.full(envs, terminated), np.full(envs, truncated), np.full(envs, valid)
    return acc.add(obs, actions, np.full(envs, reward, np.float32), next_obs, *flags)


def rows(batch):
    return [
        (float(o[0]), int(a), float(r), float(n[0]), float(d), float(g))
        for o, a, r, n, d, g in zip(
            batch.obs, batch.actions, batch.returns, batch.next_obs, batch.terminated, batch.discounts
        )
    ]


def test_a_full_window_sums_n_discounted_rewards_and_bootstraps_n_steps_ahead():
    acc = NStepAccumulator(1, n=3, gamma=0.5)
    assert len(step(acc, 0, 1.0)) == 0 and len(step(acc, 1, 2.0)) == 0
    # t = 0: 1 + 0.5 * 2 + 0.25 * 4 = 3, bootstrapping from obs 3 with 0.5^3
    assert rows(step(acc, 2, 4.0)) == [(0.0, 0, 3.0, 3.0, 0.0, 0.125)]
    # t = 1: 2 + 0.5 * 4 + 0.25 * 8 = 6, from obs 4
    assert rows(step(acc, 3, 8.0)) == [(1.0, 1, 6.0, 4.0, 0.0, 0.125)]


@pytest.mark.parametrize("terminated", [True, False], ids=["terminated", "truncated"])
def test_an_episode_end_inside_a_window_emits_every_transition_held_with_its_own_steps(terminated):
    acc = NStepAccumulator(1, n=3, gamma=0.5)
    step(acc, 0, 1.0)
    step(acc, 1, 2.0)
    step(acc, 2, 4.0)  # emits t = 0
    ended = rows(step(acc, 3, 8.0, terminated=terminated, truncated=not terminated))
    flag = 1.0 if terminated else 0.0  # a truncation bootstraps from the final observation (obs 4)
    assert ended == [
        (1.0, 1, 2.0 + 0.5 * 4.0 + 0.25 * 8.0, 4.0, flag, 0.125),
        (2.0, 2, 4.0 + 0.5 * 8.0, 4.0, flag, 0.25),
        (3.0, 3, 8.0, 4.0, flag, 0.5),
    ]
    assert len(step(acc, 4, 100.0, valid=False)) == 0  # the reset step adds nothing
    step(acc, 5, 1.0)
    step(acc, 6, 1.0)
    assert rows(step(acc, 7, 1.0)) == [(5.0, 5, 1.75, 8.0, 0.0, 0.125)]  # the new episode starts afresh


def test_environments_keep_windows_of_their_own():
    acc = NStepAccumulator(2, n=2, gamma=1.0)
    obs = np.array([[0.0], [10.0]], np.float32)
    first = acc.add(obs, np.array([0, 0]), np.array([1.0, 2.0]), obs + 1, np.array([False, True]), np.zeros(2, bool),
                    np.ones(2, bool))  # fmt: skip
    assert rows(first) == [(10.0, 0, 2.0, 11.0, 1.0, 1.0)]  # env 1 terminated at once
    second = acc.add(obs + 1, np.array([1, 1]), np.array([3.0, 5.0]), obs + 2, np.zeros(2, bool), np.zeros(2, bool),
                     np.array([True, False]))  # fmt: skip
    assert rows(second) == [(0.0, 0, 4.0, 2.0, 0.0, 1.0)]  # env 0's window; env 1's reset step adds nothing


def test_a_cut_emits_what_is_held_as_truncated_at_the_current_observation():
    acc = NStepAccumulator(1, n=3, gamma=0.5)
    step(acc, 0, 1.0)
    step(acc, 1, 2.0)
    cut = rows(acc.cut(np.array([[2.0]], np.float32)))
    assert cut == [(0.0, 0, 2.0, 2.0, 0.0, 0.25), (1.0, 1, 2.0, 2.0, 0.0, 0.5)]
    assert len(acc.cut(np.array([[2.0]], np.float32))) == 0


def test_one_step_is_the_plain_transition():
    acc = NStepAccumulator(1, n=1, gamma=0.99)
    assert rows(step(acc, 0, 1.5)) == [(0.0, 0, 1.5, 1.0, 0.0, pytest.approx(0.99))]
    assert rows(step(acc, 1, 2.0, terminated=True)) == [(1.0, 1, 2.0, 2.0, 1.0, pytest.approx(0.99))]


def test_the_caller_may_reuse_its_arrays():
    acc = NStepAccumulator(1, n=2, gamma=1.0)
    obs = np.array([[0.0]], np.float32)
    acc.add(obs, np.array([0]), np.array([1.0]), obs + 1, np.zeros(1, bool), np.zeros(1, bool), np.ones(1, bool))
    obs[0, 0] = 99.0  # a vector env writes its next observation into the same array
    out = acc.add(obs, np.array([1]), np.array([1.0]), obs + 1, np.zeros(1, bool), np.zeros(1, bool), np.ones(1, bool))
    assert float(out.obs[0, 0]) == 0.0


def test_bad_settings_are_refused():
    with pytest.raises(ConfigError, match="n_step=0 is not allowed"):
        NStepAccumulator(1, n=0, gamma=0.99)
    with pytest.raises(ConfigError, match="gamma=1.5 is not allowed"):
        NStepAccumulator(1, n=3, gamma=1.5)
