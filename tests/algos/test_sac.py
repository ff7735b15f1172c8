import math

import numpy as np
import pytest
import torch

from distrl.algos.protocols import LocalSync
from distrl.algos.sac import critic_target, polyak
from distrl.config import ConfigError, SACConfig
from distrl.data.replay import ReplayBuffer, Transitions
from distrl.nets.sac import SquashedGaussianActor, squashed_log_prob
from reference import mlp, sac_algo


def test_critic_target_by_hand_termination_vs_truncation():
    y = critic_target(
        torch.tensor([1.0, 1.0]),
        torch.tensor([0.0, 1.0]),
        torch.tensor([2.0, 2.0]),
        torch.tensor([3.0, 3.0]),
        torch.tensor([-0.5, -0.5]),
        alpha=0.2,
        gamma=0.9,
    )
    # min(2, 3) - 0.2 * (-0.5) = 2.1; bootstrap 1 + 0.9 * 2.1 = 2.89; terminated: reward only
    torch.testing.assert_close(y, torch.tensor([2.89, 1.0]))


def test_polyak_update():
    target, source = torch.tensor([0.0, 10.0]), torch.tensor([1.0, 0.0])
    polyak(target, source, 0.1)
    torch.testing.assert_close(target, torch.tensor([0.1, 9.0]))


def test_tanh_log_prob_matches_numerical_density_of_the_squashed_action():
    mean, log_std = torch.tensor([[0.3]]), torch.tensor([[-0.2]])
    normal = torch.distributions.Normal(mean, log_std.exp())
    for a0 in (-0.9, -0.2, 0.0, 0.5, 0.95):
        u = torch.atanh(torch.tensor([[a0]]))
        eps = (u - mean) / log_std.exp()
        ours = float(squashed_log_prob(u, eps, log_std).exp())
        h = 1e-4  # P(a in [a0 - h, a0 + h]) / 2h through the normal CDF of atanh(a)
        lo, hi = torch.atanh(torch.tensor([[a0 - h]])), torch.atanh(torch.tensor([[a0 + h]]))
        numerical = float((normal.cdf(hi.double()) - normal.cdf(lo.double())) / (2 * h))
        assert ours == pytest.approx(numerical, rel=2e-3)


def test_squashed_log_prob_stays_finite_where_tanh_saturates():
    u = torch.tensor([[30.0]])
    lp = squashed_log_prob(u, torch.zeros(1, 1), torch.zeros(1, 1))
    assert torch.isfinite(lp).all()


def test_entropy_coefficient_loss_and_gradient_by_hand():
    cfg = SACConfig(ent_coef="auto_0.5", batch_size=4, buffer_size=10, net_arch=(8,))
    algo = sac_algo(cfg, seed=0)
    assert algo.alpha == pytest.approx(0.5) and algo.target_entropy == -2.0
    assert SACConfig(ent_coef="0.2").entropy_setting() == (False, 0.2)
    with pytest.raises(ConfigError, match="ent_coef='fast'"):
        SACConfig(ent_coef="fast")


class Recorder(LocalSync):
    def __init__(self):
        self.grads = []

    def gradients(self, grad, stats):
        self.grads.append(grad.clone())


