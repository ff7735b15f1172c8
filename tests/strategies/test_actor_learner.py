"""actor-learner on Ray: determinism, equivalence with single, fault tolerance, error reporting."""

import dataclasses
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from distrl.config import ConfigError, PPOConfig, REINFORCEConfig, RunConfig, StrategyConfig
from distrl.strategies.actor_learner import RemoteCollector, WorkerError
from distrl.strategies.actors import RayActors
from distrl.training import EpisodicTrainer, OnPolicyTrainer

pytestmark = pytest.mark.multiprocess


def al(workers=2, **kw):
    return StrategyConfig(strategy="actor-learner", workers=workers, **kw)


def reinforce_trainer(ray, env="CartPole-v1", strategy=None, seed=0, **cfg):
    strategy = strategy or al()
    run = RunConfig(algo="reinforce", env=env, seed=seed, vec="sync", quiet=True, total_steps=10**9)
    return EpisodicTrainer(
        run,
        REINFORCEConfig(n_envs=2, episodes_per_iter=8, **cfg),
        strategy=strategy,
        collector_factory=lambda t: RemoteCollector(t, strategy, RayActors(ray)),
    )


def run_iterations(trainer, n):
    for _ in range(n):
        trainer.train(stop_at=trainer.steps + 1)
    return trainer


def final_params(ray, seed=0):
    trainer = run_iterations(reinforce_trainer(ray, seed=seed), 3)
    trainer.close()  # frees the workers' CPUs for the next run
    assert trainer.policy_version == 3
    return trainer.agent.params.data.clone()


@pytest.mark.heavy
def test_two_runs_with_fixed_seeds_give_identical_learner_parameters(ray_local):
    a, b, c = final_params(ray_local), final_params(ray_local), final_params(ray_local, seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_ppo_with_two_workers_equals_single_process_on_the_same_envs(ray_local):
    cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=2, normalize_obs=True, normalize_reward=True)
    strategy = al()
    run = RunConfig(env="CartPole-v1", seed=3, vec="sync", quiet=True, total_steps=4 * 64)
    remote = OnPolicyTrainer(
        run, cfg, strategy=strategy, collector_factory=lambda t: RemoteCollector(t, strategy, RayActors(ray_local))
    )
    remote.train()
    single = OnPolicyTrainer(
        run, PPOConfig(n_envs=4, n_steps=16, batch_size=32, n_epochs=2, normalize_obs=True, normalize_reward=True)
    )
    single.train()
    assert remote.steps == single.steps == 256
    torch.testing.assert_close(remote.agent.params.data, single.agent.params.data, rtol=0, atol=1e-6)
    remote.close()
    single.close()


def test_a_killed_worker_is_restarted_and_the_run_completes(ray_local):
    trainer = run_iterations(reinforce_trainer(ray_local), 2)
    victim = trainer.collector.worker_pids()[1]
    os.kill(victim, signal.SIGKILL)
    run_iterations(trainer, 3)
    assert trainer.iteration == 5
    assert trainer.collector.restarts == [0, 1]
    assert any(re.search(r"worker 1 on node [0-9a-f]{8} failed at iteration 2: ", e) for e in trainer.events)
    assert trainer.collector.worker_pids()[1] != victim
    trainer.close()


def test_env_exception_names_worker_and_env_and_aborts_when_asked(ray_local):
    trainer = reinforce_trainer(ray_local, env="distrl_testenvs:ExplodingEnv", strategy=al(on_worker_error="abort"))
    with pytest.raises(WorkerError) as info:
        run_iterations(trainer, 2)
    message = str(info.value)
    assert "env distrl_testenvs:ExplodingEnv (global env indices" in message and "boom from ExplodingEnv" in message
    assert message.startswith("worker 0") or message.startswith("worker 1")
    assert "Traceback" in message
    trainer.close()


@pytest.mark.heavy
def test_env_exception_restarts_until_the_limit(ray_local):
    trainer = reinforce_trainer(ray_local, env="distrl_testenvs:ExplodingEnv", strategy=al(max_worker_restarts=1))
    with pytest.raises(WorkerError, match=r"worker \d failed 2 times \(max_worker_restarts=1\)"):
        run_iterations(trainer, 3)
    assert any("boom from ExplodingEnv" in e for e in trainer.events)
    trainer.close()


