"""APPO and IMPALA end to end: they learn under single and pipeline, the pipeline's lag accounting under a slow
learner, a killed actor replaced, and two ddp ranks equal to one learner on the same data."""

import dataclasses
import json
import os
import signal
import time

import numpy as np
import pytest
import torch

from distributed import run_ranks
from distrl.cli import main
from distrl.config import APPOConfig, IMPALAConfig, RunConfig, StrategyConfig
from distrl.nets import ModuleAgent
from distrl.strategies.actors import RayActors
from distrl.strategies.pipeline_ppo import AsyncCollector
from distrl.training import OnPolicyTrainer

CFG = APPOConfig(n_envs=2, n_steps=16, batch_size=32, normalize_obs=True)


def pipeline_trainer(ray, run, cfg=CFG, **strategy):
    """An APPO (or IMPALA: ``run.algo``) learner fed by ``workers`` Ray actors."""
    strategy = StrategyConfig(strategy="pipeline", **{"workers": 2, **strategy})
    return OnPolicyTrainer(
        run, cfg, strategy=strategy, collector_factory=lambda t: AsyncCollector(t, strategy, RayActors(ray))
    )


def train_cli(algo, env, run_dir, *flags):
    """A command-line run in this process (under pipeline, on the session's Ray instance): its summary."""
    assert main(["train", algo, env, "--quiet", "--run-dir", str(run_dir), *flags]) == 0
    return json.loads((run_dir / "summary.json").read_text())


def assert_fragments_add_up(s):
    """Every fragment generated is counted once: trained and retired, evicted, dropped, or left over."""
    assert (
        s["fragments_generated"]
        == s["fragments_added"]
        == s["fragments_retired"]
        + s["fragments_evicted"]
        + s["fragments_dropped_for_lag"]
        + s["fragments_left_in_buffer"]
    )
    assert s["fragments_dropped_for_lag_fraction"] == s["fragments_dropped_for_lag"] / s["fragments_added"]
    assert sum(s["policy_lag_counts"].values()) == s["fragment_uses"]


@pytest.mark.parametrize("algo", ["appo", "impala"])
def test_vtrace_algos_learn_cartpole_in_one_process(tmp_path, algo):
    # in the default suite, as the learning tests of APPO and IMPALA under single and pipeline (5-10 s each here)
    # The CartPole presets, seed 0: appo evaluated 500 (100k steps), impala 375.7 (300k steps; 376-494 on seeds 0-7
    # under single, docs/benchmarks.md); a random policy ~22.
    s = train_cli(algo, "CartPole-v1", tmp_path / "run", "--strategy", "single", "--seed", "0")
    assert s["strategy"] == "single" and s["algo"] == algo
    assert s["final_eval_mean_return"] >= {"appo": 400, "impala": 350}[algo]


@pytest.mark.multiprocess
def test_appo_learns_cartpole_with_two_actors_and_accounts_for_every_fragment(tmp_path, ray_local):
    # the CLI's default for appo: --strategy pipeline --workers 2, each learner step on both actors' fragments.
    # The actors' timing makes each run differ: most ended their 100k steps at 500, one at 138.8 (a policy that had
    # learned, then fell away at the end). Evaluated every 20k steps, the run stops at 475 (4 runs: 500 at 41k, 62k,
    # 82k and 100k steps), and the stop still drains and counts every fragment.
    run_dir = tmp_path / "run"
    s = train_cli("appo", "CartPole-v1", run_dir, "--target-return", "475", "--eval-every", "20480")
    assert s["strategy"] == "pipeline" and s["workers"] == 2
    assert s["final_eval_mean_return"] >= 400
    fragment_steps = 16 * 32  # the preset's n_envs x n_steps
    assert s["fragments_generated"] * fragment_steps == s["total_steps"] + s["drained_steps"]
    assert s["fragments_trained"] == s["learner_steps"] * 2 == s["iterations"] * 2
    assert 0 <= s["policy_lag_mean"] <= s["policy_lag_p95"] <= s["policy_lag_max"] <= StrategyConfig().max_policy_lag
    assert_fragments_add_up(s)
    assert sum(s["policy_lag_counts"].values()) == s["fragments_trained"]
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = EventAccumulator(str(run_dir)).Reload().Tags()["scalars"]
    assert {
        "pipeline/policy_lag",
        "pipeline/policy_lag_max",
        "pipeline/learner_busy_fraction",
        "pipeline/dropped_for_lag",
    } <= set(logged)


