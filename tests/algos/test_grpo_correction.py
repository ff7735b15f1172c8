"""GRPO's off-policy corrections (truncated IS, sequence masking), their statistics and DAPO's overlong handling,
against values worked out by hand and against the plain loss written out here."""

import math

import numpy as np
import pytest
import torch
from torch import nn

from distrl.algos.grpo import STATS, GRPOAlgo, overlong_penalty, token_loss
from distrl.algos.importance import (
    MISMATCH_STATS,
    mismatch_metrics,
    mismatch_sums,
    outside_band,
    sequence_log_ratio,
)
from distrl.algos.protocols import LocalSync
from distrl.config import GRPOConfig
from distrl.data.groups import GroupSamples
from distrl.nets.core import bind_module


class PositionPolicy:
    """A group policy with completions of several tokens: one linear head per position maps the state to logits."""

    def __init__(self, obs_dim: int, n_actions: int, max_new_tokens: int, seed: int):
        generator = torch.Generator().manual_seed(seed)
        self.module = nn.Linear(obs_dim, max_new_tokens * n_actions)
        with torch.no_grad():
            self.module.weight.normal_(0.0, 0.5, generator=generator)
            self.module.bias.normal_(0.0, 0.5, generator=generator)
        self.device = torch.device("cpu")
        self.params = bind_module(self.module)
        self.max_new_tokens, self.n_actions = max_new_tokens, n_actions

    def token_log_probs(self, prompt, prompt_mask, tokens, attention):
        n, width = tokens.shape
        logits = self.module(prompt).view(n, self.max_new_tokens, self.n_actions)[:, :width]
        return torch.log_softmax(logits, -1).gather(2, tokens.unsqueeze(-1)).squeeze(-1)


class Recorder(LocalSync):
    """One worker's ``Sync`` that keeps what it would all-reduce (the gradient before the division, the sums)."""

    def gradients(self, grad, stats):
        self.grad, self.stats = grad.clone(), stats.clone()


def make_batch(policy, lengths, offsets, rewards, group_size=2, seed=0):
    """Completions of ``lengths`` model tokens whose behaviour log-probs are the policy's less ``offsets``
    (so ``log(pi / mu) = offsets`` on every model token)."""
    n, width = len(lengths), max(lengths)
    rng = np.random.default_rng(seed)
    prompt = rng.normal(size=(n, 3)).astype(np.float32)
    mask = np.arange(width)[None, :] < np.asarray(lengths)[:, None]
    tokens = np.where(mask, rng.integers(0, policy.n_actions, size=(n, width)), 0)
    with torch.no_grad():
        lp = policy.token_log_probs(torch.from_numpy(prompt), None, torch.from_numpy(tokens), None).numpy()
    log_probs = np.where(mask, lp - np.broadcast_to(offsets, (n, width)), 0.0).astype(np.float32)
    rewards = np.asarray(rewards, dtype=np.float32)
    return GroupSamples(
        positions=np.arange(n // group_size),
        group_size=group_size,
        prompt=prompt,
        prompt_mask=None,
        tokens=tokens,
        mask=mask,
        log_probs=log_probs,
        version=np.zeros(n, dtype=np.int64),
        rewards=rewards[:, None],
        reward=rewards,
    )


def plain_loss(policy, batch, adv, cfg, keep, tis_cap=0.0):
    """GRPO's loss written out: PPO's clipped surrogate per token (or, with ``tis_cap``, the truncated-IS
    policy gradient ``-min(rho, cap) A log pi``), over the completions in ``keep`` only."""
    lp = policy.token_log_probs(torch.from_numpy(batch.prompt), None, torch.from_numpy(batch.tokens), None)
    behaviour, a = torch.from_numpy(batch.log_probs), adv[:, None]
    if tis_cap > 0:
        per_token = -torch.exp(lp.detach() - behaviour).clamp(max=tis_cap) * a * lp
    else:
        r = torch.exp(lp - behaviour)
        per_token = -torch.min(r * a, r.clamp(1 - cfg.clip_range, 1 + cfg.clip_high) * a)
    mask = torch.from_numpy(batch.mask).float()
    kept = mask * torch.tensor(keep, dtype=torch.float32)[:, None]
    if cfg.loss_type == "grpo":  # each completion's token mean, averaged over every completion
        return ((per_token * kept).sum(1) / mask.sum(1)).sum() / len(keep)
    return (per_token * kept).sum() / kept.sum()  # dapo: the mean over the tokens that carry loss


def flat_grad(loss, policy):
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(policy.module.parameters()))])


