"""Value normalisation (``--normalize-value``) and the per-policy losses of multi-agent runs."""

import dataclasses
import json
import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distributed import run_ranks
from distrl.algos.appo import APPOAlgo
from distrl.algos.impala import IMPALAAlgo
from distrl.algos.policy_stats import STATS
from distrl.algos.ppo import PPOAlgo
from distrl.algos.protocols import LocalSync
from distrl.algos.value_norm import ValueNormalizer
from distrl.config import APPOConfig, ConfigError, IMPALAConfig, PPOConfig, RunConfig, StrategyConfig
from distrl.data.packed import PackedBatch
from distrl.data.rollout import Rollout, RolloutBatch
from distrl.nets import ActorCritic
from distrl.run import checkpoint
from distrl.training import OnPolicyTrainer
from reference import distribution, functional_params, values

BETA = 0.99999
VALUE_LOSS = STATS.index("value_loss")


def moments(returns, valid=None):
    returns = torch.tensor(returns, dtype=torch.float32)
    return ValueNormalizer.moments(returns, torch.ones(len(returns)) if valid is None else torch.tensor(valid))


# ---- the normaliser ----


def test_statistics_by_hand_over_three_updates():
    norm = ValueNormalizer()
    # before any update: mean 0 and the variance floor, 1e-2
    assert norm.mean_std() == (0.0, pytest.approx(0.1))
    # 1: returns 1, 3 (and an invalid 100): the first update's statistics are the batch's, mean 2, var 5 - 4 = 1
    norm.update(moments([1.0, 3.0, 100.0], [1.0, 1.0, 0.0]))
    mean, std = norm.mean_std()
    assert mean == pytest.approx(2.0, rel=1e-9) and std == pytest.approx(1.0, rel=1e-6)
    # 2: returns 4, 6, 8 (mean 6, mean of squares 116/3), weighted beta : 1 after debiasing
    norm.update(moments([4.0, 6.0, 8.0]))
    w = 1 - BETA
    running_mean = BETA * w * 2.0 + w * 6.0
    running_sq = BETA * w * 5.0 + w * 116.0 / 3.0
    debias = BETA * w + w
    mean, std = norm.mean_std()
    assert mean == pytest.approx(running_mean / debias, rel=1e-9)
    assert mean == pytest.approx((BETA * 2.0 + 6.0) / (BETA + 1.0), rel=1e-9)  # about 4
    assert std**2 == pytest.approx(running_sq / debias - mean**2, rel=1e-6)
    # 3: returns all 0.1: the variance keeps its floor only when the moments say less than 1e-2
    norm.update(moments([0.1, 0.1]))
    running_mean, running_sq = BETA * running_mean + w * 0.1, BETA * running_sq + w * 0.01
    debias = BETA * debias + w
    mean, std = norm.mean_std()
    assert mean == pytest.approx(running_mean / debias, rel=1e-9)
    assert std**2 == pytest.approx(max(running_sq / debias - mean**2, 1e-2), rel=1e-6)
    assert norm.state.tolist() == pytest.approx([running_mean, running_sq, debias], rel=1e-9)
    # a batch without valid samples changes nothing; normalise and denormalise are inverse
    before = norm.state.clone()
    norm.update(moments([5.0], [0.0]))
    assert torch.equal(norm.state, before)
    x = torch.tensor([-1.0, 0.5, 9.0])
    torch.testing.assert_close(norm.normalize(x), (x - mean) / std)
    torch.testing.assert_close(norm.denormalize(norm.normalize(x)), x)


def test_the_variance_floor_holds_for_constant_returns():
    norm = ValueNormalizer()
    norm.update(moments([7.0, 7.0, 7.0]))
    assert norm.mean_std() == (pytest.approx(7.0), pytest.approx(0.1))


# ---- PPO's loss and targets with normalize_value ----


def normalizer_at(algo: PPOAlgo, returns: list[float]) -> tuple[float, float]:
    """Give ``algo``'s normaliser the statistics of one batch of ``returns``: (mean, std) by hand."""
    algo.value_norm.update(moments(returns))
    mean = float(np.mean(returns))
    return mean, math.sqrt(float(np.mean(np.square(returns))) - mean**2)


