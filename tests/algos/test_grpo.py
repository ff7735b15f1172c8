"""GRPO math by hand, the gradient against autograd, the versioned replay buffer, and a generator's one-version slices."""

import math

import numpy as np
import pytest
import torch

from distrl.algos.grpo import GRPOAlgo, group_advantages, token_loss, token_weights
from distrl.algos.protocols import LocalSync
from distrl.config import ConfigError, GRPOConfig, RunConfig, StrategyConfig
from distrl.data.groups import GroupSamples, draw_groups, sampling_uniforms, score_groups, step_positions
from distrl.data.versioned import VersionedReplay
from distrl.nets.distributions import sample_tokens
from distrl.nets.group_policy import CategoricalPolicy
from distrl.strategies.group_actors import Generator, request_positions
from distrl.strategies.pipeline import check_pipeline
from distrl.tasks.group import BanditTask, ToyTask, make_group_task
from distrl.tasks.streams import KeyedStreams


def test_group_advantages_by_hand():
    rewards = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    std = math.sqrt(5 / 3)  # Bessel-corrected std of 1, 2, 3, 4 around 2.5
    adv = group_advantages(rewards, "group")
    assert adv[0].tolist() == pytest.approx([x / (std + 1e-4) for x in (-1.5, -0.5, 0.5, 1.5)])
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # a flat group teaches nothing
    assert group_advantages(rewards, "none")[0].tolist() == [-1.5, -0.5, 0.5, 1.5]  # Dr. GRPO: no std division
    assert group_advantages(rewards, "batch", batch_std=2.0)[0].tolist() == pytest.approx(
        [x / 2.0001 for x in (-1.5, -0.5, 0.5, 1.5)]
    )


def test_token_loss_and_its_derivative_by_hand():
    new = torch.tensor([[0.0], [-1.1], [-2.0]]).requires_grad_(True)
    behaviour = torch.tensor([[-0.5], [-1.0], [-1.0]])
    adv = torch.tensor([[1.0], [-2.0], [-1.0]])
    out = token_loss(new, behaviour, adv, clip_low=0.2, clip_high=0.2)
    (d,) = torch.autograd.grad(out.loss.sum(), [new])
    # row 0: r = e^0.5 = 1.6487 > 1.2 with A > 0: the clipped term 1.2 is the minimum, no gradient
    # row 1: r = e^-0.1 = 0.9048 inside the range: -r A, derivative -A r
    # row 2: r = e^-1 = 0.3679 < 0.8 with A < 0: the clipped term -0.8 is the minimum, no gradient
    r1 = math.exp(-0.1)
    assert out.loss.flatten().tolist() == pytest.approx([-1.2, 2 * r1, 0.8])
    assert d.flatten().tolist() == pytest.approx([0.0, 2 * r1, 0.0])
    assert out.clipped.flatten().tolist() == [True, False, True] and out.kl.abs().sum() == 0
    loss_high = token_loss(new, behaviour, adv, clip_low=0.2, clip_high=0.28).loss.detach()  # DAPO's clip-higher
    assert float(loss_high[0, 0]) == pytest.approx(-1.28)
    ref = torch.tensor([[-0.2], [-1.1], [-2.0]])
    out_kl = token_loss(new, behaviour, adv, 0.2, 0.2, ref, beta=0.1)
    (d_kl,) = torch.autograd.grad(out_kl.loss.sum(), [new])
    k3 = math.exp(-0.2) + 0.2 - 1  # exp(ref - new) - (ref - new) - 1
    assert out_kl.kl.flatten().tolist() == pytest.approx([k3, 0.0, 0.0], abs=1e-7)
    assert float(out_kl.loss[0, 0]) == pytest.approx(-1.2 + 0.1 * k3)
    assert float(out_kl.policy_loss[0, 0]) == pytest.approx(-1.2)
    assert float(d_kl[0, 0]) == pytest.approx(0.1 * (1 - math.exp(-0.2)))  # d k3 / d new = 1 - exp(ref - new)
    assert float(d_kl[1, 0]) == pytest.approx(2 * r1)


