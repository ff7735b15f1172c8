"""IMPALA and APPO: IMPALA's loss by hand and against autograd, one whole IMPALA update against a plain torch
transcription, RMSProp against torch's, APPO's V-trace targets reducing to GAE on on-policy data, and the
configs' validation."""

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.algos.appo import APPOAlgo
from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.estimators import vtrace
from distrl.algos.impala import IMPALAAlgo, impala_loss
from distrl.algos.optim import ClippedRMSprop
from distrl.algos.ppo import PPOAlgo
from distrl.algos.protocols import LocalSync
from distrl.config import APPOConfig, ConfigError, IMPALAConfig, PPOConfig, RunConfig
from distrl.data.rollout import Rollout
from distrl.nets import ActorCritic, ParamBuffer
from distrl.training import OnPolicyTrainer
from reference import distribution, functional_params, values

ROOT = Path(__file__).resolve().parents[2]


def test_impala_loss_by_hand():
    # two samples, the second invalid: only the first counts, with vf_coef 0.5 and ent_coef 0.1
    log_prob = torch.log(torch.tensor([0.5, 0.25])).requires_grad_(True)
    entropy = torch.tensor([0.7, 0.3]).requires_grad_(True)
    values = torch.tensor([1.0, 0.0]).requires_grad_(True)
    advantages, vs, valid = torch.tensor([2.0, -1.0]), torch.tensor([0.0, 2.0]), torch.tensor([1.0, 0.0])
    out = impala_loss(log_prob, entropy, values, advantages, vs, valid, vf_coef=0.5, ent_coef=0.1)
    log2 = float(np.log(2.0))
    torch.testing.assert_close(out.policy_loss.detach(), torch.tensor([2 * log2, -2 * log2]))  # -A log pi
    torch.testing.assert_close(out.value_loss.detach(), torch.tensor([0.5, 2.0]))  # 0.5 (V - v_s)^2
    assert float(out.loss.detach()) == pytest.approx(2 * log2 + 0.5 * 0.5 - 0.1 * 0.7)
    d_log_prob, d_entropy, d_values = torch.autograd.grad(out.loss, [log_prob, entropy, values])
    assert d_log_prob.tolist() == pytest.approx([-2.0, 0.0])  # -A, invalid sample 0
    assert d_entropy.tolist() == pytest.approx([-0.1, 0.0])
    assert d_values.tolist() == pytest.approx([0.5, 0.0])  # vf_coef (V - v_s)


def test_impala_loss_without_entropy_bonus_leaves_the_entropy_out():
    entropy = torch.ones(3).requires_grad_(True)
    out = impala_loss(
        torch.zeros(3, requires_grad=True), entropy, torch.zeros(3), torch.ones(3), torch.zeros(3), torch.ones(3), 1, 0
    )
    assert output_grads(out.loss, [entropy]) == (None,)


@pytest.mark.parametrize("ent_coef", [0.0, 0.03])
def test_impala_loss_gradient_through_a_categorical_equals_autograd_written_from_the_logits(ent_coef):
    g = torch.Generator().manual_seed(0)
    B, A = 10, 4
    logits = torch.randn(B, A, generator=g).requires_grad_(True)
    v = torch.randn(B, generator=g).requires_grad_(True)
    actions = torch.randint(0, A, (B,), generator=g)
    advantages, vs = torch.randn(B, generator=g), torch.randn(B, generator=g)
    valid = (torch.rand(B, generator=g) > 0.3).float()

    # the library's way: the loss on leaf outputs, its output gradients taken onwards to the logits
    dist = torch.distributions.Categorical(logits=logits)
    outputs = leaves(dist.log_prob(actions), dist.entropy(), v)
    loss = impala_loss(*outputs, advantages, vs, valid, vf_coef=0.7, ent_coef=ent_coef)
    d_log_prob, d_entropy, d_values = output_grads(loss.loss, outputs)
    onward = [(dist.log_prob(actions), d_log_prob)] + ([(dist.entropy(), d_entropy)] if ent_coef else [])
    (d_logits,) = torch.autograd.grad([o for o, _ in onward], [logits], [d for _, d in onward])

    # an independent transcription of the paper's loss, from the logits directly
    log_softmax = torch.log_softmax(logits, -1)
    log_pi = log_softmax.gather(1, actions[:, None]).squeeze(1)
    entropy = -(log_softmax.exp() * log_softmax).sum(-1)
    per_sample = -advantages * log_pi + 0.7 * 0.5 * (v - vs) ** 2 - ent_coef * entropy
    ref_logits, ref_values = torch.autograd.grad((per_sample * valid).sum(), [logits, v])
    assert float(loss.loss.detach()) == pytest.approx(float((per_sample * valid).sum().detach()), rel=1e-6)
    torch.testing.assert_close(d_logits, ref_logits, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d_values, ref_values, rtol=1e-5, atol=1e-6)