def sample_batch(n=32, obs_dim=3, action_dim=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return Transitions(
        torch.randn(n, obs_dim, generator=g),
        torch.rand(n, action_dim, generator=g) * 2 - 1,
        torch.randn(n, generator=g),
        torch.randn(n, obs_dim, generator=g),
        (torch.rand(n, generator=g) < 0.2).float(),
    )


def reference_views(params, data):
    flat = data.clone().requires_grad_(True)
    return flat, {name: flat[s:e].view(params.shapes[name]) for name, (s, e) in params.offsets.items()}


def actor_sample(views, obs, eps, n_layers, action_dim):
    out = mlp(views, "actor", obs, n_layers, "relu")
    mean, log_std = out[:, :action_dim], out[:, action_dim:].clamp(-20, 2)
    u = mean + log_std.exp() * eps
    a = torch.tanh(u)
    normal = torch.distributions.Normal(mean, log_std.exp())
    return a, (normal.log_prob(u) - torch.log(1 - a.square())).sum(-1)


def q_values(views, obs, action, n_layers):
    x = torch.cat([obs, action], 1)
    return mlp(views, "q1", x, n_layers, "relu").squeeze(1), mlp(views, "q2", x, n_layers, "relu").squeeze(1)


def test_sac_gradients_equal_autograd_of_the_losses():
    cfg = SACConfig(batch_size=32, buffer_size=100, net_arch=(16, 16), gamma=0.9, ent_coef="auto_0.3")
    algo = sac_algo(cfg, seed=1)
    batch = sample_batch()
    g = torch.Generator().manual_seed(5)
    eps_next, eps_pi = torch.randn(32, 2, generator=g), torch.randn(32, 2, generator=g) * 0.5
    actor0, critic0 = algo.actor.params.data.clone(), algo.critic.params.data.clone()
    target0 = algo.critic_target.params.data.clone()
    recorder = Recorder()
    algo.update(batch, recorder, eps_next, eps_pi)
    critic1 = algo.critic.params.data.clone()  # after the critic step: what the actor loss sees
    n_layers = 3

    # critic and log_alpha: 1/2 sum_i (Q_i - y)^2 - log_alpha * sum(log_pi + target_entropy)
    _, actor_views = reference_views(algo.actor.params, actor0)
    _, target_views = reference_views(algo.critic_target.params, target0)
    critic_flat, critic_views = reference_views(algo.critic.params, critic0)
    with torch.no_grad():
        alpha = math.exp(float(critic0[algo.critic.params.offsets["log_alpha"][0]]))
        a_next, lp_next = actor_sample(actor_views, batch.next_obs, eps_next, n_layers, 2)
        tq1, tq2 = q_values(target_views, batch.next_obs, a_next, n_layers)
        y = batch.rewards + 0.9 * (1 - batch.terminated) * (torch.minimum(tq1, tq2) - alpha * lp_next)
        _, lp_pi = actor_sample(actor_views, batch.obs, eps_pi, n_layers, 2)
    q1, q2 = q_values(critic_views, batch.obs, batch.actions, n_layers)
    critic_loss = 0.5 * ((q1 - y).square() + (q2 - y).square()).sum()
    alpha_loss = -(critic_views["log_alpha"][0] * (lp_pi + algo.target_entropy)).sum()
    (critic_loss + alpha_loss).backward()
    torch.testing.assert_close(recorder.grads[0], critic_flat.grad, rtol=1e-4, atol=1e-5)

    # actor: sum(alpha log_pi - min(Q1, Q2)) against the updated critics
    actor_flat, actor_views = reference_views(algo.actor.params, actor0)
    _, critic_views = reference_views(algo.critic.params, critic1)
    a_pi, lp = actor_sample(actor_views, batch.obs, eps_pi, n_layers, 2)
    q1, q2 = q_values(critic_views, batch.obs, a_pi, n_layers)
    (alpha * lp - torch.minimum(q1, q2)).sum().backward()
    torch.testing.assert_close(recorder.grads[1], actor_flat.grad, rtol=1e-4, atol=1e-5)


def test_target_critics_follow_by_polyak_and_fixed_alpha_stays_fixed():
    cfg = SACConfig(batch_size=16, buffer_size=100, net_arch=(8,), tau=0.5, ent_coef="0.2")
    algo = sac_algo(cfg, seed=0)
    before = algo.critic_target.params.data.clone()
    algo.update(sample_batch(16), LocalSync())
    expected = 0.5 * before + 0.5 * algo.critic.params.data
    torch.testing.assert_close(algo.critic_target.params.data, expected)
    assert algo.alpha == pytest.approx(0.2)


def test_replay_buffer_skips_reset_steps_wraps_and_round_trips(tmp_path):
    rb = ReplayBuffer(5, obs_dim=2, action_shape=1)
    for step in range(4):
        obs = np.full((2, 2), step, np.float32)
        rb.add(
            obs,
            np.zeros((2, 1), np.float32),
            np.array([step, step + 0.5], np.float32),
            obs + 1,
            np.zeros(2, np.float32),
            np.array([True, step != 1]),
        )
    assert rb.size == 5 and rb.pos == 2  # 7 valid rows into 5 slots
    assert sorted(rb.rewards.tolist()) == [
        1.0,
        2.0,
        2.5,
        3.0,
        3.5,
    ]  # the reset row of step 1 was skipped; oldest evicted
    rb.save(tmp_path / "replay.safetensors")
    other = ReplayBuffer(5, 2, 1)
    other.load(tmp_path / "replay.safetensors")
    assert other.size == 5
    assert sorted(other.rewards.tolist()) == sorted(rb.rewards.tolist())
    (tmp_path / "bad.safetensors").write_bytes(b"junk")
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        other.load(tmp_path / "bad.safetensors")


def test_buffer_smaller_than_batch_is_rejected():
    with pytest.raises(ConfigError, match="buffer_size=100 is not allowed: must be >= batch_size"):
        SACConfig(buffer_size=100, batch_size=256)


def test_deterministic_action_is_tanh_of_mean():
    actor = SquashedGaussianActor(3, 2, (8,), "relu", torch.device("cpu"), seed=0)
    obs = np.random.default_rng(0).normal(size=(4, 3)).astype(np.float32)
    out = actor.net(torch.from_numpy(obs))
    np.testing.assert_allclose(actor.act(obs, None), torch.tanh(out[:, :2]).numpy(), rtol=1e-5, atol=1e-6)
