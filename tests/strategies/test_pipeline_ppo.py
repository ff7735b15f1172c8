"""pipeline on Gymnasium envs: asynchronous PPO against the generators' behaviour log-probabilities."""

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch

from distrl.config import PPOConfig, RunConfig, StrategyConfig
from distrl.strategies.actor_learner import RolloutWorker, WorkerSpec
from distrl.strategies.actors import RayActors
from distrl.strategies.pipeline_ppo import AsyncCollector
from distrl.strategies.pool import GeneratorFailed
from distrl.training import OnPolicyTrainer

CFG = PPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=2, normalize_obs=True, normalize_reward=True)


def pipeline_trainer(ray, run, cfg=CFG, **strategy):
    strategy = StrategyConfig(strategy="pipeline", **{"workers": 1, **strategy})
    return OnPolicyTrainer(
        run, cfg, strategy=strategy, collector_factory=lambda t: AsyncCollector(t, strategy, RayActors(ray))
    )


def test_behaviour_log_probs_come_from_the_policy_that_acted_not_the_learner():
    run = RunConfig(env="CartPole-v1", seed=2, vec="sync", quiet=True)
    learner = OnPolicyTrainer(run, CFG)
    worker = RolloutWorker(WorkerSpec("ppo", run, CFG, 0))
    worker.reset(run.seed, 0)
    rollout = worker.collect(learner.weights(), 0, True)  # acted with version 0
    T, N = rollout.rewards.shape
    obs = torch.from_numpy(rollout.obs[:T].reshape(T * N, -1))
    actions = torch.from_numpy(rollout.actions.reshape(-1))
    acted = learner.agent.log_prob(obs, actions).detach().numpy().reshape(T, N)
    np.testing.assert_allclose(rollout.log_probs, acted, rtol=0, atol=1e-6)
    learner.agent.params.data.add_(0.05 * torch.randn_like(learner.agent.params.data))  # the learner moves on
    learner.agent.refresh_acting_copy()
    batch = learner.algo.prepare(rollout)
    assert torch.equal(batch.log_probs, torch.from_numpy(rollout.log_probs.reshape(-1)))
    assert not torch.allclose(batch.log_probs, learner.agent.log_prob(obs, actions))  # the ratio will not start at 1
    learner.close()


@pytest.mark.multiprocess
def test_one_generator_one_fragment_ahead_reproduces_single_process_ppo(ray_local):
    # queue_size=1: the generator starts a fragment only once the learner took the last one, so every
    # fragment is drawn by the learner's current policy: synchronous PPO, computed in two processes
    run = RunConfig(env="CartPole-v1", seed=3, vec="sync", quiet=True, total_steps=6 * 32)
    remote = pipeline_trainer(ray_local, run, queue_size=1)
    remote.train()
    single = OnPolicyTrainer(run, CFG)
    single.train()
    assert remote.steps == single.steps == 192 and remote.policy_version == 6
    stats = remote.collector.stats
    assert stats.lag_count == 6 and stats.lag_min == stats.lag_max == 0.0  # every fragment drawn by the current policy
    torch.testing.assert_close(remote.agent.params.data, single.agent.params.data, rtol=0, atol=1e-6)
    remote.close()
    single.close()


@pytest.mark.multiprocess
def test_a_killed_generator_is_replaced_and_ppo_goes_on(ray_local):
    run = RunConfig(env="CartPole-v1", seed=0, vec="sync", quiet=True, total_steps=10**9)
    trainer = pipeline_trainer(ray_local, run, workers=2)
    trainer.train(stop_at=4 * 32)
    pid = ray_local.get(trainer.collector.pool.actors[0].pid.remote(), timeout=60)
    os.kill(pid, signal.SIGKILL)
    trainer.train(stop_at=trainer.steps + 20 * 32)
    summary = trainer.collector.finish()
    trainer.close()
    assert summary["generator_restarts"] == 1 and trainer.events[0].split(" ", 2)[2].startswith("generator 0 died")
    assert (
        summary["fragments_generated"]
        == summary["fragments_added"]
        == (
            summary["fragments_retired"]
            + summary["fragments_evicted"]
            + summary["fragments_dropped_for_lag"]
            + summary["fragments_left_in_buffer"]
        )
    )
    assert summary["policy_lag_max"] <= StrategyConfig().max_policy_lag


@pytest.mark.multiprocess
def test_an_env_error_in_a_generator_names_it_and_aborts_when_asked(ray_local):
    run = RunConfig(env="distrl_testenvs:ExplodingEnv", seed=0, vec="sync", quiet=True, total_steps=10**9)
    trainer = pipeline_trainer(
        ray_local, run, cfg=PPOConfig(n_envs=1, n_steps=4, batch_size=4), workers=2, on_worker_error="abort"
    )
    with pytest.raises(GeneratorFailed) as err:
        trainer.train()
    trainer.close()
    message = str(err.value)
    assert message.startswith("generator ") and "env distrl_testenvs:ExplodingEnv" in message
    assert "boom from ExplodingEnv" in message


@pytest.mark.slow
@pytest.mark.multiprocess
def test_async_ppo_with_two_generators_solves_cartpole(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "ppo",
            "cartpole",
            "--strategy",
            "pipeline",
            "--workers",
            "2",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    s = json.loads((run_dir / "summary.json").read_text())
    assert s["strategy"] == "pipeline" and s["final_eval_mean_return"] >= 475
    # every env step the generators took is counted once: in total_steps, or drained after the last update
    assert s["fragments_generated"] * 32 * 16 == s["total_steps"] + s["drained_steps"]
    assert s["fragments_trained"] == s["learner_steps"] == s["iterations"]
    episodes = (run_dir / "monitor.csv").read_text().strip().splitlines()[2:]
    assert len(episodes) == s["episodes"]
    assert 0 <= s["policy_lag_mean"] <= s["policy_lag_max"] <= 4
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    logged = EventAccumulator(str(run_dir)).Reload().Tags()["scalars"]
    assert {"pipeline/policy_lag", "pipeline/queue_depth", "time/overhead_s"} <= set(logged)


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_a_generator_that_keeps_failing_ends_the_run_after_max_worker_restarts(ray_local):
    run = RunConfig(env="distrl_testenvs:ExplodingEnv", seed=0, vec="sync", quiet=True, total_steps=10**9)
    trainer = pipeline_trainer(ray_local, run, cfg=PPOConfig(n_envs=1, n_steps=4, batch_size=4), max_worker_restarts=1)
    with pytest.raises(GeneratorFailed, match=r"generator 0 failed 2 times \(max_worker_restarts=1\); last: raised "):
        trainer.train()
    assert (
        trainer.events[0].split(" ", 2)[2].startswith("generator 0 raised worker 0, env distrl_testenvs:ExplodingEnv")
    )
    trainer.close()