@pytest.mark.multiprocess
def test_a_slow_learner_trains_on_lagged_fragments_drops_the_stalest_and_counts_them(ray_local):
    # Two actors deliver two fragments per learner step, of which the learner (slowed to 0.3 s a step) takes one:
    # up to eight wait, the newer preferred, and those more than max_policy_lag = 2 versions old are dropped.
    run = RunConfig(env="CartPole-v1", algo="appo", seed=0, vec="sync", quiet=True, total_steps=10**9)
    trainer = pipeline_trainer(ray_local, run, fragments_per_step=1, queue_size=8, buffer_capacity=64, max_policy_lag=2)
    update = trainer.algo.update

    def slow_update(*args, **kwargs):
        time.sleep(0.3)
        return update(*args, **kwargs)

    trainer.algo.update = slow_update
    trainer.train(stop_at=24 * CFG.rollout_size)
    stats = trainer.collector.stats
    s = trainer.collector.finish()
    trainer.close()

    steps = trainer.policy_version
    assert s["learner_steps"] == steps >= 8
    assert s["fragments_trained"] == s["fragment_uses"] == steps == sum(stats.lag_counts.values())
    assert_fragments_add_up(s)
    assert set(stats.lag_counts) <= {0, 1, 2} and max(stats.lag_counts) == 2  # lagged, never past max_policy_lag
    assert s["fragments_dropped_for_lag"] > 0
    lags = np.repeat(list(stats.lag_counts), list(stats.lag_counts.values()))  # every trained fragment's lag
    assert s["policy_lag_counts"] == {str(lag): int((lags == lag).sum()) for lag in sorted(set(lags))}
    assert s["policy_lag_mean"] == pytest.approx(lags.mean()) and s["policy_lag_mean"] > 0.5
    assert s["policy_lag_max"] == lags.max() and s["policy_lag_min"] == lags.min()
    assert s["policy_lag_p95"] == np.sort(lags)[int(np.ceil(0.95 * len(lags))) - 1]  # smallest with 95% at or below
    assert s["learner_busy_fraction"] > 0.5  # the sleeps


@pytest.mark.multiprocess
def test_a_killed_actor_is_replaced_and_appo_goes_on(ray_local):
    run = RunConfig(env="CartPole-v1", algo="appo", seed=0, vec="sync", quiet=True, total_steps=10**9)
    trainer = pipeline_trainer(ray_local, run)
    trainer.train(stop_at=4 * 2 * CFG.rollout_size)
    before = trainer.policy_version
    pid = ray_local.get(trainer.collector.pool.actors[1].pid.remote(), timeout=60)
    os.kill(pid, signal.SIGKILL)
    trainer.train(stop_at=trainer.steps + 12 * 2 * CFG.rollout_size)
    s = trainer.collector.finish()
    trainer.close()
    assert s["generator_restarts"] == 1 and trainer.events[0].split(" ", 2)[2].startswith("generator 1 died")
    assert trainer.policy_version >= before + 10  # the learner went on with the replacement
    assert s["fragments_trained"] == s["fragment_uses"] == 2 * trainer.policy_version
    assert_fragments_add_up(s)
    # the killed actor's fragment under way was never delivered: every step counted was in a delivered fragment
    assert s["fragments_generated"] * CFG.rollout_size == trainer.steps + s["drained_steps"]
    assert s["policy_lag_max"] <= StrategyConfig().max_policy_lag