def small_rollout(T: int = 12, N: int = 3, seed: int = 0, discrete: bool = True) -> Rollout:
    """A [T, N] rollout of a 4-dimensional env: a termination, a truncation, their reset steps, and behaviour
    log-probs of some other policy."""
    rng = np.random.default_rng(seed)
    terminated, truncated = np.zeros((T, N), bool), np.zeros((T, N), bool)
    terminated[4, 0] = truncated[7, 1] = True
    valid = np.ones((T, N), bool)
    valid[5, 0] = valid[8, 1] = False
    actions = rng.integers(0, 2, (T, N)) if discrete else rng.uniform(-1, 1, (T, N, 2)).astype(np.float32)
    return Rollout(
        obs=rng.normal(size=(T + 1, N, 4)).astype(np.float32),
        actions=actions,
        rewards=rng.normal(size=(T, N)).astype(np.float32),
        terminated=terminated,
        truncated=truncated,
        valid=valid,
        policy_version=0,
        log_probs=rng.normal(-1.0, 0.5, (T, N)).astype(np.float32),
    )


@pytest.mark.parametrize("optimizer", ["rmsprop", "adam"])
@pytest.mark.parametrize("discrete", [True, False], ids=["categorical", "gaussian"])
def test_one_impala_update_equals_a_plain_torch_transcription(optimizer, discrete):
    # One batch of 36 samples = one gradient step: V-trace on the current network, the paper's loss as a mean
    # over valid samples, the global norm clipped (it binds), then torch's own optimizer.
    T, N = 12, 3
    cfg = IMPALAConfig(
        n_envs=N,
        n_steps=T,
        batch_size=T * N,
        learning_rate=0.01,
        gamma=0.9,
        gae_lambda=0.95,
        vtrace_rho_bar=1.2,
        vtrace_c_bar=0.9,
        vf_coef=0.5,
        ent_coef=0.01,
        max_grad_norm=0.1,
        optimizer=optimizer,
        rmsprop_alpha=0.9,
        rmsprop_eps=0.05,
    )
    space = spaces.Discrete(2) if discrete else spaces.Box(-1, 1, (2,), np.float32)
    rollout = small_rollout(T, N, discrete=discrete)
    agent = ActorCritic(4, space, (16, 16), seed=0)
    flat, views = functional_params(agent)
    before = agent.params.data.clone()
    algo = IMPALAAlgo(cfg, agent, seed=0)
    assert isinstance(algo.optimizer, ClippedRMSprop) == (optimizer == "rmsprop")
    metrics = algo.update(algo.prepare(rollout), LocalSync())

    obs = torch.from_numpy(rollout.obs)
    actions = torch.from_numpy(rollout.actions.reshape(T * N, *rollout.actions.shape[2:]))
    dist = distribution(agent, views, obs[:T].reshape(T * N, 4))
    log_pi, entropy = dist.log_prob(actions), dist.entropy()
    v = values(agent, views, obs.reshape(-1, 4)).reshape(T + 1, N)
    log_rhos = log_pi.detach().reshape(T, N).numpy() - rollout.log_probs
    vs, pg_adv = vtrace(
        log_rhos,
        rollout.rewards,
        v.detach().numpy(),
        rollout.terminated,
        rollout.truncated,
        rollout.valid,
        0.9,
        0.95,
        1.2,
        0.9,
    )
    assert np.abs(log_rhos).max() > 0.5  # off-policy: the truncations matter
    valid = torch.from_numpy(rollout.valid.reshape(-1).astype(np.float32))
    policy_loss = -torch.from_numpy(pg_adv.reshape(-1)) * log_pi
    value_loss = 0.5 * (v[:T].reshape(-1) - torch.from_numpy(vs.reshape(-1))) ** 2
    loss = ((policy_loss + 0.5 * value_loss - 0.01 * entropy) * valid).sum() / valid.sum()
    loss.backward()
    norm = float(torch.nn.utils.clip_grad_norm_([flat], 0.1))
    assert norm > 2 * 0.1  # the clip binds
    if optimizer == "rmsprop":
        torch.optim.RMSprop([flat], lr=0.01, alpha=0.9, eps=0.05).step()
    else:
        torch.optim.Adam([flat], lr=0.01, eps=1e-5).step()

    assert float((agent.params.data - before).abs().max()) > 1e-3
    torch.testing.assert_close(agent.params.data, flat.detach(), rtol=0, atol=1e-6)
    assert metrics["losses/grad_norm"] == pytest.approx(norm, rel=1e-4)
    assert metrics["losses/gradient_steps"] == 1.0
    assert metrics["losses/policy_loss"] == pytest.approx(
        float((policy_loss * valid).sum().detach() / valid.sum()), rel=1e-5
    )
    assert metrics["losses/value_loss"] == pytest.approx(
        float((value_loss * valid).sum().detach() / valid.sum()), rel=1e-5
    )


