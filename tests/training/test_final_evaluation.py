"""The evaluation at a run's end: episode progress, a cap on its steps scaled to the run, and an end line that
says what it did, how long it took and which flags change it."""

import json
import re
import time
from functools import partial

import gymnasium as gym
import numpy as np
import pytest

from distrl.cli import main
from distrl.config import ConfigError, PPOConfig, RunConfig
from distrl.envs.evaluation import run_episodes
from distrl.envs.vector import VecEnv, make_run_env
from distrl.training.on_policy import OnPolicyTrainer
from distrl_testenvs import CountEnv

SMALL = PPOConfig(n_envs=4, n_steps=32, batch_size=64, n_epochs=1)


def lean_on_the_pole(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Push towards where the pole leans: CartPole episodes of unequal lengths, the same on every run."""
    return (obs[:, 2] > 0).astype(np.int64)


def test_an_evaluation_stops_at_its_cap_with_exactly_the_episodes_that_ended_before_it():
    env = make_run_env(RunConfig(env="CartPole-v1"), 10, evaluation=True)
    try:
        whole = run_episodes(lean_on_the_pole, env, seed=5)
        lengths = whole.returns  # CartPole pays 1 per step
        assert whole.finished == 10 and not whole.capped and len(set(lengths)) > 3
        cutoff = int(np.sort(lengths)[3])  # the vector step the fourth shortest episode ends on
        seen: list[tuple[int, int]] = []
        capped = run_episodes(lean_on_the_pole, env, seed=5, max_steps=10 * cutoff, progress=lambda *a: seen.append(a))
    finally:
        env.close()
    ended = lengths <= cutoff
    assert capped.capped and capped.finished == ended.sum() < 10 and capped.steps_taken == 10 * cutoff
    np.testing.assert_array_equal(capped.returns, lengths[ended])  # env order, as an uncapped evaluation
    assert capped.steps == lengths[ended].sum() and capped.cut_steps == (10 - capped.finished) * cutoff
    assert len(seen) == cutoff and seen[-1] == (capped.finished, capped.steps + capped.cut_steps)
    assert [s for _, s in seen] == [np.minimum(lengths, k).sum() for k in range(1, cutoff + 1)]
    assert whole.steps == lengths.sum() < whole.steps_taken == 10 * lengths.max() and whole.cut_steps == 0
    assert "evaluation stopped at the cap of" in capped.account() and "--eval-max-steps" in capped.account()
    assert capped.headline().startswith(f"eval return {lengths[ended].mean():.1f} ± ")
    assert capped.headline().endswith(f"over {capped.finished} of 10 episodes")


def count_envs(*lengths: int) -> VecEnv:
    """Environments whose episodes last ``lengths`` steps, one each (reward 1 a step)."""
    return VecEnv(gym.vector.SyncVectorEnv([partial(CountEnv, n) for n in lengths]), "count")


def test_an_evaluation_counts_the_steps_of_its_episodes_and_apart_those_of_the_episodes_the_cap_cut():
    env = count_envs(2, 3, 5)
    try:
        seen: list[tuple[int, int]] = []
        whole = run_episodes(lambda obs, starts: np.zeros(3, np.int64), env, seed=0, progress=lambda *a: seen.append(a))
        # three vector steps of nine cap it: the episodes of 2 and 3 steps finish, the third has played 3 of 5
        capped = run_episodes(lambda obs, starts: np.zeros(3, np.int64), env, seed=0, max_steps=9)
    finally:
        env.close()
    np.testing.assert_array_equal(whole.returns, [2, 3, 5])
    # 2 + 3 + 5 steps; the first two environments step on with the third: 5 vector steps of 3
    assert (whole.steps, whole.cut_steps, whole.steps_taken) == (10, 0, 15)
    assert seen == [(0, 3), (1, 6), (2, 8), (2, 9), (3, 10)]  # a step for each episode still under way
    assert "10 env steps (--eval-episodes)" in whole.account()
    np.testing.assert_array_equal(capped.returns, [2, 3])
    assert (capped.steps, capped.cut_steps, capped.steps_taken) == (5, 3, 9)
    assert capped.account().endswith(
        "9 env steps taken: 2 of 3 episodes finished, 5 env steps; 1 cut by the cap, 3 env steps (--eval-episodes)"
    )


def test_the_default_cap_follows_the_runs_length_with_a_floor_and_bad_values_are_one_line_errors():
    assert RunConfig(total_steps=512).eval_step_cap == 2_000
    assert RunConfig(total_steps=50_000).eval_step_cap == 100_000
    assert RunConfig(total_steps=512, eval_max_steps=300).eval_step_cap == 300
    assert RunConfig(eval_max_steps=0).eval_step_cap == 0  # no cap
    with pytest.raises(ConfigError, match=r"eval_max_steps=-5 is not allowed: must be >= 0"):
        RunConfig(eval_max_steps=-5)


def test_a_bad_cap_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["train", "ppo", "cartpole", "--eval-max-steps", "-1", "--run-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert "eval_max_steps=-1 is not allowed: must be >= 0" in err and err.count("\n") == 1


def test_a_run_whose_evaluation_would_pass_the_cap_stops_there_and_says_so(tmp_path, capsys):
    run_dir = tmp_path / "run"
    flags = ["--total-steps", "256", "--n-envs", "4", "--n-steps", "32", "--batch-size", "64", "--n-epochs", "1"]
    assert main(["train", "ppo", "cartpole", *flags, "--eval-max-steps", "30", "--run-dir", str(run_dir)]) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    # ten envs step together: three vector steps make the cap; no CartPole episode ends within three steps
    assert summary["final_eval_steps_taken"] == 30 and summary["final_eval_max_steps"] == 30
    assert summary["final_eval_steps"] == 0 and summary["final_eval_cut_steps"] == 30  # all in cut episodes
    assert summary["final_eval_episodes"] == 10 and summary["final_eval_finished"] == 0
    assert summary["final_eval_mean_return"] is None and summary["final_eval_s"] >= 0
    err = capsys.readouterr().err.splitlines()
    assert "eval at 256 steps: no episode finished (0 of 10 episodes: stopped at the cap of 30 steps)" in err
    (end,) = [line for line in err if line.startswith("done:")]
    assert "; no eval return (no episode finished); run dir " in end
    assert re.search(r"evaluation stopped at the cap of 30 steps \(--eval-max-steps, 0: none\) after [\d.]+s", end)
    assert end.endswith(
        "30 env steps taken: 0 of 10 episodes finished, 0 env steps; 10 cut by the cap, 30 env steps (--eval-episodes)"
    )


def test_the_final_evaluation_shows_its_episodes_as_they_end_and_the_end_line_its_time(tmp_path, capsys):
    run = RunConfig(env="CartPole-v1", total_steps=256, seed=0, vec="sync", eval_episodes=4, run_dir=str(tmp_path))
    trainer = OnPolicyTrainer(run, SMALL, run_dir=tmp_path)
    assert trainer.console is not None
    trainer.console.every_s = 0.0  # every step's progress, where a terminal-less run prints one every 5 s
    summary = trainer.run_to_end(None, time.perf_counter())
    err = capsys.readouterr().err.splitlines()
    progress = [re.fullmatch(r"eval at 256 steps: episodes (\d)/4  ([\d,]+) env steps", line) for line in err]
    counts = [(int(m[1]), int(m[2].replace(",", ""))) for m in progress if m]
    assert counts and counts[-1] == (4, summary["final_eval_steps"]) and summary["final_eval_finished"] == 4
    # each vector step adds a step for every episode still under way
    assert [b - a for (_, a), (_, b) in zip([(0, 0), *counts], counts)] == [4 - k for k, _ in [(0, 0), *counts[:-1]]]
    assert [k for k, _ in counts] == sorted(k for k, _ in counts)  # episodes only ever add up
    assert summary["final_eval_steps"] == 4 * summary["final_eval_mean_return"]  # CartPole pays 1 a step
    (end,) = [line for line in err if line.startswith("done:")]
    took = rf"evaluation: 4 episodes in [\d.]+s, {summary['final_eval_steps']:,} env steps \(--eval-episodes\)$"
    assert re.search(rf"; eval return [\d.]+ ± [\d.]+; run dir {re.escape(str(tmp_path))}; {took}", end), end