def random_batch(agent: ActorCritic, n: int, seed: int = 0) -> RolloutBatch:
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, agent.obs_dim, generator=g)
    actions = torch.randint(0, agent.action_dim, (n,), generator=g)
    valid = torch.ones(n)
    valid[::5] = 0.0
    return RolloutBatch(
        obs=obs,
        actions=actions,
        log_probs=agent.log_prob(obs, actions) + 0.3 * torch.randn(n, generator=g),
        values=torch.randn(n, generator=g),
        advantages=torch.randn(n, generator=g),
        returns=5.0 + 3.0 * torch.randn(n, generator=g),
        valid=valid,
        policy_version=0,
    )


@pytest.mark.parametrize("clip_vf", [None, 0.1])
def test_value_loss_is_taken_on_normalised_returns(clip_vf):
    cfg = PPOConfig(n_envs=1, n_steps=40, batch_size=40, vf_coef=0.7, clip_range_vf=clip_vf, normalize_value=True)
    agent = ActorCritic(4, spaces.Discrete(3), (16, 16), seed=0)
    algo = PPOAlgo(cfg, agent, seed=0)
    mean, std = normalizer_at(algo, [2.0, 4.0, 12.0])
    batch = random_batch(agent, 40)
    adv = algo.normalized_advantages(batch, LocalSync())
    stats = algo._minibatch_gradient(PackedBatch.pack(batch, adv).rows(torch.arange(40)), clip_range=0.2)

    flat, views = functional_params(agent)
    dist = distribution(agent, views, batch.obs)
    ratio = (dist.log_prob(batch.actions) - batch.log_probs).exp()
    policy = -torch.min(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    target = (batch.returns - mean) / std  # the critic's units
    v = values(agent, views, batch.obs)
    v_loss = (v - target).square()
    if clip_vf is not None:  # around the critic's outputs at collection time, also in its units
        v_clipped = batch.values + (v - batch.values).clamp(-clip_vf, clip_vf)
        v_loss = torch.max(v_loss, (v_clipped - target).square())
    ((policy + 0.7 * v_loss) * batch.valid).sum().backward()
    torch.testing.assert_close(agent.params.grad, flat.grad, rtol=1e-4, atol=1e-5)
    assert float(stats[VALUE_LOSS]) == pytest.approx(float((v_loss * batch.valid).sum().detach()), rel=1e-5)
    # the returns themselves would give another loss: the check can fail
    raw = ((v - batch.returns).square() * batch.valid).sum().detach()
    assert float(stats[VALUE_LOSS]) != pytest.approx(float(raw), rel=1e-2)


def tiny_rollout() -> Rollout:
    """One env, three steps: the episode is truncated at step 1 (obs[2] is its final observation), step 2 is the
    reset step; the critic's outputs were recorded while acting."""
    return Rollout(
        obs=np.arange(16, dtype=np.float32).reshape(4, 1, 4) / 16,
        actions=np.array([[0], [1], [0]]),
        rewards=np.array([[1.0], [2.0], [0.0]], np.float32),
        terminated=np.zeros((3, 1), bool),
        truncated=np.array([[False], [True], [False]]),
        valid=np.array([[True], [True], [False]]),
        policy_version=0,
        log_probs=np.full((3, 1), -0.7, np.float32),
        values=np.array([[0.5], [-1.0], [2.0], [0.3]], np.float32),
    )


def test_gae_bootstraps_from_denormalised_values_truncation_included():
    cfg = PPOConfig(n_envs=1, n_steps=3, batch_size=3, gamma=0.9, gae_lambda=0.8, normalize_value=True)
    algo = PPOAlgo(cfg, ActorCritic(4, spaces.Discrete(2), (8,), seed=0), seed=0)
    mean, std = normalizer_at(algo, [1.0, 5.0])  # mean 3, std 2
    assert (mean, std) == (3.0, 2.0)
    rollout = tiny_rollout()
    batch = algo.prepare(rollout)
    z = rollout.values[:, 0]
    v = z * 2.0 + 3.0  # 4, 1, 7 (the truncated episode's final observation), 3.6
    adv1 = 2.0 + 0.9 * 7.0 - 1.0  # truncated: bootstraps from its final observation, no trace past it
    adv0 = 1.0 + 0.9 * 1.0 - 4.0 + 0.9 * 0.8 * adv1
    np.testing.assert_allclose(batch.advantages.numpy(), [adv0, adv1, 0.0], rtol=1e-6)
    np.testing.assert_allclose(batch.returns.numpy(), [adv0 + v[0], adv1 + v[1], 0.0], rtol=1e-6)
    np.testing.assert_array_equal(batch.values.numpy(), z[:3])  # the critic's outputs, as the loss clips around
    plain = PPOAlgo(dataclasses.replace(cfg, normalize_value=False), algo.agent, seed=0).prepare(rollout)
    assert plain.advantages[1] == pytest.approx(2.0 + 0.9 * 2.0 + 1.0)  # the raw outputs would bootstrap


def test_vtrace_runs_on_denormalised_values_and_impala_trains_toward_normalised_targets():
    # APPO's V-trace on the behaviour policy itself (no recorded log-probs) with lambda 1 gives GAE(1)'s returns
    sizes = dict(n_envs=1, n_steps=3, batch_size=3, gamma=0.9, gae_lambda=1.0, normalize_value=True)
    agent = ActorCritic(4, spaces.Discrete(2), (8,), seed=0)
    rollout = dataclasses.replace(tiny_rollout(), values=None, log_probs=None)
    ppo, appo = PPOAlgo(PPOConfig(**sizes), agent, 0), APPOAlgo(APPOConfig(**sizes), agent, 0)
    for algo in (ppo, appo):
        normalizer_at(algo, [1.0, 5.0])
    gae_batch, vtrace_batch = ppo.prepare(rollout), appo.prepare(rollout)
    torch.testing.assert_close(vtrace_batch.returns, gae_batch.returns, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(vtrace_batch.values, gae_batch.values)
    fresh = APPOAlgo(APPOConfig(**{**sizes, "normalize_value": False}), agent, 0).prepare(rollout)
    assert not torch.allclose(fresh.returns, vtrace_batch.returns, atol=1e-2)

    impala = IMPALAAlgo(IMPALAConfig(**sizes), agent, 0)
    mean, std = normalizer_at(impala, [1.0, 5.0])
    batch = impala.prepare(rollout)
    packed = PackedBatch.pack(batch, batch.advantages)
    stats = impala._minibatch_gradient(packed.all_rows(), clip_range=0.2)
    critic = agent.values(batch.obs)
    expected = 0.5 * ((critic - (batch.returns - mean) / std).square() * batch.valid).sum()
    assert float(stats[VALUE_LOSS]) == pytest.approx(float(expected), rel=1e-5)


def test_decoupled_refuses_normalize_value():
    from distrl.strategies.decoupled import check_layout

    with pytest.raises(ConfigError, match="normalize_value=True is not available with --strategy decoupled"):
        check_layout(PPOConfig(normalize_value=True), StrategyConfig(strategy="decoupled", workers=2), 2)


# ---- checkpoints, ddp ----

SMALL = PPOConfig(
    n_envs=4, n_steps=16, batch_size=32, n_epochs=2, learning_rate=1e-3, clip_range_vf=0.2, normalize_value=True
)


def small_run(run_dir, **kw):
    values = dict(env="CartPole-v1", total_steps=640, seed=3, vec="sync", quiet=True, run_dir=str(run_dir))
    values.update(kw)
    return RunConfig(**values)


def test_a_run_with_normalize_value_interrupted_and_resumed_is_bit_identical(tmp_path):
    full = OnPolicyTrainer(small_run(tmp_path / "full", checkpoint_every=192), SMALL, run_dir=tmp_path / "full")
    full.train()
    first = OnPolicyTrainer(small_run(tmp_path / "cut", checkpoint_every=192), SMALL, run_dir=tmp_path / "cut")
    first.train(stop_at=384)
    first.close()
    latest = checkpoint.find_latest(tmp_path / "cut")
    tensors, _ = checkpoint.load(latest)
    saved = torch.cat([tensors[f"optim/value_norm/{k}"] for k in ("running_mean", "running_mean_sq", "debiasing_term")])
    torch.testing.assert_close(saved, first.value_norm.state, rtol=0, atol=0)
    assert float(saved[2]) > 0  # updated: the statistics in the checkpoint are not the initial ones
    resumed = OnPolicyTrainer(small_run(tmp_path / "cut", checkpoint_every=192), SMALL, run_dir=tmp_path / "cut")
    resumed.load_checkpoint(latest)
    torch.testing.assert_close(resumed.value_norm.state, first.value_norm.state, rtol=0, atol=0)
    resumed.train()
    assert resumed.steps == full.steps == 640
    assert torch.equal(resumed.agent.params.data, full.agent.params.data)
    assert torch.equal(resumed.value_norm.state, full.value_norm.state)
    # a resumed run whose statistics started afresh goes elsewhere: the check can fail
    fresh = OnPolicyTrainer(small_run(tmp_path / "fresh", checkpoint_every=192), SMALL, run_dir=tmp_path / "fresh")
    fresh.load_checkpoint(latest)
    fresh.value_norm.state.zero_()
    fresh.train()
    assert not torch.equal(fresh.agent.params.data, full.agent.params.data)
    for t in (full, resumed, fresh):
        t.close()


def test_a_checkpoint_without_value_statistics_still_loads(tmp_path):
    plain = dataclasses.replace(SMALL, normalize_value=False)
    trainer = OnPolicyTrainer(small_run(tmp_path / "a", total_steps=128), plain, run_dir=tmp_path / "a")
    trainer.train()
    path = trainer.save_checkpoint(tmp_path / "ck")
    assert not any("value_norm" in key for key in checkpoint.load(path)[0])
    other = OnPolicyTrainer(small_run(tmp_path / "b", total_steps=256), SMALL, run_dir=None)
    other.load_checkpoint(path)
    assert torch.equal(other.agent.params.data, trainer.agent.params.data)
    assert other.value_norm.state.tolist() == [0.0, 0.0, 0.0]  # statistics start where a new run's do
    other.train()
    assert other.value_norm.state[2] > 0
    trainer.close()
    other.close()


def whole_run(rank, world, cfg, iterations):
    from distrl.strategies.ddp import DistributedSync

    run = RunConfig(
        env="CartPole-v1", total_steps=iterations * cfg.rollout_size * world, seed=5, vec="sync", quiet=True
    )
    trainer = OnPolicyTrainer(run, cfg, sync=DistributedSync(torch.device("cpu"), 30))
    trainer.value_norm.state.fill_(float(rank))  # rank 1's own statistics: the start-up broadcast replaces them
    trainer.broadcast_state()
    started = trainer.value_norm.state.clone()
    trainer.train()
    trainer.close()
    return trainer.agent.params.data.clone(), trainer.value_norm.state.clone(), started, trainer.steps


@pytest.mark.multiprocess
def test_ddp_with_normalize_value_equals_single_on_the_same_envs():
    cfg = PPOConfig(
        n_envs=4, n_steps=16, batch_size=64, n_epochs=3, learning_rate=3e-3, clip_range_vf=0.2, normalize_value=True
    )
    (p0, s0, start0, steps), (p1, s1, start1, _) = run_ranks(whole_run, 2, cfg, 4)
    assert start0.tolist() == start1.tolist() == [0.0, 0.0, 0.0]
    single = OnPolicyTrainer(
        RunConfig(env="CartPole-v1", total_steps=steps, seed=5, vec="sync", quiet=True),
        dataclasses.replace(cfg, n_envs=8, batch_size=128),
    )
    single.train()
    single.close()
    assert single.steps == steps == 4 * 128
    assert torch.equal(p0, p1) and torch.equal(s0, s1)  # every rank keeps the same statistics
    torch.testing.assert_close(s0, single.value_norm.state, rtol=1e-6, atol=0)
    torch.testing.assert_close(p0, single.agent.params.data, rtol=0, atol=2e-5)
    assert single.value_norm.mean_std()[0] > 1.0  # CartPole's returns: the statistics moved


# ---- multi-agent runs: MAPPO with value normalisation, each policy's losses ----

FAST = ["--n-envs", "4", "--n-steps", "32", "--batch-size", "64", "--n-epochs", "4", "--eval-episodes", "8", "--quiet"]


def test_the_symmetric_cue_task_is_learned_by_mappo_with_normalize_value(tmp_path):
    pytest.importorskip("pettingzoo")
    from distrl.cli import main

    run = tmp_path / "run"
    args = ["train", "ppo", "distrl_macoop:symmetric", "--critic", "centralised", "--normalize-value", *FAST]
    assert main([*args, "--total-steps", "12000", "--run-dir", str(run)]) in (0, None)
    assert json.loads((run / "config.json").read_text())["ppo"]["normalize_value"] is True
    # guessing earns 8/3 of the best team return, 8
    assert json.loads((run / "summary.json").read_text())["final_eval_mean_return"] >= 7.5


def test_each_policys_losses_are_its_agents_rows_alone():
    pytest.importorskip("pettingzoo")
    cfg = PPOConfig(n_envs=4, n_steps=16, batch_size=64, n_epochs=1, learning_rate=3e-3, ent_coef=0.01)
    run = RunConfig(env="distrl_macoop:unlike", seed=3, quiet=True, agent_policies="per-agent")
    trainer = OnPolicyTrainer(run, cfg)
    algo, agent = trainer.algo, trainer.agent
    assert algo.policies is not None and algo.policies.names == ("agent_0", "agent_1")
    batch = algo.prepare(trainer.collector.collect(trainer.policy_version))
    assert batch.size == 16 * 4 * 2  # one minibatch: every agent's rows, losses of the weights before the step
    before = agent.params.data.clone()
    metrics = algo.update(batch, LocalSync())
    agent.params.data.copy_(before)

    total = metrics["losses/trained_samples"]
    counts = [metrics[f"losses/agent_{p}/trained_samples"] for p in (0, 1)]
    assert total == float(batch.valid.sum()) and sum(counts) == total and min(counts) > 0
    adv = algo.normalized_advantages(batch, LocalSync())  # over every agent's rows
    for p in (0, 1):  # env row n = game * 2 + agent, flat row t * N + n: agent p's rows are those with r % 2 == p
        rows = torch.nonzero((torch.arange(batch.size) % 2 == p) & (batch.valid > 0)).squeeze(-1)
        with torch.no_grad():
            fwd = agent.forward_train(batch.obs[rows])
            terms = agent.dist_terms(fwd, batch.actions[rows])
        ratio = (terms.log_prob - batch.log_probs[rows]).exp()
        a = adv[rows]
        policy = torch.max(-a * ratio, -a * ratio.clamp(0.8, 1.2))
        expected = {
            "policy_loss": policy.mean(),
            "value_loss": (fwd.values - batch.returns[rows]).square().mean(),
            "entropy": terms.entropy.mean(),
            "approx_kl": ((ratio - 1) - ratio.log()).mean(),
            "clip_fraction": ((ratio - 1).abs() > 0.2).float().mean(),
        }
        assert counts[p] == len(rows)
        for name, value in expected.items():
            assert metrics[f"losses/agent_{p}/{name}"] == pytest.approx(float(value), rel=1e-4, abs=1e-6), name
    # the two policies' losses differ, and their weighted mean is the whole batch's
    assert metrics["losses/agent_0/value_loss"] != pytest.approx(metrics["losses/agent_1/value_loss"], rel=1e-3)
    weighted = sum(metrics[f"losses/agent_{p}/policy_loss"] * counts[p] for p in (0, 1)) / total
    assert weighted == pytest.approx(metrics["losses/policy_loss"], rel=1e-5, abs=1e-7)
    trainer.close()
    shared = OnPolicyTrainer(run.replace(agent_policies="shared"), cfg)
    assert shared.algo.policies is None  # one policy: its losses are the run's
    shared.close()


def test_a_multiagent_run_writes_each_policys_losses_to_tensorboard(tmp_path):
    pytest.importorskip("pettingzoo")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from distrl.cli import main

    run = tmp_path / "run"
    args = ["train", "ppo", "distrl_macoop:unlike", "--agent-groups", "cue2=agent_0", "cue3=agent_1", *FAST]
    assert main([*args, "--total-steps", "512", "--normalize-value", "--run-dir", str(run)]) in (0, None)
    logged = set(EventAccumulator(str(run)).Reload().Tags()["scalars"])
    for policy in ("cue2", "cue3"):
        assert {f"losses/{policy}/{name}" for name in ("policy_loss", "value_loss", "trained_samples")} <= logged
    assert "losses/policy_loss" in logged
