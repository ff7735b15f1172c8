"""The fused PPO loss (algos/fused.py) against its definition, ppo_loss: a float64 gradient check on random
inputs over every branch, equality with autograd on the plain loss, the subgradient at the clip boundary, and
training both ways to equal parameters."""

import math

import pytest
import torch

from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.fused import PPOLossFunction, fused_ppo_loss
from distrl.algos.ppo import ppo_loss
from distrl.config import PPOConfig


def minibatch(b: int, dtype: torch.dtype, seed: int, masked: bool = True) -> dict:
    """Random PPO inputs whose ratios fall on both sides of the clip range and inside it, on both signs of the
    advantage, with a quarter of the rows masked out."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda: torch.randn(b, generator=g, dtype=dtype)  # noqa: E731
    old_log_prob = rand() - 1.0
    valid = (torch.rand(b, generator=g) > 0.25).to(dtype) if masked else torch.ones(b, dtype=dtype)
    return dict(
        log_prob=old_log_prob + 0.4 * rand(),  # ratios exp(0.4 z): about 60% of rows outside [0.8, 1.2]
        entropy=rand().abs(),
        values=rand(),
        old_log_prob=old_log_prob,
        old_values=rand(),
        advantages=rand(),
        returns=rand(),
        valid=valid,
    )


def settings(clip_vf: bool, ent: bool) -> tuple:
    return (0.2, 0.3 if clip_vf else None, 0.5, 0.01 if ent else 0.0)


@pytest.mark.parametrize("clip_vf", [False, True], ids=["no-vf-clip", "vf-clip"])
@pytest.mark.parametrize("ent", [False, True], ids=["no-entropy", "entropy"])
def test_the_fused_derivative_passes_a_float64_gradient_check(clip_vf, ent):
    mb = minibatch(64, torch.float64, seed=1)
    ratio = (mb["log_prob"] - mb["old_log_prob"]).exp()
    # the check covers both sides of the clip range, on both signs of the advantage, and masked rows
    for side in (ratio > 1.2, ratio < 0.8, (ratio > 0.8) & (ratio < 1.2)):
        assert bool((side & (mb["advantages"] > 0)).any()) and bool((side & (mb["advantages"] < 0)).any())
    assert 0 < float(mb["valid"].sum()) < 64
    inputs = tuple(mb[k].clone().requires_grad_(True) for k in ("log_prob", "entropy", "values"))
    rest = tuple(mb[k] for k in ("old_log_prob", "old_values", "advantages", "returns", "valid"))
    assert torch.autograd.gradcheck(lambda *x: PPOLossFunction.apply(*x, *rest, *settings(clip_vf, ent)), inputs)


def plain_and_fused(mb: dict, clip_vf: bool, ent: bool):
    outputs = leaves(mb["log_prob"], mb["entropy"], mb["values"])
    rest = [mb[k] for k in ("old_log_prob", "old_values", "advantages", "returns", "valid")]
    plain = ppo_loss(*outputs, *rest, *settings(clip_vf, ent))
    fused = fused_ppo_loss(*[output.detach() for output in outputs], *rest, *settings(clip_vf, ent))
    return plain, output_grads(plain.loss, outputs), fused


@pytest.mark.parametrize("clip_vf", [False, True], ids=["no-vf-clip", "vf-clip"])
@pytest.mark.parametrize("ent", [False, True], ids=["no-entropy", "entropy"])
def test_the_fused_loss_equals_autograd_on_the_plain_loss_in_float32(clip_vf, ent):
    plain, grads, fused = plain_and_fused(minibatch(256, torch.float32, seed=2), clip_vf, ent)
    assert float(fused.loss) == pytest.approx(float(plain.loss.detach()), rel=1e-6)
    for mine, theirs in zip((fused.policy_loss, fused.value_loss, fused.ratio), plain[1:]):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=0)
    torch.testing.assert_close(fused.d_log_prob, grads[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(fused.d_values, grads[2], rtol=0, atol=1e-6)
    if ent:
        torch.testing.assert_close(fused.d_entropy, grads[1], rtol=0, atol=1e-6)
    else:  # the loss does not use the entropy: no gradient at all, as autograd says
        assert fused.d_entropy is None and grads[1] is None


def test_on_real_minibatches_the_fused_gradient_equals_autograds_to_1e_6():
    """Minibatches of a CartPole rollout after a few updates (ratios away from 1, some clipped), through the
    algorithm's own two paths."""
    from distrl.algos.protocols import LocalSync
    from distrl.config import RunConfig
    from distrl.data.packed import PackedBatch
    from distrl.training import OnPolicyTrainer

    cfg = PPOConfig(n_envs=8, n_steps=64, batch_size=128, n_epochs=4, clip_range_vf=0.2, ent_coef=0.01)
    trainer = OnPolicyTrainer(RunConfig(env="CartPole-v1", total_steps=8 * 64 * 3, seed=0, quiet=True), cfg)
    trainer.train()
    algo = trainer.algo
    batch = algo.prepare(trainer.collector.collect(trainer.policy_version, None, 0))
    algo.update(batch, LocalSync())  # one more update: the rollout's old log-probs now differ from the policy's
    packed = PackedBatch.pack(batch, algo.normalized_advantages(batch, LocalSync()))
    clipped, clip_range = 0, 0.02  # a narrow range: one update moves many ratios past it
    for start in range(0, packed.size, cfg.batch_size):
        mb = packed.rows(torch.arange(start, start + cfg.batch_size))
        fwd = trainer.agent.forward_train(mb.obs)
        terms = trainer.agent.dist_terms(fwd, mb.actions)
        outputs = (terms.log_prob, terms.entropy, fwd.values)
        fused, fused_grads = algo.loss_and_output_grads(outputs, mb, clip_range)
        plain, plain_grads = algo.autograd_loss_and_output_grads(outputs, mb, clip_range)
        assert fused.loss is None  # a training step leaves the scalar out; its parts are compared instead
        for part in ("policy_loss", "value_loss", "ratio"):
            torch.testing.assert_close(getattr(fused, part), getattr(plain, part).detach(), rtol=1e-6, atol=1e-6)
        for mine, theirs in zip(fused_grads, plain_grads):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
        clipped += int(((fused.ratio - 1.0).abs() > clip_range).sum())
    trainer.close()
    assert clipped > 0