def whole_run(rank, world, algo, cfg, iterations, actors_per_rank=0):
    """A ddp rank's run; with ``actors_per_rank`` its learner is fed by actors of its own (one fragment ahead)."""
    from contextlib import nullcontext

    from distrl.strategies.ddp import DistributedSync, own_actors

    run = RunConfig(
        env="CartPole-v1",
        algo=algo,
        total_steps=iterations * cfg.rollout_size * world,
        seed=5,
        vec="sync",
        quiet=True,
    )
    strategy = StrategyConfig(
        strategy="ddp", workers=world, actors_per_rank=actors_per_rank, queue_size=1, fragments_per_step=1
    )
    with own_actors(run, strategy, None) if actors_per_rank else nullcontext(None) as collector_factory:
        trainer = OnPolicyTrainer(
            run,
            cfg,
            sync=DistributedSync(torch.device("cpu"), 30),
            strategy=strategy,
            collector_factory=collector_factory,
        )
        trainer.broadcast_state()
        trainer.train()
        trainer.close()
    return trainer.agent.params.data.clone(), trainer.steps


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_ddp_ranks_fed_by_actors_of_their_own_compute_what_ranks_collecting_themselves_compute():
    # one actor per rank, one fragment ahead of its learner (queue 1): every fragment is drawn by the learner's
    # current weights from the environments the rank would have played itself, so ddp's numbers come out
    cfg = APPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=2, learning_rate=3e-3)
    (fed, steps), (fed1, _) = run_ranks(whole_run, 2, "appo", cfg, 4, 1, timeout=300)
    (plain, plain_steps), _ = run_ranks(whole_run, 2, "appo", cfg, 4)
    assert steps == plain_steps == 4 * 2 * 32
    assert torch.equal(fed, fed1)
    torch.testing.assert_close(fed, plain, rtol=0, atol=1e-5)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "algo,cfg",
    [
        ("appo", APPOConfig(n_envs=4, n_steps=16, batch_size=64, n_epochs=3, learning_rate=3e-3, normalize_obs=True)),
        (
            "impala",
            IMPALAConfig(
                n_envs=4, n_steps=16, batch_size=64, learning_rate=3e-3, max_grad_norm=0.5, optimizer="rmsprop"
            ),
        ),
    ],
    ids=["appo", "impala"],
)
def test_two_ddp_ranks_equal_one_learner_on_the_same_envs(algo, cfg):
    # as test_ddp's PPO: each rank prepares V-trace targets for its 4 envs and every minibatch is a rank's whole
    # rollout (shuffled minibatches would pick other samples than one learner's), the gradients are summed
    # before the clip; one learner with all 8 envs and the doubled batch takes the same steps
    (p0, steps), (p1, _) = run_ranks(whole_run, 2, algo, cfg, 4)
    single_cfg = dataclasses.replace(cfg, n_envs=8, batch_size=2 * cfg.batch_size)
    run = RunConfig(env="CartPole-v1", algo=algo, total_steps=steps, seed=5, vec="sync", quiet=True)
    single = OnPolicyTrainer(run, single_cfg)
    start = single.agent.params.data.clone()
    single.train()
    single.close()
    assert single.steps == steps == 4 * 128
    assert torch.equal(p0, p1)
    assert float((single.agent.params.data - start).abs().max()) > 1e-3
    torch.testing.assert_close(p0, single.agent.params.data, rtol=0, atol=2e-5)


PIXELS = RunConfig(env="distrl_spaceenvs:QuadrantEnv", algo="appo", seed=0, vec="sync", quiet=True)
"""10x10 uint8 images, episodes of 8 steps: 1 per quadrant named, 8 at best; a policy that ignores the pixels: 2."""
PIXELS_CFG = APPOConfig(
    n_envs=8, n_steps=32, batch_size=64, n_epochs=4, learning_rate=1e-3, net_arch=(64,), gamma=0.9, clip_range=0.2
)


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "strategy",
    ["single", pytest.param("pipeline", marks=pytest.mark.heavy)],  # the CNN under one more strategy
)
def test_appo_learns_from_pixels(ray_local, strategy):
    run = PIXELS.replace(total_steps=8192)
    if strategy == "single":
        trainer = OnPolicyTrainer(run, PIXELS_CFG)
    else:
        trainer = pipeline_trainer(ray_local, run, PIXELS_CFG)
    assert isinstance(trainer.agent, ModuleAgent)  # the CNN
    trainer.train()
    mean, _ = trainer.evaluate_now()
    trainer.close()
    assert (
        mean >= 7.0
    )  # seed 0 reached 8 under both (32 learner steps under single, 16 of two fragments under pipeline)


@pytest.mark.slow  # learning
def test_appo_learns_dict_observations():
    # image + vector keys, each through its own encoder (either key alone earns 4 of 8; guessing 2)
    cfg = APPOConfig(
        n_envs=8, n_steps=32, batch_size=64, n_epochs=4, learning_rate=1e-3, net_arch=(64,), gamma=0.9, clip_range=0.2
    )
    run = RunConfig(algo="appo", env="distrl_spaceenvs:DictSignEnv", total_steps=8192, seed=0, vec="sync", quiet=True)
    trainer = OnPolicyTrainer(run, cfg)
    trainer.train()
    mean, _ = trainer.evaluate_now()
    trainer.close()
    assert mean >= 7.0


def test_impala_trains_a_users_module_through_vtrace():
    run = RunConfig(
        algo="impala",
        env="CartPole-v1",
        policy="distrl_spaceenvs:tiny_net",
        total_steps=2 * 64,
        seed=0,
        vec="sync",
        quiet=True,
    )
    trainer = OnPolicyTrainer(run, IMPALAConfig(n_envs=2, n_steps=32, batch_size=64))
    assert isinstance(trainer.agent, ModuleAgent) and type(trainer.agent.module).__name__ == "TinyNet"
    before = trainer.agent.params.data.clone()
    trainer.train()
    assert trainer.policy_version == 2
    assert not torch.equal(trainer.agent.params.data, before)  # the user's layers were trained
    trainer.close()