def test_the_three_loss_aggregations_by_hand():
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])  # completions of 2 and 1 tokens
    per_token = torch.tensor([[1.0, 2.0, 99.0], [4.0, 99.0, 99.0]])

    def aggregate(loss_type):
        weights, count = token_weights(mask, loss_type, max_new_tokens=3)
        return float((per_token * weights).sum()) / count

    assert aggregate("grpo") == pytest.approx(((1 + 2) / 2 + 4 / 1) / 2)  # mean per completion, then over them
    assert aggregate("dapo") == pytest.approx((1 + 2 + 4) / 3)  # mean over every token
    assert aggregate("dr_grpo") == pytest.approx((1 + 2 + 4) / (2 * 3))  # over completions x max_new_tokens


def test_sample_tokens_by_hand():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25]])).expand(3, 3)
    tokens, log_probs = sample_tokens(logits, torch.tensor([0.4, 0.6, 0.9]))
    assert tokens.tolist() == [0, 1, 2]
    assert log_probs.tolist() == pytest.approx([math.log(0.5), math.log(0.25), math.log(0.25)])
    # top-p 0.7 keeps the two most likely (0.5 + 0.25), renormalised to 2/3 and 1/3
    tokens, log_probs = sample_tokens(logits, torch.tensor([0.6, 0.8, 0.99]), top_p=0.7)
    assert tokens.tolist() == [0, 1, 1]
    assert log_probs[1] == pytest.approx(math.log(0.25))  # the policy's own log-probability, not the nucleus'
    assert sample_tokens(logits, torch.tensor([0.99, 0.99, 0.99]), top_p=0.5)[0].tolist() == [0, 0, 0]
    hot, hot_lp = sample_tokens(logits, torch.tensor([0.3, 0.3, 0.3]), temperature=2.0)
    assert hot_lp[0] == pytest.approx(float(torch.log_softmax(logits[0] / 2.0, -1)[hot[0]]))
    assert sample_tokens(logits, None)[0].tolist() == [0, 0, 0]  # greedy


def test_uniforms_depend_on_the_prompt_position_not_on_the_split():
    whole = sampling_uniforms(7, np.arange(4), group_size=3, max_new_tokens=5)
    parts = np.concatenate([sampling_uniforms(7, np.arange(2), 3, 5), sampling_uniforms(7, np.arange(2, 4), 3, 5)])
    assert np.array_equal(whole, parts) and whole.shape == (12, 5)
    assert not np.array_equal(whole, sampling_uniforms(8, np.arange(4), 3, 5))
    # a step's prompts, split over 2 workers, are the prompts one process with the global batch draws
    assert np.array_equal(np.concatenate([step_positions(3, 4, rank, 2) for rank in (0, 1)]), step_positions(3, 8))


def test_keyed_streams_are_one_stream_per_seed_tag_and_key():
    streams = KeyedStreams(seed=3, tag=7)
    first = streams.at(5).random(6)
    assert not np.array_equal(streams.at(6).random(6), first)
    assert np.array_equal(streams.at(5).random(6), first)  # re-keying starts the stream over
    assert not np.array_equal(KeyedStreams(3, 8).at(5).random(6), first)
    assert not np.array_equal(KeyedStreams(4, 7).at(5).random(6), first)
    assert 0.4 < np.mean([streams.at(k).random() for k in range(2000)]) < 0.6


def _plain_grpo_loss(policy, batch, adv, cfg, ref_policy=None):
    """GRPO written plainly with autograd over the module's own parameters, for comparison."""
    states = torch.from_numpy(batch.prompt)
    log_probs = torch.log_softmax(policy.module(states), -1).gather(1, torch.from_numpy(batch.tokens[:, :1]))
    ratio = torch.exp(log_probs - torch.from_numpy(batch.log_probs))
    surrogate = torch.min(ratio * adv[:, None], ratio.clamp(1 - cfg.clip_range, 1 + cfg.clip_high) * adv[:, None])
    per_token = -surrogate
    if ref_policy is not None:
        with torch.no_grad():
            ref = torch.log_softmax(ref_policy.module(states), -1).gather(1, torch.from_numpy(batch.tokens[:, :1]))
        per_token = per_token + cfg.beta * (torch.exp(ref - log_probs) - (ref - log_probs) - 1)
    return per_token.mean()


