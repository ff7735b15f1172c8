"""--vec envpool: next-step autoreset, whole-game statistics, seeding, errors, and training on it."""

import json

import numpy as np
import pytest

from distrl.config import ConfigError, RunConfig
from distrl.envs.vector import VecEnv, make_env, make_run_env
from distrl.run.logs import read_monitor

envpool = pytest.importorskip("envpool")
pytest.importorskip("ale_py")

from distrl.envs.envpool import ATARI_DEFAULTS, EnvPoolVector  # noqa: E402 - after the skips

BREAKOUT_TRAINING = {**ATARI_DEFAULTS, "episodic_life": True, "reward_clip": True}


def test_envpool_atari_steps_as_vecenv_expects_and_counts_whole_unclipped_games():
    n_envs, seed = 2, 3
    env = make_env("breakout", n_envs, vec="envpool")
    assert isinstance(env.env, EnvPoolVector)
    # an independent pool with the same settings, stepped with the same actions; this test keeps its own count
    raw = envpool.make("Breakout-v5", env_type="gymnasium", num_envs=n_envs, seed=seed, **BREAKOUT_TRAINING)
    obs = env.reset(seed=seed)
    raw_obs, _ = raw.reset()
    np.testing.assert_array_equal(obs, raw_obs)
    rng = np.random.default_rng(0)
    score, steps = np.zeros(n_envs), np.zeros(n_envs, dtype=int)
    expected = [[] for _ in range(n_envs)]
    counted = [[] for _ in range(n_envs)]
    ended_before = np.zeros(n_envs, dtype=bool)
    lives_lost = 0
    for _ in range(700):
        actions = rng.integers(0, 4, n_envs)
        step = env.step(actions)
        raw_obs, _, _, truncated, info = raw.step(actions)
        np.testing.assert_array_equal(step.obs, raw_obs)
        # the step after an end is the reset step: not trained on, no reward, no flags
        np.testing.assert_array_equal(step.valid, ~ended_before)
        assert not step.reward[ended_before].any() and not step.terminated[ended_before].any()
        assert set(step.reward.tolist()) <= {0.0, 1.0}  # the learner's rewards are clipped
        score += info["reward"]  # unclipped; 0 on reset steps
        steps += ~ended_before
        for i in np.flatnonzero(info["terminated"].astype(bool) | truncated):
            expected[i].append((score[i], steps[i]))
            score[i], steps[i] = 0.0, 0
        ends = np.flatnonzero(step.episode_ends) if step.episode_ends is not None else []
        for i, ret, length in zip(ends, step.episode_returns, step.episode_lengths):
            counted[i].append((ret, length))
        lives_lost += int(step.terminated.sum())
        ended_before = step.terminated | step.truncated
    games = sum(len(g) for g in expected)
    assert games >= 4 and lives_lost > games  # a lost life ends an episode, not the game
    assert counted == expected
    assert max(ret for g in counted for ret, _ in g) > 0
    env.close()
    raw.close()


def test_a_seed_makes_the_same_trajectories_and_another_seed_other_ones():
    def trajectory(env, seed):
        frames = [env.reset(seed=seed)]
        rng = np.random.default_rng(0)
        frames += [env.step(rng.integers(0, 4, 2)).obs for _ in range(150)]
        return np.stack(frames)

    env = make_env("breakout", 2, vec="envpool")
    first = trajectory(env, 7)
    np.testing.assert_array_equal(first, trajectory(env, 7))  # a seed restarts the random streams of this pool
    np.testing.assert_array_equal(first, trajectory(make_env("breakout", 2, vec="envpool"), 7))
    assert not np.array_equal(first, trajectory(env, 8))
    env.close()


def test_envpool_runs_its_other_tasks_with_vecenv_episode_accounting():
    env = make_env("CartPole-v1", 4, vec="envpool")
    env.reset(seed=0)
    ends, ended_before, lengths = 0, np.zeros(4, dtype=bool), np.zeros(4, dtype=int)
    for _ in range(200):
        step = env.step(np.zeros(4, dtype=np.int64))  # always left: episodes of about 10 steps
        lengths += step.valid
        done = step.terminated | step.truncated
        np.testing.assert_array_equal(step.episode_lengths, lengths[done])
        np.testing.assert_array_equal(step.episode_returns, lengths[done].astype(float))  # reward 1 per step
        lengths[done] = 0
        ends += int(done.sum())
        assert not step.valid[ended_before].any()
        ended_before = done
    assert ends >= 40
    env.close()


@pytest.mark.parametrize(
    "ask, message",
    [
        ({"wrappers": ("distrl_testenvs:double_reward",)}, "vec='envpool' cannot apply wrappers"),
        ({"atari_wrappers": False}, "preprocesses Atari games itself"),
        ({"env_kwargs": {"frameskip": 1}}, "env_kwargs=.*frameskip=1.* is not accepted by envpool's Breakout-v5"),
    ],
)
def test_what_envpool_cannot_do_is_a_one_line_error(ask, message):
    with pytest.raises(ConfigError, match=message):
        make_env("breakout", 2, vec="envpool", **ask)


def test_a_task_envpool_does_not_have_is_named():
    assert "Taxi-v4" not in envpool.list_all_envs()
    with pytest.raises(ConfigError, match="vec='envpool' has no task 'Taxi-v4'"):
        make_env("Taxi-v4", 2, vec="envpool")


def test_ppo_trains_on_envpool_and_evaluates_on_gymnasium(tmp_path):
    from distrl.cli import main

    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "ppo",
            "breakout",
            "--vec",
            "envpool",
            "--total-steps",
            "1024",
            "--n-envs",
            "4",
            "--n-steps",
            "128",
            "--batch-size",
            "128",
            "--n-epochs",
            "1",
            "--eval-episodes",
            "1",
            "--run-dir",
            str(run_dir),
            "--quiet",
        ]
    )
    assert code == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] == 1024 and summary["final_eval_mean_return"] >= 0
    games = read_monitor(run_dir / "monitor.csv")
    assert len(games["l"]) > 0 and games["l"].min() > 20  # whole games, not single lives
    run = RunConfig(env="ALE/Breakout-v5", vec="envpool")
    training, evaluation = make_run_env(run, 2), make_run_env(run, 1, evaluation=True)
    assert isinstance(training.env, EnvPoolVector) and not isinstance(evaluation.env, EnvPoolVector)
    assert evaluation.single_observation_space == training.single_observation_space
    assert isinstance(training, VecEnv)
    training.close()
    evaluation.close()