# ---------------------------------------------------------------- truncated importance sampling


def test_truncated_importance_sampling_loss_and_gradient_by_hand():
    new = torch.tensor([[-1.0, -0.5, -2.0], [-0.3, -1.2, -0.7]], requires_grad=True)
    behaviour = torch.tensor([[-1.0, -1.5, -1.9], [-0.3, -0.2, -0.7]])
    adv = torch.tensor([[1.0], [-2.0]])
    # rho = exp(new - behaviour): [[1, e = 2.718, e^-0.1 = 0.9048], [1, e^-1 = 0.3679, 1]]
    # w = min(rho, 2): [[1, 2, 0.9048], [1, 0.3679, 1]]; r = 1, so the loss is -w A and its derivative -w A
    out = token_loss(new, behaviour, adv, clip_low=0.2, clip_high=0.2, tis_cap=2.0)
    (d,) = torch.autograd.grad(out.loss.sum(), [new])
    expected = [[-1.0, -2.0, -0.904837], [2.0, 0.735759, 2.0]]
    assert out.loss.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]
    assert d.tolist() == [pytest.approx(row, abs=1e-6) for row in expected]
    assert not out.clipped.any()  # the ratio to the proximal policy is 1: the clip never binds in one step
    # without the cap both tokens with rho far from 1 are clipped and learn nothing: the correction differs
    (d_plain,) = torch.autograd.grad(token_loss(new, behaviour, adv, 0.2, 0.2).loss.sum(), [new])
    assert d_plain[0, 1] == 0 and d_plain[1, 1] == 0
    # the KL to the reference is not weighted: loss = w * policy_loss + beta * k3
    ref = torch.tensor([[-1.2, -0.5, -2.0], [-0.3, -1.2, -0.7]])
    with_kl = token_loss(new, behaviour, adv, 0.2, 0.2, ref, beta=0.1, tis_cap=2.0)
    k3 = math.exp(-0.2) + 0.2 - 1
    assert float(with_kl.loss[0, 0].detach()) == pytest.approx(-1.0 + 0.1 * k3, abs=1e-6)


def test_without_a_cap_the_loss_is_todays_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    new = (-torch.rand(4, 5, generator=g) * 3).requires_grad_(True)
    behaviour = new.detach() + 0.5 * torch.randn(4, 5, generator=g)
    adv = torch.randn(4, 1, generator=g)
    ratio = torch.exp(new - behaviour)  # today's formula, copied
    today = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.28))
    out = token_loss(new, behaviour, adv, 0.2, 0.28, tis_cap=0.0)
    assert torch.equal(out.loss, today)
    (d_out,) = torch.autograd.grad(out.loss.sum(), [new])
    (d_today,) = torch.autograd.grad(today.sum(), [new])
    assert torch.equal(d_out, d_today)


def test_tis_with_behaviour_equal_to_the_learner_is_the_plain_gradient():
    g = torch.Generator().manual_seed(1)
    new = (-torch.rand(3, 4, generator=g) * 2).requires_grad_(True)
    adv = torch.randn(3, 1, generator=g)
    plain = token_loss(new, new.detach(), adv, 0.2, 0.2)
    tis = token_loss(new, new.detach(), adv, 0.2, 0.2, tis_cap=2.0)
    assert torch.allclose(tis.loss, plain.loss)
    (d_plain,) = torch.autograd.grad(plain.loss.sum(), [new])
    (d_tis,) = torch.autograd.grad(tis.loss.sum(), [new])
    assert torch.allclose(d_tis, d_plain) and d_plain.abs().min() > 0


def test_the_learner_step_with_tis_follows_the_truncated_policy_gradient():
    policy = PositionPolicy(3, 5, max_new_tokens=4, seed=0)
    offsets = np.array([[0.1, 1.5, -0.2, 0.0], [0.0, 0.0, 0.0, 0.0], [-1.0, 0.3, 0.0, 0.0], [2.0, 0.0, 0.0, 0.0]])
    batch = make_batch(policy, [3, 2, 4, 1], offsets, [1.0, 0.0, 0.5, 0.0])
    cfg = GRPOConfig(loss_type="dapo", tis_cap=2.0, max_new_tokens=4, microbatch_size=3, learning_rate=1e-3)
    algo = GRPOAlgo(cfg, policy)
    adv = algo.advantages(batch, LocalSync())
    expected = flat_grad(plain_loss(policy, batch, adv, cfg, [True] * 4, tis_cap=2.0), policy)
    metrics = algo.update(batch, LocalSync())
    assert torch.allclose(policy.params.grad, expected, atol=1e-6)
    # rho above 2 on two of the 10 model tokens: e^1.5 (row 0) and e^2 (row 3)
    assert metrics["offpolicy/tis_clipped_fraction"] == pytest.approx(2 / 10)
    assert metrics["losses/clip_fraction"] == 0.0


