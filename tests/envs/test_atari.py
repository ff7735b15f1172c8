import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode

from distrl.envs.atari import wrap_game
from distrl.envs.names import resolve_env_id
from distrl.envs.vector import OneEnv, VecEnv, make_env
from distrl.training.presets import algo_configs
from distrl_testenvs import FakeAle

pytest.importorskip("ale_py")


def _vec(training, n_envs):
    if n_envs == 1:
        return VecEnv(OneEnv(wrap_game(FakeAle(), training)), "fake")
    fns = [lambda: wrap_game(FakeAle(), training)] * n_envs
    return VecEnv(gym.vector.SyncVectorEnv(fns, autoreset_mode=AutoresetMode.NEXT_STEP), "fake")


@pytest.mark.parametrize("n_envs", [1, 2])
def test_a_lost_life_terminates_the_episode_but_the_monitor_counts_whole_games_unclipped(n_envs):
    env = _vec(training=True, n_envs=n_envs)
    obs = env.reset(seed=0)
    assert obs.shape == (n_envs, 4, 84, 84) and obs.dtype == np.uint8
    rewards, terminated, games = [], [], []
    for _ in range(12):
        step = env.step(np.zeros(n_envs, np.int64))
        rewards.append(float(step.reward[0]))
        terminated.append(bool(step.terminated[0]))
        games.extend(zip(step.episode_returns.tolist(), step.episode_lengths.tolist()))
    # reset + FIRE, 2; learner steps 3, 4 (life lost: terminated); the reset step's no-op + FIRE, 5-7; step 8
    # (terminated); no-op + FIRE 9-11; step 12: the last life lost, game over; a real reset and FIRE follow
    assert terminated[:9] == [False, True, False, True, False, True, False, False, True]
    assert set(rewards) == {0.0, 1.0}  # clipped for the learner (0 on the reset steps)
    # the game: 12 steps (the 3 lives' 4 steps) of reward 3, counted once, when the game is over
    assert games[:n_envs] == [(36.0, 12)] * n_envs
    env.close()


def test_evaluation_envs_have_no_episodic_life_and_no_clipping():
    env = _vec(training=False, n_envs=1)
    env.reset(seed=0)
    steps = [env.step(np.zeros(1, np.int64)) for _ in range(10)]
    # 12 game steps: 2 at reset (FIRE, then 2), 2 automatic FIREs after the first two lives, 8 of the agent's
    assert [bool(s.terminated[0]) for s in steps[:10]].index(True) == 7
    assert steps[0].reward[0] == 3.0 and steps[7].episode_returns.tolist() == [36.0]
    env.close()


def test_evaluation_presses_fire_after_a_lost_life_as_training_began_every_life():
    game = FakeAle(lives=3, life_steps=4)
    env = wrap_game(game, training=False)
    env.reset(seed=0)
    assert game.fires == 1
    for _ in range(2):  # the reset's FIRE and RIGHT took 2 of the first life's 4 steps: the life ends here
        env.step(0)
    assert game.fires == 2 and game.left == 2  # FIRE pressed for the second life
    training = FakeAle(lives=3, life_steps=4)
    train_env = wrap_game(training, training=True)
    train_env.reset(seed=0)
    for _ in range(2):
        train_env.step(0)
    assert training.fires == 1  # in training the lost life ends the episode; the next reset fires


def test_fire_on_reset_only_where_the_game_has_fire():
    game = FakeAle()
    wrap_game(game, training=True).reset(seed=0)
    assert game.fires == 1
    no_fire = FakeAle()
    no_fire.get_action_meanings = lambda: ["NOOP", "RIGHT", "LEFT"]
    wrap_game(no_fire, training=True).reset(seed=0)
    assert no_fire.fires == 0


def test_short_names_resolve_and_breakout_is_preprocessed():
    assert resolve_env_id("breakout") == "ALE/Breakout-v5" and resolve_env_id("pong") == "ALE/Pong-v5"
    env = make_env("breakout", 2, "sync")
    assert env.single_observation_space.shape == (4, 84, 84) and env.single_observation_space.dtype == np.uint8
    obs = env.reset(seed=0)
    assert obs.shape == (2, 4, 84, 84) and obs.dtype == np.uint8 and obs.any()
    env.close()
    raw = make_env("breakout", 1, atari_wrappers=False)
    assert raw.single_observation_space.shape == (210, 160, 3)
    raw.close()


def test_atari_ids_get_the_ppo_atari_preset():
    _, cfg, name = algo_configs("ppo", "pong")
    assert name == "atari" and (cfg.n_envs, cfg.n_steps, cfg.batch_size, cfg.n_epochs) == (8, 128, 256, 4)
    assert (cfg.learning_rate, cfg.clip_range, cfg.ent_coef) == (2.5e-4, 0.1, 0.01)
    assert cfg.net_arch == ()  # linear heads on the Nature CNN's features, as published


def test_ppo_trains_on_breakout_from_the_command_line_and_evaluates_whole_games(tmp_path):
    import json

    from safetensors import safe_open

    from distrl.cli import main

    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            "ppo",
            "breakout",
            "--total-steps",
            "256",
            "--n-envs",
            "2",
            "--n-steps",
            "64",
            "--batch-size",
            "64",
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
    assert summary["total_steps"] == 256 and summary["final_eval_mean_return"] >= 0  # a whole game ended
    with safe_open(str(run_dir / "model" / "tensors.safetensors"), "pt") as f:
        assert f.get_tensor("params/encoder.convs.0.weight").shape == (32, 4, 8, 8)  # the Nature CNN
        assert "params/policy.layers.1.weight" not in f.keys()  # one linear layer per head