def cartpole_rollout(cfg):
    """A rollout of CartPole collected by the learner's own weights (log-probs and values left to the learner)."""
    trainer = OnPolicyTrainer(RunConfig(env="CartPole-v1", algo="appo", seed=1, vec="sync", quiet=True), cfg)
    assert isinstance(trainer.algo, APPOAlgo)
    rollout = trainer.collector.collect(0)
    trainer.close()
    assert rollout.log_probs is None and rollout.values is None
    # episode ends, each followed at once by the next episode (no reset steps)
    assert rollout.terminated.sum() >= 3 and rollout.valid.all() and rollout.final_values is not None
    return trainer, rollout


@pytest.mark.parametrize("lam", [1.0, 0.8])
def test_appo_on_data_of_its_own_policy_trains_toward_gae_targets(lam):
    # With pi = mu, V-trace's v_s is GAE(lambda)'s return (the paper's remark 1). Its policy-gradient advantage
    # r_s + gamma v_{s+1} - V(x_s) is GAE(lambda)'s only at lambda = 1 (APPO's default, as Sample Factory's):
    # otherwise it is one TD error plus the discounted GAE(lambda) advantage of the next step.
    cfg = APPOConfig(n_envs=4, n_steps=64, batch_size=256, gamma=0.9, gae_lambda=lam)
    trainer, rollout = cartpole_rollout(cfg)
    appo = trainer.algo.prepare(rollout)
    ppo = PPOAlgo(PPOConfig(n_envs=4, n_steps=64, batch_size=256, gamma=0.9, gae_lambda=lam), trainer.agent, 0)
    gae = ppo.prepare(rollout)
    assert float(gae.advantages.abs().max()) > 0.1
    for name in ("log_probs", "values", "returns", "valid"):
        torch.testing.assert_close(getattr(appo, name), getattr(gae, name), rtol=1e-5, atol=1e-5, msg=name)
    if lam == 1.0:
        torch.testing.assert_close(appo.advantages, gae.advantages, rtol=1e-5, atol=1e-5)
        return
    T, N = rollout.rewards.shape
    v = ppo.critic_values(torch.from_numpy(rollout.obs))
    delta = rollout.rewards + 0.9 * ~rollout.terminated * v[1:] - v[:T]
    # nothing flows back past an episode's end (the next row begins the next episode), nor past the fragment
    ended = rollout.terminated | rollout.truncated
    gae_next = np.concatenate([gae.advantages.numpy().reshape(T, N)[1:], np.zeros((1, N))]) * ~ended
    expected = delta + 0.9 * gae_next
    np.testing.assert_allclose(appo.advantages.numpy().reshape(T, N), expected, rtol=1e-5, atol=1e-5)
    assert float((appo.advantages - gae.advantages).abs().max()) > 0.1


