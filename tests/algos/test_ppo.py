import dataclasses

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.algos.optim import ClippedAdam, linear
from distrl.algos.ppo import PPOAlgo, ppo_loss
from distrl.algos.protocols import LocalSync
from distrl.config import ConfigError, PPOConfig
from distrl.data.packed import PackedBatch
from distrl.data.rollout import Rollout, RolloutBatch
from distrl.nets import ActorCritic, ParamBuffer
from reference import distribution, functional_params, values


def ppo_parts(
    log_prob,
    old,
    adv,
    clip_range,
    values=None,
    old_values=None,
    returns=None,
    clip_range_vf=None,
    vf_coef=0.0,
    ent_coef=0.0,
    entropy=None,
):
    """ppo_loss on leaf inputs: the loss, its per-sample parts, and autograd's d loss / d (log_prob, values)."""
    n = len(log_prob)
    log_prob = log_prob.clone().requires_grad_(True)
    values = (torch.zeros(n) if values is None else values).clone().requires_grad_(True)
    zeros = torch.zeros(n)
    out = ppo_loss(
        log_prob,
        zeros if entropy is None else entropy,
        values,
        old,
        zeros if old_values is None else old_values,
        adv,
        zeros if returns is None else returns,
        torch.ones(n),
        clip_range,
        clip_range_vf,
        vf_coef,
        ent_coef,
    )
    d_log_prob, d_values = torch.autograd.grad(out.loss, [log_prob, values])
    return out, d_log_prob, d_values


def test_clipped_surrogate_by_hand():
    # ratios 1.5, 0.5, 1.1 with clip 0.2: A>0 at 1.5 clips to 1.2; A<0 at 0.5 clips to 0.8; 1.1 is inside
    old = torch.zeros(3)
    log_prob = torch.log(torch.tensor([1.5, 0.5, 1.1]))
    adv = torch.tensor([2.0, -1.0, 3.0])
    out, d_lp, _ = ppo_parts(log_prob, old, adv, 0.2)
    torch.testing.assert_close(out.policy_loss.detach(), torch.tensor([-2.4, 0.8, -3.3]))
    torch.testing.assert_close(d_lp, torch.tensor([0.0, 0.0, -3.3]))  # -A r where unclipped, else 0
    torch.testing.assert_close(out.loss.detach(), torch.tensor(-2.4 + 0.8 - 3.3))
    torch.testing.assert_close(out.ratio.detach(), torch.tensor([1.5, 0.5, 1.1]))


def test_clipped_surrogate_keeps_gradient_when_clipping_makes_it_worse():
    # A < 0 and r = 1.5 > 1 + e: the max picks the unclipped (larger) loss, which still has a gradient
    out, d_lp, _ = ppo_parts(torch.log(torch.tensor([1.5])), torch.zeros(1), torch.tensor([-1.0]), 0.2)
    assert float(out.loss) == pytest.approx(1.5) and float(d_lp) == pytest.approx(1.5)


def test_value_loss_by_hand_with_and_without_clipping():
    zeros = torch.zeros(2)
    v, old, ret = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 0.0]), torch.tensor([0.5, 2.0])
    out, _, d = ppo_parts(zeros, zeros, zeros, 0.2, v, old, ret, None, vf_coef=1.0)
    torch.testing.assert_close(out.value_loss.detach(), torch.tensor([0.25, 4.0]))
    torch.testing.assert_close(d, torch.tensor([1.0, -4.0]))
    # clip 0.2: sample 0 clipped prediction 0.2 -> error 0.09 < 0.25, unclipped taken
    # sample 1: unclipped error 9, clipped prediction -0.2 -> 4.84 -> unclipped taken; gradient 2 * (-3)
    v = torch.tensor([1.0, -1.0])
    out, _, d = ppo_parts(zeros, zeros, zeros, 0.2, v, old, torch.tensor([0.5, 2.0]), 0.2, vf_coef=1.0)
    torch.testing.assert_close(out.value_loss.detach(), torch.tensor([0.25, 9.0]))
    torch.testing.assert_close(d, torch.tensor([1.0, -6.0]))
    # returns far above: clipped error (0.2 - 3)^2 > (1 - 3)^2, and it is flat in v
    out, _, d = ppo_parts(
        torch.zeros(1),
        torch.zeros(1),
        torch.zeros(1),
        0.2,
        torch.tensor([1.0]),
        torch.zeros(1),
        torch.tensor([3.0]),
        0.2,
        vf_coef=1.0,
    )
    assert float(out.value_loss) == pytest.approx(2.8**2) and float(d) == 0.0


