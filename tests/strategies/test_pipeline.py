"""pipeline: generators → scorer → versioned replay → learner on Ray; the synchronous GRPO loop."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from distrl.config import GRPOConfig, RunConfig, StrategyConfig
from distrl.strategies.actors import RayActors
from distrl.training.group import run_synchronous

pytestmark = pytest.mark.multiprocess

RUN = RunConfig(algo="grpo", env="bandit", quiet=True)


def adds_up(summary, unit="slice"):
    """Every generated slice (fragment) was retired after training, evicted, dropped for lag, or is left."""
    s = {k.replace(unit, "slice"): v for k, v in summary.items()}
    return s["slices_generated"] == s["slices_added"] == (
        s["slices_retired"] + s["slices_evicted"] + s["slices_dropped_for_lag"] + s["slices_left_in_buffer"]) and (
        s["slices_trained"] + s["slices_never_trained"] == s["slices_added"])


def test_synchronous_grpo_learns_the_bandit_to_90_percent_of_optimal():
    from distrl.training.group import greedy_reward_fraction

    _, algo = run_synchronous("bandit", GRPOConfig(), RUN)
    assert greedy_reward_fraction("bandit", algo.policy, seed=0)["eval_reward"] >= 0.9  # random: 0.125


@pytest.mark.slow
def test_pipeline_learns_the_bandit_and_accounts_for_every_slice(ray_local):
    from distrl.strategies.pipeline import run_pipeline
    from distrl.training.group import greedy_reward_fraction

    summary, algo = run_pipeline("bandit", GRPOConfig(), RUN, StrategyConfig(strategy="pipeline", workers=2))
    assert greedy_reward_fraction("bandit", algo.policy, seed=0)["eval_reward"] >= 0.9
    assert summary["learner_steps"] == 600 and adds_up(summary)
    assert 0 <= summary["policy_lag_min"] <= summary["policy_lag_mean"] <= summary["policy_lag_max"] <= 4


def test_a_killed_generator_is_restarted_and_the_run_completes(ray_local):
    from distrl.strategies.pipeline import Pipeline

    cfg = GRPOConfig(learner_steps=80)
    pipeline = Pipeline(RayActors(ray_local), "bandit", cfg, RUN, StrategyConfig(strategy="pipeline", workers=2))
    pid = ray_local.get(pipeline.pool.actors[0].pid.remote(), timeout=60)

    def kill_at_step(version, metrics):
        if version == 20:
            os.kill(pid, signal.SIGKILL)

    try:
        summary = pipeline.train(kill_at_step)
    finally:
        pipeline.close()
    assert summary["learner_steps"] == 80 and summary["generator_restarts"] == 1
    assert summary["events"][0].startswith("generator 0 died") and adds_up(summary)


def test_a_slow_learner_keeps_queue_and_buffer_bounded(ray_local):
    from distrl.strategies.pipeline import Pipeline

    cfg = GRPOConfig(learner_steps=25, slices_per_step=2, slices_per_call=1)
    strategy = StrategyConfig(strategy="pipeline", workers=2, queue_size=3, buffer_capacity=6)
    pipeline = Pipeline(RayActors(ray_local), "bandit", cfg, RUN, strategy)
    try:
        summary = pipeline.train(lambda version, metrics: time.sleep(0.1))
    finally:
        pipeline.close()
    assert summary["queue_depth_max"] <= 3 and summary["buffer_max"] <= 6
    # the generators run at the learner's pace: never more than queue_size slices ahead of it
    assert summary["slices_generated"] <= 25 * 2 + 3 and adds_up(summary)


def test_command_line_pipeline_writes_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run([sys.executable, "-m", "distrl", "train", "grpo", "toy", "--strategy", "pipeline",
                             "--workers", "2", "--learner-steps", "40", "--quiet", "--run-dir", str(run_dir)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["strategy"] == "pipeline" and summary["workers"] == 2 and summary["learner_steps"] == 40
    assert adds_up(summary) and (run_dir / "model" / "tensors.safetensors").is_file()
    bad = subprocess.run([sys.executable, "-m", "distrl", "train", "sac", "pendulum", "--strategy", "pipeline"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "strategy='pipeline' is not available for sac" in bad.stderr


def test_a_stalled_scorer_ends_the_run_naming_the_starved_stage(ray_local):
    from distrl.strategies.pipeline import Pipeline
    from distrl.strategies.pool import PipelineStalled

    strategy = StrategyConfig(strategy="pipeline", workers=2, starve_timeout_s=3)
    pipeline = Pipeline(RayActors(ray_local), "bandit", GRPOConfig(learner_steps=100_000), RUN, strategy)
    pid = ray_local.get(pipeline.scorer.pid.remote(), timeout=60)
    stopped_at = []

    def stop_scorer(version, metrics):
        if version == 5:
            os.kill(pid, signal.SIGSTOP)  # alive but silent: generators wait on it, nothing is scored
            stopped_at.append(time.monotonic())

    try:
        with pytest.raises(PipelineStalled, match=r"no data for 3 s: the generators and scorer did not answer"):
            pipeline.train(stop_scorer)
        waited = time.monotonic() - stopped_at[0]
    finally:
        os.kill(pid, signal.SIGCONT)
        pipeline.close()
    assert 3 <= waited < 30  # the starve timeout, not the 120 s call timeout