def test_appo_on_lagged_data_corrects_with_the_behaviour_log_probs():
    cfg = APPOConfig(n_envs=4, n_steps=64, batch_size=256, gamma=0.9, gae_lambda=0.8)
    trainer, rollout = cartpole_rollout(cfg)
    agent = trainer.agent
    T, N = rollout.rewards.shape
    obs = torch.from_numpy(rollout.obs)
    flat_obs = obs[:T].reshape(T * N, -1)
    actions = torch.from_numpy(rollout.actions.reshape(-1))
    behaviour = agent.log_prob(flat_obs, actions).reshape(T, N).numpy()
    lagged = dataclasses.replace(rollout, log_probs=behaviour)  # as an actor records them
    agent.params.data.add_(0.3 * torch.randn(agent.params.data.shape, generator=torch.Generator().manual_seed(0)))
    agent.refresh_acting_copy()  # the learner moved on since the data was drawn

    appo = trainer.algo.prepare(lagged)
    assert torch.equal(appo.log_probs, torch.from_numpy(behaviour.reshape(-1)))  # the surrogate's ratio is pi / mu
    gae = PPOAlgo(PPOConfig(n_envs=4, n_steps=64, batch_size=256, gamma=0.9, gae_lambda=0.8), agent, 0).prepare(lagged)
    torch.testing.assert_close(appo.values, gae.values)  # the same (moved) critic ...
    assert float((appo.advantages - gae.advantages).abs().max()) > 0.05  # ... but importance-weighted targets
    values = agent.values(obs.reshape(-1, 4)).reshape(T + 1, N).numpy()
    log_rhos = agent.log_prob(flat_obs, actions).reshape(T, N).numpy() - behaviour
    expected = vtrace(
        log_rhos, rollout.rewards, values, rollout.terminated, rollout.truncated, rollout.valid, 0.9, 0.8, 1.0, 1.0
    )
    np.testing.assert_allclose(appo.advantages.numpy(), expected.pg_advantages.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(appo.returns.numpy(), expected.vs.reshape(-1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "field,value",
    [
        ("target_kl", 0.01),
        ("clip_range_vf", 0.2),
        ("vtrace_rho_bar", 0.0),
        ("vtrace_c_bar", -1.0),
        ("rmsprop_alpha", 1.0),
        ("rmsprop_eps", 0.0),
    ],
)
def test_impala_config_refuses_fields_it_cannot_use(field, value):
    with pytest.raises(ConfigError, match=f"^{field}={value!r} is not allowed: must be "):
        IMPALAConfig(**{field: value})


def test_appo_config_refuses_bad_truncation_levels():
    with pytest.raises(ConfigError, match="^vtrace_rho_bar=-1.0 is not allowed"):
        APPOConfig(vtrace_rho_bar=-1.0)
    with pytest.raises(ConfigError, match="^vtrace_c_bar=-0.5 is not allowed"):
        APPOConfig(vtrace_c_bar=-0.5)
    with pytest.raises(ConfigError, match="^recompute_advantage=True is not allowed"):
        APPOConfig(n_envs=2, n_steps=8, batch_size=16, core="lstm", recompute_advantage=True)
    APPOConfig(vtrace_rho_bar=float("inf"), vtrace_c_bar=0.0)  # no truncation; traces cut at once


def test_cli_names_a_bad_vtrace_field_in_one_line_and_exits_2():
    result = subprocess.run(
        [sys.executable, "-m", "distrl", "train", "impala", "CartPole-v1", "--vtrace-c-bar", "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(["src", "tests"])},
    )
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "vtrace_c_bar=-1.0 is not allowed" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def rmsprop_steps(max_grad_norm, scales):
    """ClippedRMSprop and torch's RMSprop (after clip_grad_norm_ when clipping) on the same gradients."""
    torch.manual_seed(0)
    buf = ParamBuffer({"w": (40,), "b": (10,)})
    buf.data.copy_(torch.randn(50))
    ours = ClippedRMSprop(buf, lr=1e-2, alpha=0.9, eps=0.01, max_grad_norm=max_grad_norm)
    ref_param = torch.nn.Parameter(buf.data.clone())
    ref = torch.optim.RMSprop([ref_param], lr=1e-2, alpha=0.9, eps=0.01, momentum=0.0)
    norms = []
    for scale in scales:
        grad = torch.randn(50) * scale
        buf.grad.copy_(grad)
        ref_param.grad = grad.clone()
        if max_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_([ref_param], max_grad_norm)
        norms.append(ours.step())
        ref.step()
    return ours, ref_param, ref.state[ref_param]["square_avg"], norms


def test_clipped_rmsprop_equals_torch_rmsprop():
    ours, ref_param, square_avg, _ = rmsprop_steps(None, [0.1, 3.0, 1.0, 0.5, 2.0, 0.01])
    torch.testing.assert_close(ours.params.data, ref_param.data, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours.exp_avg_sq, square_avg, rtol=1e-6, atol=1e-9)
    assert ours.steps == 6 and not ours.exp_avg.any()


def test_clipped_rmsprop_clips_as_clip_grad_norm_then_rmsprop():
    scales = [0.1, 3.0, 0.1, 3.0, 0.1]  # the clip binds on the large steps only
    ours, ref_param, square_avg, norms = rmsprop_steps(2.0, scales)
    assert [n > 2.0 for n in norms] == [False, True, False, True, False]
    torch.testing.assert_close(ours.params.data, ref_param.data, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(ours.exp_avg_sq, square_avg, rtol=1e-6, atol=1e-9)  # of the clipped gradients
    unclipped, _, _, _ = rmsprop_steps(None, scales)
    assert float((unclipped.params.data - ours.params.data).abs().max()) > 1e-3  # so the clip did something