def test_masked_rows_get_no_gradient():
    mb = minibatch(128, torch.float32, seed=3)
    _, _, fused = plain_and_fused(mb, clip_vf=True, ent=True)
    out = mb["valid"] == 0
    assert bool(out.any())
    for grad in (fused.d_log_prob, fused.d_entropy, fused.d_values):
        assert float(grad[out].abs().max()) == 0.0


def test_at_the_clip_boundary_the_subgradient_is_the_unclipped_sides():
    # r = 1 + e exactly (e = r - 1 is exact for r in [1, 2]): the two policy branches tie there, and both the
    # fused path and autograd give the unclipped side's derivative -A r, not the clipped side's 0 beyond the bound
    r = math.exp(0.125)
    e = r - 1.0
    assert 1.0 + e == r
    log_prob = torch.tensor([0.125, 0.125, -0.125], dtype=torch.float64)
    advantages = torch.tensor([1.5, -2.0, 0.5], dtype=torch.float64)
    old = torch.zeros(3, dtype=torch.float64)
    ones = torch.ones(3, dtype=torch.float64)
    outputs = leaves(log_prob, ones, ones)
    args = (old, old, advantages, ones, ones, e, None, 0.5, 0.0)
    plain = ppo_loss(*outputs, *args)
    (d_autograd, _, _) = output_grads(plain.loss, outputs)
    fused = fused_ppo_loss(log_prob, ones, ones, *args)
    assert float(fused.ratio[0]) == 1.0 + e  # exactly on the upper bound
    unclipped_side = -advantages * (log_prob - old).exp()
    torch.testing.assert_close(fused.d_log_prob[:2], unclipped_side[:2], rtol=0, atol=1e-15)
    torch.testing.assert_close(fused.d_log_prob, d_autograd, rtol=0, atol=1e-15)


def train(fused: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A few PPO iterations on CartPole with value clipping and an entropy bonus: (initial, final) parameters."""
    from distrl.config import RunConfig
    from distrl.training import OnPolicyTrainer

    cfg = PPOConfig(n_envs=4, n_steps=32, batch_size=64, n_epochs=3, clip_range_vf=0.2, ent_coef=0.01, fused_loss=fused)
    trainer = OnPolicyTrainer(RunConfig(env="CartPole-v1", total_steps=4 * 32 * 4, seed=3, quiet=True), cfg)
    initial = trainer.agent.params.param.detach().clone()
    trainer.train()
    final = trainer.agent.params.param.detach().clone()
    trainer.close()
    return initial, final


def test_training_with_the_fused_loss_equals_training_through_autograd():
    (initial, fused), (_, plain) = train(True), train(False)
    assert float((fused - initial).abs().max()) > 1e-3  # four updates moved the parameters
    torch.testing.assert_close(fused, plain, rtol=0, atol=1e-5)
