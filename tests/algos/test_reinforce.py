import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.algos.protocols import LocalSync
from distrl.algos.reinforce import REINFORCEAlgo, episode_returns_to_go, reinforce_loss
from distrl.config import REINFORCEConfig
from distrl.data.episodes import EpisodeBatch, merge_episode_batches
from distrl.nets import ActorCritic


def test_returns_to_go_restart_at_each_episode():
    rewards = np.array([1.0, 1.0, 1.0, 5.0, 0.0], dtype=np.float32)
    starts = np.array([0, 3, 5])
    # episode 1: 1 + .5 + .25, 1 + .5, 1; episode 2: 5 + 0, 0
    np.testing.assert_allclose(episode_returns_to_go(rewards, starts, 0.5), [1.75, 1.5, 1.0, 5.0, 0.0])


def test_policy_gradient_loss_sign():
    log_prob = torch.tensor([-0.5, -2.0]).requires_grad_(True)
    loss = reinforce_loss(
        log_prob,
        torch.zeros(2),
        torch.zeros(2),
        torch.zeros(2),
        torch.tensor([2.0, -1.0]),
        baseline=False,
        vf_coef=0.5,
        ent_coef=0.0,
    )
    assert float(loss) == pytest.approx(1.0 - 2.0)  # sum of -log_prob * A
    (d,) = torch.autograd.grad(loss, [log_prob])
    torch.testing.assert_close(d, torch.tensor([-2.0, 1.0]))


def test_reinforce_loss_fits_the_baseline_and_adds_the_entropy_bonus_by_hand():
    values, entropy = torch.tensor([1.0, 3.0]).requires_grad_(True), torch.tensor([0.5, 0.25]).requires_grad_(True)
    loss = reinforce_loss(
        torch.zeros(2),
        entropy,
        values,
        torch.tensor([2.0, 2.0]),
        torch.zeros(2),
        baseline=True,
        vf_coef=0.5,
        ent_coef=0.01,
    )
    assert float(loss) == pytest.approx(0.5 * (1.0 + 1.0) - 0.01 * 0.75)
    d_values, d_entropy = torch.autograd.grad(loss, [values, entropy])
    assert d_values.tolist() == pytest.approx([-1.0, 1.0]) and d_entropy.tolist() == pytest.approx([-0.01, -0.01])


def one_step_batch(actions, rewards):
    n = len(actions)
    return EpisodeBatch(
        obs=np.zeros((n, 3), np.float32),
        actions=np.array(actions),
        rewards=np.array(rewards, np.float32),
        starts=np.arange(n + 1),
        policy_version=0,
        steps=n,
    )


def test_update_makes_the_rewarded_action_more_likely():
    agent = ActorCritic(3, spaces.Discrete(2), (8,), seed=0)
    algo = REINFORCEAlgo(REINFORCEConfig(learning_rate=0.05), agent)
    batch = one_step_batch([0, 1, 0, 1], [1.0, 0.0, 1.0, 0.0])  # action 0 pays
    obs = torch.zeros(1, 3)
    before = float(agent.log_prob(obs, torch.tensor([0])))
    for _ in range(5):
        algo.update(batch, LocalSync())
    assert float(agent.log_prob(obs, torch.tensor([0]))) > before + 0.1


def test_normalised_returns_make_a_constant_reward_a_zero_gradient():
    agent = ActorCritic(3, spaces.Discrete(2), (8,), seed=0)
    algo = REINFORCEAlgo(REINFORCEConfig(normalize_returns=True), agent)
    metrics = algo.update(one_step_batch([0, 0, 0, 1], [1.0, 1.0, 1.0, 1.0]), LocalSync())
    assert metrics["losses/grad_norm"] == pytest.approx(0.0, abs=1e-6)
    unnormalised = REINFORCEAlgo(
        REINFORCEConfig(normalize_returns=False), ActorCritic(3, spaces.Discrete(2), (8,), seed=0)
    )
    assert unnormalised.update(one_step_batch([0, 0, 0, 1], [1.0, 1.0, 1.0, 1.0]), LocalSync())["losses/grad_norm"] > 0


def test_baseline_is_fitted_to_the_returns():
    agent = ActorCritic(3, spaces.Discrete(2), (8,), seed=0)
    algo = REINFORCEAlgo(REINFORCEConfig(baseline=True, learning_rate=0.05, vf_coef=1.0), agent)
    batch = one_step_batch([0, 1, 0, 1], [3.0, 3.0, 3.0, 3.0])
    first = algo.update(batch, LocalSync())["losses/value_loss"]
    for _ in range(30):
        last = algo.update(batch, LocalSync())["losses/value_loss"]
    assert last < 0.5 * first


def test_merge_keeps_episode_boundaries():
    a, b = one_step_batch([0, 1], [1.0, 2.0]), one_step_batch([1], [3.0])
    merged = merge_episode_batches([a, b])
    assert merged.starts.tolist() == [0, 1, 2, 3] and merged.rewards.tolist() == [1.0, 2.0, 3.0]
    assert merged.steps == 3 and merged.n_episodes == 3