def test_tis_on_an_on_policy_batch_takes_the_plain_step():
    policies = [PositionPolicy(3, 5, max_new_tokens=3, seed=2) for _ in range(2)]
    grads = []
    for policy, cap in zip(policies, (0.0, 2.0)):
        batch = make_batch(policy, [3, 1, 2, 3], 0.0, [1.0, 0.0, 0.0, 2.0])
        GRPOAlgo(GRPOConfig(max_new_tokens=3, loss_type="grpo", tis_cap=cap), policy).update(batch, LocalSync())
        grads.append(policy.params.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6) and grads[0].abs().sum() > 0


# ---------------------------------------------------------------- sequence-level masking


def test_sequence_and_geometric_ratios_and_the_band_by_hand():
    # log-ratios per token; the last column of row 1 is padding and must not count
    log_ratio = torch.tensor([[0.1, 0.1, 0.1], [0.5, 9.0, 9.0], [-0.3, -0.3, -0.3], [0.0, 0.0, 9.0]])
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    seq = sequence_log_ratio(log_ratio, mask, "sequence")
    geo = sequence_log_ratio(log_ratio, mask, "geometric")
    assert seq.tolist() == pytest.approx([0.3, 0.5, -0.9, 0.0])  # rho: 1.35, 1.65, 0.41, 1
    assert geo.tolist() == pytest.approx([0.1, 0.5, -0.3, 0.0])  # rho: 1.105, 1.65, 0.74, 1
    assert outside_band(seq, 0.5, 1.5).tolist() == [False, True, True, False]
    assert outside_band(geo, 0.5, 1.5).tolist() == [False, True, False, False]
    assert outside_band(seq, 0.0, 1.2).tolist() == [True, True, False, False]  # no lower bound
    assert outside_band(seq, 0.9, 0.0).tolist() == [False, False, True, False]  # no upper bound
    assert not outside_band(seq, 0.0, 0.0).any()
    assert not outside_band(torch.tensor([math.log(1.5)]), 0.5, 1.5).any()  # the band is closed
    assert outside_band(torch.tensor([1e4]), 0.5, 1.5).all()  # a product that overflows a float still compares


@pytest.mark.parametrize(
    "level, keep", [("sequence", [True, False, False, True]), ("geometric", [True, False, True, True])]
)
def test_masking_zeroes_exactly_the_out_of_band_completions(level, keep):
    policy = PositionPolicy(3, 5, max_new_tokens=4, seed=0)
    offsets = np.array([[0.1] * 3, [0.5] * 3, [-0.3] * 3, [0.0] * 3])  # the ratios of the test above
    batch = make_batch(policy, [3, 1, 3, 2], offsets, [1.0, 0.0, 1.0, 0.0])  # every completion has a gradient
    cfg = GRPOConfig(
        loss_type="grpo", max_new_tokens=4, is_mask_low=0.5, is_mask_high=1.5, is_mask_level=level, microbatch_size=3
    )
    algo = GRPOAlgo(cfg, policy)
    adv = algo.advantages(batch, LocalSync())
    expected = flat_grad(plain_loss(policy, batch, adv, cfg, keep), policy)
    unmasked = flat_grad(plain_loss(policy, batch, adv, cfg, [True] * 4), policy)
    metrics = algo.update(batch, LocalSync())
    assert torch.allclose(policy.params.grad, expected, atol=1e-6)
    assert not torch.allclose(expected, unmasked, atol=1e-3)
    assert metrics["offpolicy/masked_fraction"] == 1 - sum(keep) / 4


# ---------------------------------------------------------------- statistics