def test_a_worker_that_does_not_answer_in_time_is_named(ray_local):
    trainer = reinforce_trainer(ray_local, env="distrl_testenvs:SlowCartPole")  # 2 ms per step: 4 episodes take > 60 ms
    trainer.collector.strategy = dataclasses.replace(trainer.collector.strategy, timeout_s=0.02)
    with pytest.raises(WorkerError, match=r"rollout worker\(s\) \[0, 1\] did not return a batch within 0.02s"):
        run_iterations(trainer, 1)
    trainer.close()


@pytest.mark.parametrize("flush", [True, False])
def test_a_rollout_worker_takes_the_runs_cpu_settings(flush):
    from distrl.strategies.actor_learner import RolloutWorker, WorkerSpec

    torch.set_flush_denormal(not flush)
    try:
        run = RunConfig(algo="reinforce", env="CartPole-v1", flush_denormal=flush, threads=1)
        RolloutWorker(WorkerSpec("reinforce", run, REINFORCEConfig(n_envs=1), 0))
        assert ((torch.tensor([1e-39]) * 1.0).item() == 0.0) is flush  # 1e-39 is subnormal in float32
        assert torch.get_num_threads() == 1
    finally:
        torch.set_flush_denormal(False)  # torch's default


def test_missing_ray_names_the_extra(monkeypatch):
    from distrl.strategies.ray_engine import import_ray

    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(ConfigError, match=r"pip install 'distrl\[ray\]'"):
        import_ray()


def test_cli_actor_learner_reports_per_iteration_and_summary(tmp_path, ray_local, capsys):
    """The command line in this process, on the session's Ray instance (the embedded start is
    tests/strategies/test_ray_embedded.py's)."""
    from distrl.cli import main

    argv = ["train", "reinforce", "CartPole-v1", "--strategy", "actor-learner", "--workers", "2", "--iterations", "3"]
    run_dir = tmp_path / "run"
    assert main([*argv, "--episodes-per-iter", "10", "--run-dir", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    assert "iteration 3/3: mean reward" in err
    ends = [line for line in err.splitlines() if line.startswith("done:")]  # one end line, labelled
    assert len(ends) == 1 and ends[0].startswith("done: 3 iterations, ") and " 30 episodes in " in ends[0]
    assert "s training" in ends[0] and "s total" in ends[0] and out == ""
    import json

    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["iterations"] == 3 and summary["episodes"] == 30
    assert summary["episodes_per_s"] > 0 and summary["final_iteration_mean_return"] > 0


def test_unreachable_ray_address_is_exit_2(tmp_path):
    pytest.importorskip("ray")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "reinforce",
            "CartPole-v1",
            "--strategy",
            "actor-learner",
            "--workers",
            "2",
            "--ray-address",
            "127.0.0.1:1",
            "--iterations",
            "1",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("distrl: error: ray_address='127.0.0.1:1'")


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["reinforce", "ppo"])
def test_two_workers_solve_cartpole(tmp_path, algo):
    import json

    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            algo,
            "CartPole-v1",
            "--strategy",
            "actor-learner",
            "--workers",
            "2",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "summary.json").read_text())["final_eval_mean_return"] >= 475


def test_overheads_keep_flat_memory_an_exact_largest_and_a_sampled_median():
    """A run of any length keeps at most ``keep`` overheads: exact below that, a uniform sample above it."""
    import numpy as np

    from distrl.strategies.actors import Overheads

    short = Overheads(keep=100)
    for x in (0.003, 0.001, 0.002):
        short.add(x)
    assert short.summary() == {"overhead_ms_median": 2.0, "overhead_ms_max": 3.0}
    long = Overheads(keep=1000)
    values = np.random.default_rng(0).permutation(np.arange(100_000)) / 1e6  # 0 to 99.999 ms, median 50 ms
    for x in values:
        long.add(float(x))
    assert len(long.sample) == 1000 and long.count == 100_000
    summary = long.summary()
    assert summary["overhead_ms_max"] == pytest.approx(99.999)
    assert abs(summary["overhead_ms_median"] - 50.0) < 5.0  # a sample of 1,000: the median's error is about 1.6 ms
    assert Overheads().summary() == {}