@pytest.mark.parametrize("loss_type, scale", [("grpo", "group"), ("dapo", "batch"), ("dr_grpo", "none")])
def test_the_learner_step_follows_the_gradient_of_the_plain_loss(loss_type, scale):
    cfg = GRPOConfig(
        loss_type=loss_type,
        scale_rewards=scale,
        beta=0.05,
        microbatch_size=7,
        learning_rate=1e-3,
        max_new_tokens=1,
        prompts_per_slice=4,
        slices_per_step=2,
        clip_range_high=0.3,
    )
    task = make_group_task("toy", cfg, seed=0)
    policy, reference = CategoricalPolicy(4, 4, (16,), seed=1), CategoricalPolicy(4, 4, (16,), seed=1)
    with torch.no_grad():
        policy.params.data.add_(0.3 * torch.randn(policy.params.size, generator=torch.Generator().manual_seed(0)))
    batch = score_groups(task, draw_groups(task, policy, step_positions(0, 8), 5, seed=0, version=0))
    noisy = batch.log_probs + np.random.default_rng(0).normal(0, 0.4, batch.log_probs.shape).astype(np.float32)
    batch = GroupSamples(**{**batch.__dict__, "log_probs": noisy})  # ratios away from 1: clipping takes part
    algo = GRPOAlgo(cfg, policy, reference)
    adv = algo.advantages(batch, LocalSync())
    loss = _plain_grpo_loss(policy, batch, adv, cfg, reference)  # one-token completions: every aggregation is a mean
    expected = torch.autograd.grad(loss, list(policy.module.parameters()))
    metrics = algo.update(batch, LocalSync())
    got = policy.params.grad  # the step's gradient stays in the buffer (divided by the count, before clipping)
    assert torch.allclose(got, torch.cat([g.reshape(-1) for g in expected]), atol=1e-6)
    assert metrics["losses/loss"] == pytest.approx(float(loss.detach()), abs=1e-6)
    assert metrics["losses/grad_norm"] == pytest.approx(float(got.norm()), rel=1e-5)
    assert 0 < metrics["losses/clip_fraction"] < 1 and metrics["losses/kl"] > 0


def test_replay_evicts_oldest_first_and_counts_everything():
    buf = VersionedReplay(capacity=3, max_policy_lag=10)
    for v in range(5):
        buf.add(v, f"slice-{v}")
    assert [entry[1] for entry in buf._slices] == ["slice-2", "slice-3", "slice-4"]
    taken = buf.sample(2, learner_version=5)
    assert len(taken) == 2 and len(buf) == 1
    assert buf.counters() == {
        "slices_added": 5,
        "slices_trained": 2,
        "slice_uses": 2,
        "slices_never_trained": 3,
        "slices_retired": 2,
        "slices_evicted": 2,
        "slices_dropped_for_lag": 0,
        "slices_left_in_buffer": 1,
    }


def test_replay_reuses_a_slice_up_to_max_reuse_and_still_accounts_for_it():
    buf = VersionedReplay(capacity=10, max_policy_lag=100, max_reuse=3)
    for v in range(2):
        buf.add(v, v)
    for _ in range(3):  # both slices in every sample: three uses each, then they leave
        assert sorted(item for _, item in buf.sample(2, learner_version=2)) == [0, 1]
    assert len(buf) == 0 and buf.sample(1, learner_version=2) is None
    buf.add(5, 5)
    buf.add(6, 6)
    buf.sample(1, learner_version=6)
    buf.drop_stale(learner_version=200)  # one trained once, one never: both dropped for lag
    c = buf.counters()
    assert (c["slices_added"], c["slice_uses"], c["slices_retired"], c["slices_dropped_for_lag"]) == (4, 7, 2, 2)
    assert c["slices_trained"] == 3 and c["slices_never_trained"] == 1
    assert c["slices_added"] == c["slices_retired"] + c["slices_evicted"] + c["slices_dropped_for_lag"] + len(buf)


def test_replay_drops_slices_past_the_lag_cap():
    buf = VersionedReplay(capacity=10, max_policy_lag=2)
    for v in (0, 1, 2, 3, 4):
        buf.add(v, v)
    assert buf.sample(2, learner_version=4) is not None  # versions 0 and 1 are more than 2 behind 4
    assert buf.dropped_for_lag == 2
    assert all(4 - entry[0] <= 2 for entry in buf._slices)
    c = buf.counters()
    assert (
        c["slices_added"]
        == c["slices_retired"] + c["slices_evicted"] + c["slices_dropped_for_lag"] + c["slices_left_in_buffer"]
    )


