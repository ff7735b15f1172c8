"""GRPO math by hand, the versioned replay buffer, and a generator's one-version slices."""

import math

import numpy as np
import pytest
import torch

from distrl.algos.grpo import GroupPolicy, group_advantages, grpo_loss
from distrl.config import ConfigError, GRPOConfig, StrategyConfig
from distrl.data.replay import VersionedReplay
from distrl.strategies.pipeline import Generator, check_pipeline
from distrl.tasks import BanditTask, ToyTask


def test_group_advantages_by_hand():
    adv = group_advantages(torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]]), eps=0.0 + 1e-12)
    std = math.sqrt(1.25)  # population std of 1, 2, 3, 4 around 2.5
    assert adv[0].tolist() == pytest.approx([-1.5 / std, -0.5 / std, 0.5 / std, 1.5 / std])
    assert adv[1].tolist() == [0.0, 0.0, 0.0, 0.0]  # a flat group teaches nothing


def test_grpo_loss_by_hand():
    # two samples: ratio e^0.5 = 1.6487 (clipped to 1.2 for a positive advantage), ratio e^-0.1 = 0.9048
    new = torch.tensor([[0.0, -1.1]])
    behaviour = torch.tensor([[-0.5, -1.0]])
    ref = torch.tensor([[-0.2, -1.1]])
    adv = torch.tensor([[1.0, -2.0]])
    loss, stats = grpo_loss(new, behaviour, ref, adv, clip_range=0.2, kl_coef=0.1)
    surrogate = [min(math.exp(0.5) * 1.0, 1.2 * 1.0), min(math.exp(-0.1) * -2.0, 0.9048374 * -2.0)]
    kl = [math.exp(-0.2) + 0.2 - 1, 0.0]  # exp(ref - new) - (ref - new) - 1
    expected = -sum(surrogate) / 2 + 0.1 * sum(kl) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)
    assert stats["kl_ref"] == pytest.approx(sum(kl) / 2, rel=1e-6)
    assert stats["clip_fraction"] == 0.5


def test_replay_evicts_oldest_first_and_counts_everything():
    buf = VersionedReplay(capacity=3, max_policy_lag=10)
    for v in range(5):
        buf.add(v, f"slice-{v}")
    assert [entry[1] for entry in buf._slices] == ["slice-2", "slice-3", "slice-4"]
    taken = buf.sample(2, learner_version=5)
    assert len(taken) == 2 and len(buf) == 1
    assert buf.counters() == {"slices_added": 5, "slices_trained": 2, "slice_uses": 2, "slices_never_trained": 3,
                              "slices_retired": 2, "slices_evicted": 2, "slices_dropped_for_lag": 0,
                              "slices_left_in_buffer": 1}


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
    assert c["slices_added"] == c["slices_retired"] + c["slices_evicted"] + c["slices_dropped_for_lag"] + c["slices_left_in_buffer"]


def test_version_weighted_sampling_frequencies():
    buf = VersionedReplay(capacity=4, max_policy_lag=100, sampling="version", seed=0)
    counts = np.zeros(4)
    for _ in range(20_000):
        for v in range(4):
            buf.add(v, v)
        (v, _), = buf.sample(1, learner_version=3)
        counts[v] += 1
        buf.sample(3, learner_version=3)  # empty it for the next round
    assert counts / counts.sum() == pytest.approx(np.array([1, 2, 3, 4]) / 10, abs=0.01)
    with pytest.raises(ConfigError, match="sampling='newest'"):
        VersionedReplay(4, 1, sampling="newest")


def test_a_slice_is_drawn_by_exactly_the_version_it_is_tagged_with():
    cfg = GRPOConfig(states_per_slice=6, group_size=5)
    gen = Generator("toy", cfg, seed=0, generator_id=1)
    policies = [GroupPolicy(4, 4, cfg.net_arch, seed=s) for s in (1, 2)]
    for version, policy in zip((3, 4), policies):
        out = gen.generate(version, policy.flat_weights(), slices=2)
        assert out["version"] == version and out["actions"].shape == (2, 6, 5)
        expected = policy.log_probs(torch.from_numpy(out["obs"].reshape(12, 4)),
                                    torch.from_numpy(out["actions"].reshape(12, 5)))
        assert torch.allclose(torch.from_numpy(out["log_probs"].reshape(12, 5)), expected.detach())
    again = gen.generate(4, None)  # same version: no weights sent, none loaded
    assert again["version"] == 4
    with pytest.raises(RuntimeError, match="holds version 4, asked for 5 without weights"):
        gen.generate(5, None)  # a newer version without its weights would mix versions: refused


def test_tasks_know_their_optimum():
    rng = np.random.default_rng(0)
    bandit = BanditTask()
    states = bandit.states(50, rng)
    best = bandit.best_actions(states)
    assert bandit.rewards(states, np.stack([best, (best + 1) % 8], axis=1)).tolist() == [[1.0, 0.0]] * 50
    toy = ToyTask()
    states = toy.states(50, rng)
    all_actions = np.tile(np.arange(4), (50, 1))
    assert toy.optimal_reward(states) == pytest.approx(toy.rewards(states, all_actions).max(axis=1).mean(), rel=1e-6)


def test_grpo_config_rejects_bad_values():
    with pytest.raises(ConfigError, match="group_size=1 is not allowed"):
        GRPOConfig(group_size=1)
    with pytest.raises(ConfigError, match="buffer_capacity=2 is not allowed: must be >= slices_per_step"):
        check_pipeline(GRPOConfig(slices_per_step=4), StrategyConfig(strategy="pipeline", buffer_capacity=2))
    with pytest.raises(ConfigError, match="queue_size=2 is not allowed: must be >= slices_per_call"):
        check_pipeline(GRPOConfig(slices_per_call=4), StrategyConfig(strategy="pipeline", queue_size=2))
    with pytest.raises(ConfigError, match="max_reuse=0 is not allowed"):
        StrategyConfig(strategy="pipeline", max_reuse=0)