def test_mismatch_statistics_by_hand():
    # rho = 2, 1/2 (row 0), 4 (row 1); the padding's 7 must not count
    log_ratio = torch.tensor([[math.log(2), math.log(0.5)], [math.log(4), 7.0]])
    mask = torch.tensor([[1, 1], [1, 0]], dtype=torch.bool)
    sums = mismatch_sums(log_ratio, mask, tis_cap=3.0, masked=torch.tensor([False, True]))
    assert set(sums) == set(MISMATCH_STATS)
    m = mismatch_metrics(sums, tokens=3, completions=2, tis_cap=3.0)
    assert m["offpolicy/ratio_mean"] == pytest.approx(6.5 / 3)
    assert m["offpolicy/ratio_std"] == pytest.approx(math.sqrt(74) / 6)  # E[rho^2] = 20.25 / 3, minus (13/6)^2
    # k3: sum of rho - 1 - log rho = 6.5 - 3 - (log 2 + log 1/2 + log 4) = 3.5 - log 4
    assert m["offpolicy/kl_k3"] == pytest.approx((3.5 - math.log(4)) / 3)
    # geometric-mean weights: row 0 sqrt(2 * 1/2) = 1, row 1 4: ESS = 5^2 / (2 * (1 + 16))
    assert m["offpolicy/ess"] == pytest.approx(25 / 34)
    assert m["offpolicy/tis_clipped_fraction"] == pytest.approx(1 / 3)  # only 4 > 3
    assert m["offpolicy/masked_fraction"] == 0.5
    assert "offpolicy/tis_clipped_fraction" not in mismatch_metrics(sums, 3, 2, tis_cap=0.0)
    # the sums add over microbatches and workers: two halves give the whole's metrics
    halves = [mismatch_sums(log_ratio[i : i + 1], mask[i : i + 1], 3.0, torch.tensor([i == 1])) for i in (0, 1)]
    added = {k: halves[0][k] + halves[1][k] for k in MISMATCH_STATS}
    assert mismatch_metrics(added, 3, 2, 3.0) == pytest.approx(m)


def test_every_update_logs_the_mismatch():
    policy = PositionPolicy(3, 5, max_new_tokens=4, seed=0)
    offsets = np.array([[0.1] * 3, [0.5] * 3, [-0.3] * 3, [0.0] * 3])
    batch = make_batch(policy, [3, 1, 3, 2], offsets, [1.0, 0.0, 1.0, 0.0])
    metrics = GRPOAlgo(GRPOConfig(max_new_tokens=4), policy).update(batch, LocalSync())  # every correction off
    rho = [math.exp(0.1)] * 3 + [math.exp(0.5)] + [math.exp(-0.3)] * 3 + [1.0] * 2
    assert metrics["offpolicy/ratio_mean"] == pytest.approx(sum(rho) / 9, rel=1e-5)
    assert metrics["offpolicy/kl_k3"] == pytest.approx(sum(r - 1 - math.log(r) for r in rho) / 9, rel=1e-4)
    w = [math.exp(0.1), math.exp(0.5), math.exp(-0.3), 1.0]
    assert metrics["offpolicy/ess"] == pytest.approx(sum(w) ** 2 / (4 * sum(x * x for x in w)), rel=1e-5)
    assert metrics["offpolicy/masked_fraction"] == 0.0 and "offpolicy/tis_clipped_fraction" not in metrics


# ---------------------------------------------------------------- DAPO's overlong handling


def test_soft_overlong_penalty_by_hand():
    lengths = np.array([3, 6, 7, 8, 10])
    # L_max = 10, L_cache = 4: no penalty up to 6 tokens, then (length - 6) / 4
    assert overlong_penalty(lengths, 10, 4, 1.0).tolist() == pytest.approx([0, 0, 0.25, 0.5, 1.0])
    assert overlong_penalty(lengths, 10, 4, 0.5).tolist() == pytest.approx([0, 0, 0.125, 0.25, 0.5])
    assert overlong_penalty(lengths, 10, 0, 1.0).tolist() == [0.0] * 5


def test_the_penalty_is_taken_from_the_reward_before_the_advantages():
    policy = PositionPolicy(3, 5, max_new_tokens=10, seed=0)
    batch = make_batch(policy, [6, 8, 10, 3], 0.0, [1.0, 1.0, 0.0, 0.0])  # two groups, each flat in the task's reward
    cfg = GRPOConfig(max_new_tokens=10, overlong_buffer=4, scale_rewards="none")
    algo = GRPOAlgo(cfg, policy)
    # penalties 0, 0.5, 1, 0: rewards 1, 0.5, -1, 0, centred per group
    assert algo.advantages(batch, LocalSync()).tolist() == pytest.approx([0.25, -0.25, -0.5, 0.5])
    metrics = algo.update(batch, LocalSync())
    assert metrics["rewards/overlong_penalty"] == pytest.approx(1.5 / 4)
    assert metrics["rewards/overlong_penalised_fraction"] == 0.5
    assert metrics["rewards/mean"] == 0.5  # the task's reward, the penalty apart
    assert metrics["rewards/flat_group_fraction"] == 0.0  # flat before the penalty, not after
    assert metrics["completions/truncated_fraction"] == 0.25
    off = GRPOAlgo(GRPOConfig(max_new_tokens=10, scale_rewards="none"), policy)
    assert off.advantages(batch, LocalSync()).tolist() == [0.0] * 4