def test_version_weighted_sampling_frequencies():
    buf = VersionedReplay(capacity=4, max_policy_lag=100, sampling="version", seed=0)
    counts = np.zeros(4)
    for _ in range(20_000):
        for v in range(4):
            buf.add(v, v)
        ((v, _),) = buf.sample(1, learner_version=3)
        counts[v] += 1
        buf.sample(3, learner_version=3)  # empty it for the next round
    assert counts / counts.sum() == pytest.approx(np.array([1, 2, 3, 4]) / 10, abs=0.01)
    with pytest.raises(ConfigError, match="sampling='newest'"):
        VersionedReplay(4, 1, sampling="newest")


def test_a_slice_is_drawn_by_exactly_the_version_it_is_tagged_with():
    cfg = GRPOConfig(prompts_per_slice=6, slices_per_call=2, group_size=5, max_new_tokens=1)
    run = RunConfig(algo="grpo", env="toy", seed=0)
    gen = Generator(run, cfg, generator_id=1)
    policies = [CategoricalPolicy(4, 4, cfg.net_arch, seed=s) for s in (1, 2)]
    for version, policy in zip((3, 4), policies):
        samples, _, _ = gen.generate(version, policy.params.flat(), request=version)
        assert (samples.version == version).all() and samples.tokens.shape == (12 * 5, 1)
        assert (
            samples.positions.tolist()
            == request_positions(version, cfg).tolist()
            == list(range(12 * version, 12 * version + 12))
        )
        expected = policy.token_log_probs(
            torch.from_numpy(samples.prompt), None, torch.from_numpy(samples.tokens), None
        )
        assert torch.allclose(torch.from_numpy(samples.log_probs), expected.detach())
    again, _, _ = gen.generate(4, None, request=5)  # same version: no weights sent, none loaded
    assert (again.version == 4).all()
    with pytest.raises(RuntimeError, match="holds version 4, asked for 5 without weights"):
        gen.generate(5, None, request=6)  # a newer version without its weights would mix versions: refused


def test_tasks_know_their_optimum():
    rng = np.random.default_rng(0)
    bandit = BanditTask()
    states = bandit.states(50, rng)
    best = bandit.best_actions(states)
    assert bandit.action_rewards(states, np.stack([best, (best + 1) % 8], axis=1)).tolist() == [[1.0, 0.0]] * 50
    toy = ToyTask()
    states = toy.states(50, rng)
    all_actions = np.tile(np.arange(4), (50, 1))
    assert toy.optimal_reward(states) == pytest.approx(
        toy.action_rewards(states, all_actions).max(axis=1).mean(), rel=1e-6
    )
    # a prompt is its position's state, whoever asks
    assert np.array_equal(toy.prompts(np.array([5, 9])), toy.prompts(np.arange(10))[[5, 9]])


def test_grpo_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="group_size=1 is not allowed"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="top_p=0 is not allowed: must be in"):
        GRPOConfig(top_p=0)
    with pytest.raises(ConfigError, match="beta=-0.1 is not allowed"):
        GRPOConfig(beta=-0.1)
    with pytest.raises(ConfigError, match=r"reward_weights=\(1.0, 2.0\) is not allowed: must be one weight per reward"):
        GRPOConfig(rewards=("exact_match",), reward_weights=(1.0, 2.0))
    with pytest.raises(ConfigError, match="buffer_capacity=2 is not allowed: must be >= slices_per_step"):
        check_pipeline(GRPOConfig(slices_per_step=4), StrategyConfig(strategy="pipeline", buffer_capacity=2))
    with pytest.raises(ConfigError, match="queue_size=2 is not allowed: must be >= slices_per_call"):
        check_pipeline(GRPOConfig(slices_per_call=4), StrategyConfig(strategy="pipeline", queue_size=2))
    with pytest.raises(ConfigError, match="max_reuse=0 is not allowed"):
        StrategyConfig(strategy="pipeline", max_reuse=0)
    with pytest.raises(ConfigError, match="model='m' is not allowed with env='toy'"):
        make_group_task("toy", GRPOConfig(model="m"))