def test_ppo_loss_weighs_the_terms_and_skips_invalid_samples():
    # two samples, the second invalid: only the first counts, with vf_coef 0.5 and ent_coef 0.1
    log_prob, entropy = torch.zeros(2), torch.tensor([0.7, 5.0]).requires_grad_(True)
    values = torch.tensor([1.0, 9.0]).requires_grad_(True)
    out = ppo_loss(
        log_prob,
        entropy,
        values,
        torch.zeros(2),
        torch.zeros(2),
        torch.tensor([2.0, 3.0]),
        torch.tensor([0.0, 0.0]),
        torch.tensor([1.0, 0.0]),
        0.2,
        None,
        0.5,
        0.1,
    )
    assert float(out.loss) == pytest.approx(-2.0 + 0.5 * 1.0 - 0.1 * 0.7)  # r = 1: -A, (1 - 0)^2, entropy 0.7
    d_entropy, d_values = torch.autograd.grad(out.loss, [entropy, values])
    assert d_entropy.tolist() == pytest.approx([-0.1, 0.0]) and d_values.tolist() == pytest.approx([1.0, 0.0])


def test_linear_schedule():
    assert linear(1e-3, 0.25, "linear") == pytest.approx(2.5e-4)
    assert linear(1e-3, 0.25, "constant") == 1e-3


def make_batch(agent: ActorCritic, n: int, seed: int = 0, invalid_every: int = 5) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, agent.obs_dim, generator=g)
    if agent.discrete:
        actions = torch.randint(0, agent.action_dim, (n,), generator=g)
    else:
        actions = torch.randn(n, agent.action_dim, generator=g)
    log_probs = agent.log_prob(obs, actions) + 0.3 * torch.randn(n, generator=g)
    valid = torch.ones(n)
    valid[::invalid_every] = 0.0
    return RolloutBatch(
        obs=obs,
        actions=actions,
        log_probs=log_probs,
        values=torch.randn(n, generator=g),
        advantages=torch.randn(n, generator=g),
        returns=torch.randn(n, generator=g),
        valid=valid,
        policy_version=0,
    )


@pytest.mark.parametrize(
    "space", [spaces.Discrete(3), spaces.Box(-1, 1, (2,), np.float32)], ids=["categorical", "gaussian"]
)
@pytest.mark.parametrize("clip_vf", [None, 0.1])
def test_minibatch_gradient_equals_autograd_of_the_loss(space, clip_vf):
    cfg = PPOConfig(n_envs=1, n_steps=40, batch_size=40, ent_coef=0.01, vf_coef=0.7, clip_range_vf=clip_vf)
    agent = ActorCritic(4, space, (16, 16), seed=0)
    algo = PPOAlgo(cfg, agent, seed=0)
    batch = make_batch(agent, 40)
    adv = algo.normalized_advantages(batch, LocalSync())
    stats = algo._minibatch_gradient(PackedBatch.pack(batch, adv).rows(torch.arange(40)), clip_range=0.2)

    flat, views = functional_params(agent)
    dist = distribution(agent, views, batch.obs)
    log_prob, entropy = dist.log_prob(batch.actions), dist.entropy()
    ratio = (log_prob - batch.log_probs).exp()
    policy = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    v = values(agent, views, batch.obs)
    v_loss = (v - batch.returns).square()
    if clip_vf is not None:
        v_clipped = batch.values + (v - batch.values).clamp(-clip_vf, clip_vf)
        v_loss = torch.max(v_loss, (v_clipped - batch.returns).square())
    per_sample = policy + 0.7 * v_loss - 0.01 * entropy
    (per_sample * batch.valid).sum().backward()
    torch.testing.assert_close(agent.params.grad, flat.grad, rtol=1e-4, atol=1e-5)
    assert float(stats[0]) == float(batch.valid.sum())
    assert float(stats[3]) == pytest.approx(float((policy * batch.valid).sum().detach()), rel=1e-5)


def test_advantages_are_normalised_over_valid_steps_only():
    agent = ActorCritic(4, spaces.Discrete(2), (8,), seed=0)
    algo = PPOAlgo(PPOConfig(n_envs=1, n_steps=10, batch_size=10), agent, seed=0)
    batch = make_batch(agent, 10, invalid_every=3)
    adv = algo.normalized_advantages(batch, LocalSync())
    mask = batch.valid > 0
    assert float(adv[mask].mean()) == pytest.approx(0.0, abs=1e-6)
    assert float(adv[mask].std(unbiased=False)) == pytest.approx(1.0, abs=1e-4)
    assert (adv[~mask] == 0).all()


def test_clipped_adam_equals_torch_adam_with_clip_grad_norm():
    torch.manual_seed(0)
    buf = ParamBuffer({"w": (50,)})
    buf.data.copy_(torch.randn(50))
    ours = ClippedAdam(buf, lr=1e-2, eps=1e-5, max_grad_norm=0.5)
    ref_param = torch.nn.Parameter(buf.data.clone())
    ref = torch.optim.Adam([ref_param], lr=1e-2, eps=1e-5)
    for step in range(5):
        grad = torch.randn(50) * (3.0 if step % 2 else 0.1)  # binds on odd steps only
        buf.grad.copy_(grad)
        ref_param.grad = grad.clone()
        torch.nn.utils.clip_grad_norm_([ref_param], 0.5)
        ours.step(1e-2)
        ref.step()
    torch.testing.assert_close(buf.data, ref_param.data, rtol=1e-6, atol=1e-7)