def test_the_overlong_filter_drops_completions_that_reach_max_new_tokens():
    policy = PositionPolicy(3, 5, max_new_tokens=4, seed=3)
    offsets = np.array([[0.05, -0.1, 0.0, 0.1]])
    batch = make_batch(policy, [4, 2, 4, 3], offsets, [1.0, 0.0, 0.0, 1.0])  # rows 0 and 2 are cut
    cfg = GRPOConfig(loss_type="dapo", max_new_tokens=4, overlong_filter=True)
    algo = GRPOAlgo(cfg, policy)
    adv = algo.advantages(batch, LocalSync())
    loss = plain_loss(policy, batch, adv, cfg, [False, True, False, True])  # divided by the 5 tokens kept
    expected = flat_grad(loss, policy)
    metrics = algo.update(batch, LocalSync())
    assert torch.allclose(policy.params.grad, expected, atol=1e-6)
    assert metrics["losses/loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert metrics["completions/truncated_fraction"] == 0.5
    assert metrics["completions/tokens"] == 13  # every model token is still counted as drawn


# ---------------------------------------------------------------- everything off, and the split over workers


def test_with_every_option_off_the_update_is_the_plain_loss():
    policy = PositionPolicy(3, 5, max_new_tokens=4, seed=4)
    offsets = np.array([[0.3, -0.4, 0.2, 0.0]])
    batch = make_batch(policy, [4, 2, 3, 4], offsets, [1.0, 0.0, 0.0, 2.0])
    cfg = GRPOConfig(loss_type="grpo", max_new_tokens=4, clip_range_high=0.28, microbatch_size=2)
    algo = GRPOAlgo(cfg, policy)
    loss = plain_loss(policy, batch, algo.advantages(batch, LocalSync()), cfg, [True] * 4)
    expected = flat_grad(loss, policy)
    metrics = algo.update(batch, LocalSync())
    assert torch.allclose(policy.params.grad, expected, atol=1e-6)
    assert metrics["losses/loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert metrics["rewards/overlong_penalty"] == 0.0 and metrics["offpolicy/masked_fraction"] == 0.0


def test_two_workers_sum_then_divide_to_the_single_process_step():
    """Masking, the overlong filter and TIS decide per completion and count in sums: the two halves' sums,
    added and divided, are the whole batch's step (the contract ``ddp`` relies on)."""
    cfg = GRPOConfig(
        loss_type="dapo",
        max_new_tokens=4,
        tis_cap=1.5,
        is_mask_low=0.5,
        is_mask_high=1.5,
        overlong_filter=True,
        overlong_buffer=2,
    )
    offsets = np.array([[0.1] * 4, [0.5] * 4, [-0.3] * 4, [0.0] * 4, [0.2, -0.1, 0.3, 0.0], [0.4] * 4])
    lengths, rewards = [3, 1, 3, 4, 2, 3], [1.0, 0.0, 1.0, 0.0, 0.5, 0.0]
    whole = PositionPolicy(3, 5, max_new_tokens=4, seed=5)
    batch = make_batch(whole, lengths, offsets, rewards)
    single = Recorder()
    single_metrics = GRPOAlgo(cfg, whole).update(batch, single)
    grads, stats = [], []
    for rows in (slice(0, 2), slice(2, 6)):  # whole groups on each worker, of different sizes
        worker = PositionPolicy(3, 5, max_new_tokens=4, seed=5)
        recorder = Recorder()
        GRPOAlgo(cfg, worker).update(batch.rows(rows, slice(rows.start // 2, rows.stop // 2)), recorder)
        grads.append(recorder.grad)
        stats.append(recorder.stats)
    count = STATS.index("count")
    summed = stats[0] + stats[1]
    assert summed[count] == pytest.approx(float(single.stats[count]))
    assert torch.allclose((grads[0] + grads[1]) / summed[count], whole.params.grad, atol=1e-6)
    merged = GRPOAlgo(cfg, PositionPolicy(3, 5, 4, 5)).metrics(summed, single_metrics["losses/grad_norm"], 0.0)
    assert merged == pytest.approx({**single_metrics, "charts/learning_rate": 0.0})
    assert single_metrics["offpolicy/masked_fraction"] > 0 and single_metrics["completions/truncated_fraction"] > 0
