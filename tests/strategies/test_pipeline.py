"""pipeline: generators → scorer → versioned replay → learner on Ray; GRPO on the numeric bandit task."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from grpo_hooks import train_bandit

from distrl.config import StrategyConfig
from distrl.strategies.actors import RayActors
from distrl.training.group import train_grpo
from distrl.training.presets import algo_configs

pytestmark = pytest.mark.multiprocess


def adds_up(summary, unit="slice"):
    """Every generated slice (fragment) was retired after training, evicted, dropped for lag, or is left."""
    s = {k.replace(unit, "slice"): v for k, v in summary.items()}
    return s["slices_generated"] == s["slices_added"] == (
        s["slices_retired"] + s["slices_evicted"] + s["slices_dropped_for_lag"] + s["slices_left_in_buffer"]
    ) and (s["slices_trained"] + s["slices_never_trained"] == s["slices_added"])


def test_synchronous_grpo_learns_the_bandit_to_90_percent_of_optimal():
    run, cfg, _ = algo_configs("grpo", "bandit", run={"quiet": True})
    assert train_grpo(run, cfg, None)["eval_reward"] >= 0.9  # random: 0.125


def test_a_grpo_run_stops_once_the_recent_mean_reward_reaches_the_target():
    run, cfg, _ = algo_configs("grpo", "bandit", run={"quiet": True, "target_return": 0.6})
    s = train_grpo(run, cfg, None)
    assert s["learner_steps"] == s["target_reached_step"] < cfg.learner_steps
    assert s["reward_last"] >= 0.6 and s["target_reached_train_s"] == s["train_s"]


@pytest.mark.slow
def test_pipeline_learns_the_bandit_and_accounts_for_every_slice(ray_local):
    summary = train_bandit(RayActors(ray_local), StrategyConfig(strategy="pipeline", workers=2))
    assert summary["eval_reward"] >= 0.9
    assert summary["learner_steps"] == 600 and adds_up(summary)
    assert 0 <= summary["policy_lag_min"] <= summary["policy_lag_mean"] <= summary["policy_lag_max"] <= 4


def test_a_killed_generator_is_restarted_and_the_run_completes(ray_local):
    def kill_at_step(source, version):
        if version == 20:
            os.kill(ray_local.get(source.pool.actors[0].pid.remote(), timeout=60), signal.SIGKILL)

    summary = train_bandit(
        RayActors(ray_local), StrategyConfig(strategy="pipeline", workers=2), kill_at_step, learner_steps=80
    )
    assert summary["learner_steps"] == 80 and summary["generator_restarts"] == 1
    assert summary["events"][0].split(" ", 2)[2].startswith("generator 0 died") and adds_up(summary)


def test_a_slow_learner_keeps_queue_and_buffer_bounded(ray_local):
    strategy = StrategyConfig(strategy="pipeline", workers=2, queue_size=3, buffer_capacity=6)
    summary = train_bandit(
        RayActors(ray_local),
        strategy,
        lambda source, version: time.sleep(0.1),
        learner_steps=25,
        slices_per_step=2,
        slices_per_call=1,
    )
    assert summary["queue_depth_max"] <= 3 and summary["buffer_max"] <= 6
    # the generators run at the learner's pace: never more than queue_size slices ahead of it
    assert summary["slices_generated"] <= 25 * 2 + 3 and adds_up(summary)


# the command line runs grpo under the pipeline in the default run too (test_matrix)
@pytest.mark.slow
def test_command_line_pipeline_writes_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "grpo",
            "toy",
            "--strategy",
            "pipeline",
            "--workers",
            "2",
            "--learner-steps",
            "40",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["strategy"] == "pipeline" and summary["workers"] == 2 and summary["learner_steps"] == 40
    assert adds_up(summary) and (run_dir / "model" / "tensors.safetensors").is_file()
    bad = subprocess.run(
        [sys.executable, "-m", "distrl", "train", "sac", "pendulum", "--strategy", "pipeline"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "strategy='pipeline' is not available for sac" in bad.stderr


@pytest.mark.heavy
def test_a_stalled_scorer_ends_the_run_naming_the_starved_stage(ray_local):
    from distrl.strategies.pool import PipelineStalled

    stopped = []

    def stop_scorer(source, version):
        if version == 5:
            stopped.append((ray_local.get(source.scorer.pid.remote(), timeout=60), time.monotonic()))
            os.kill(stopped[0][0], signal.SIGSTOP)  # alive but silent: generators wait on it, nothing is scored

    strategy = StrategyConfig(strategy="pipeline", workers=2, starve_timeout_s=3)
    try:
        with pytest.raises(PipelineStalled, match=r"no data for 3 s: the generators and scorer did not answer"):
            train_bandit(RayActors(ray_local), strategy, stop_scorer, learner_steps=100_000)
        waited = time.monotonic() - stopped[0][1]
    finally:
        os.kill(stopped[0][0], signal.SIGCONT)
    assert 3 <= waited < 30  # the starve timeout, not the 120 s call timeout


class _SilentEngine:
    """An actor engine whose requests answer after ``gaps`` seconds in turn, then never: what the starve
    timeout sees, without processes."""

    def __init__(self, gaps):
        self.gaps, self.waited = list(gaps), []

    def call(self, actor, method, *args):
        return (actor, method, time.perf_counter())

    def wait(self, pending, timeout, first=False):
        self.waited.append(timeout)
        if not self.gaps or timeout == 0:
            return []
        time.sleep(self.gaps.pop(0))
        return pending[:1]

    def result(self, pending, timeout):
        return "fragment"


def test_the_starve_timeout_stretches_to_ten_times_the_longest_wait_a_slowed_machine_showed():
    from distrl.strategies.pool import GeneratorPool, PipelineStalled

    engine = _SilentEngine([2.0, 0.05, 0.3])
    strategy = StrategyConfig(strategy="pipeline", workers=1, starve_timeout_s=1)
    pool = GeneratorPool(engine, 1, lambda i, restarts: f"actor-{i}", engine.call, strategy, print)
    pool.submit(0, lambda: None)
    for _ in range(3):  # the actors' start (2 s, not counted), then waits of 0.05 and 0.3 s
        pool.wait_any("generators", 0, 0)
    assert 0.3 <= pool.longest_wait < 1.0
    with pytest.raises(PipelineStalled, match=r"no data for [3-9] s"):  # 10 x the 0.3 s wait, beyond the 1 s floor
        pool.wait_any("generators", 2, 0)
    assert engine.waited[-1] == pytest.approx(10 * pool.longest_wait)


def test_actors_not_started_within_the_timeout_are_named():
    from distrl.strategies.pool import GeneratorPool, PipelineStalled

    class HalfStarted(_SilentEngine):
        def wait(self, pending, timeout, first=False):
            self.waited.append(timeout)
            return [p for p in pending if p[0] in ("actor-0", "scorer")]  # actor 1 and the holder never answer

    engine = HalfStarted([])
    strategy = StrategyConfig(strategy="pipeline", workers=2, timeout_s=7)
    pool = GeneratorPool(engine, 2, lambda i, restarts: f"actor-{i}", engine.call, strategy, print)
    with pytest.raises(PipelineStalled, match=r"^generator 1, replay holder did not start within 7 s$"):
        pool.ready({"scorer": "scorer", "replay holder": "holder"})
    assert engine.waited == [7]


def test_an_actor_that_failed_to_start_ends_the_run_named_in_one_line():
    from distrl.strategies.actors import ActorDied
    from distrl.strategies.pool import GeneratorFailed, GeneratorPool

    class ScorerDied(_SilentEngine):
        def wait(self, pending, timeout, first=False):
            return list(pending)

        def result(self, pending, timeout):
            if pending[0] == "scorer":
                raise ActorDied("ActorDiedError, its start raised ImportError: no module named 'x'\nTraceback ...")
            return "where"

    engine = ScorerDied([])
    strategy = StrategyConfig(strategy="pipeline", workers=2)
    pool = GeneratorPool(engine, 2, lambda i, restarts: f"actor-{i}", engine.call, strategy, print)
    expected = r"^scorer failed to start: ActorDiedError, its start raised ImportError: no module named 'x'$"
    with pytest.raises(GeneratorFailed, match=expected):
        pool.ready({"scorer": "scorer"})
    assert pool.ready({"scorer": "scorer"}, check=False) >= 0  # left to the first call