def test_target_kl_stops_the_update_early():
    cfg = PPOConfig(n_envs=1, n_steps=64, batch_size=16, n_epochs=10, learning_rate=0.05, target_kl=1e-4)
    agent = ActorCritic(4, spaces.Discrete(2), (16,), seed=0)
    algo = PPOAlgo(cfg, agent, seed=0)
    metrics = algo.update(make_batch(agent, 64), LocalSync())
    assert metrics["losses/stopped_early"] == 1.0
    assert metrics["losses/gradient_steps"] < 40


def small_rollout(T: int = 12, N: int = 3, seed: int = 0) -> Rollout:
    """A rollout of a 4-dimensional env with 2 actions: episode ends of both kinds, a reset step, fixed behaviour."""
    rng = np.random.default_rng(seed)
    terminated = np.zeros((T, N), bool)
    truncated = np.zeros((T, N), bool)
    terminated[4, 0] = truncated[7, 1] = True
    valid = np.ones((T, N), bool)
    valid[5, 0] = False  # the reset step after the episode's end
    return Rollout(
        obs=rng.normal(size=(T + 1, N, 4)).astype(np.float32),
        actions=rng.integers(0, 2, (T, N)),
        rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
        policy_version=0,
        log_probs=np.log(rng.uniform(0.2, 0.8, (T, N))).astype(np.float32),
    )


@pytest.mark.parametrize("normalize_advantage", [True, False])
def test_recompute_advantage_equals_preparing_the_rollout_again_before_each_epoch(normalize_advantage):
    cfg = PPOConfig(
        n_envs=3,
        n_steps=12,
        batch_size=12,
        n_epochs=3,
        learning_rate=0.01,
        clip_range_vf=0.2,
        normalize_advantage=normalize_advantage,
    )
    rollout = small_rollout()
    agent = ActorCritic(4, spaces.Discrete(2), (16,), seed=0)
    algo = PPOAlgo(dataclasses.replace(cfg, recompute_advantage=True), agent, seed=0)
    batch = algo.prepare(rollout)
    algo.update(batch, LocalSync())

    # The same three epochs as three one-epoch updates, each on a batch prepared afresh by the critic as it is then.
    by_epoch = ActorCritic(4, spaces.Discrete(2), (16,), seed=0)
    one_epoch = PPOAlgo(dataclasses.replace(cfg, n_epochs=1), by_epoch, seed=0)
    for _ in range(3):
        one_epoch.update(one_epoch.prepare(rollout), LocalSync())
    torch.testing.assert_close(agent.params.data, by_epoch.params.data, rtol=0, atol=1e-6)

    # ... which is not what three epochs on the first advantages give.
    fixed = ActorCritic(4, spaces.Discrete(2), (16,), seed=0)
    PPOAlgo(cfg, fixed, seed=0).update(PPOAlgo(cfg, fixed, seed=0).prepare(rollout), LocalSync())
    assert float((fixed.params.data - agent.params.data).abs().max()) > 1e-4


def test_recomputed_batch_holds_the_current_critics_values_and_their_gae():
    cfg = PPOConfig(n_envs=3, n_steps=12, batch_size=12, gamma=0.9, gae_lambda=0.8, recompute_advantage=True)
    rollout = small_rollout()
    agent = ActorCritic(4, spaces.Discrete(2), (16,), seed=0)
    algo = PPOAlgo(cfg, agent, seed=0)
    batch = algo.prepare(rollout)
    agent.params.data.add_(0.1)  # another critic
    fresh = algo.recomputed(batch)
    v = agent.values(torch.from_numpy(rollout.obs.reshape(-1, 4))).reshape(13, 3).numpy()
    assert not np.allclose(fresh.values.numpy(), batch.values.numpy())
    np.testing.assert_allclose(fresh.values.numpy(), v[:12].reshape(-1), rtol=0, atol=1e-6)
    # Worked by hand for env 0 around its termination at t=4 (no bootstrap) and the reset step t=5 (invalid):
    r, g, lam = rollout.rewards[:, 0], 0.9, 0.8
    adv = fresh.advantages.numpy().reshape(12, 3)[:, 0]
    assert adv[5] == 0.0
    assert adv[4] == pytest.approx(r[4] - v[4, 0], abs=1e-5)
    assert adv[3] == pytest.approx(r[3] + g * v[4, 0] - v[3, 0] + g * lam * adv[4], abs=1e-5)
    np.testing.assert_allclose(
        fresh.returns.numpy(), (fresh.advantages + fresh.values).numpy() * batch.valid.numpy(), atol=1e-6
    )


def test_recompute_advantage_is_refused_for_recurrent_policies_and_decoupled():
    with pytest.raises(ConfigError, match="recompute_advantage"):
        PPOConfig(n_envs=2, n_steps=8, batch_size=16, core="lstm", recompute_advantage=True)
    from distrl.config import StrategyConfig
    from distrl.strategies.decoupled import check_layout

    with pytest.raises(ConfigError, match="recompute_advantage=True is not available with --strategy decoupled"):
        check_layout(PPOConfig(recompute_advantage=True), StrategyConfig(strategy="decoupled", workers=2), 2)
