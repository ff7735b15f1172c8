"""An env without a preset gets the fallback its spaces call for (``--preset auto``); an env with a preset keeps it,
``--preset none`` keeps the library defaults, flags win over a fallback, and the run's first line says which."""

import dataclasses
import json

import numpy as np
import pytest
from gymnasium import spaces

from distrl.cli import main
from distrl.config import DQNConfig, PPOConfig
from distrl.training.fallbacks import FALLBACKS, choose_fallback
from distrl.training.presets import PRESETS, algo_configs

SMALL_CONTROL = FALLBACKS["dqn"][0]
VECTOR = spaces.Box(-1.0, 1.0, (2,), np.float32)


def test_the_small_control_fallback_is_a_valid_dqn_config_unlike_the_library_defaults():
    cfg = DQNConfig(**SMALL_CONTROL.values)
    assert SMALL_CONTROL.name == "small-control" and "total_steps" not in SMALL_CONTROL.values
    assert (cfg.learning_rate, cfg.buffer_size, cfg.target_update_interval) == (6.3e-4, 50_000, 250)
    assert (DQNConfig().learning_rate, DQNConfig().target_update_interval) == (1e-4, 10_000)


@pytest.mark.parametrize(
    "observation_space, action_space, fallback, words",
    [
        (VECTOR, spaces.Discrete(3), "small-control", "2-feature vector observations, 3 actions"),
        (spaces.Box(-1.0, 1.0, (64,), np.float32), spaces.Discrete(16), "small-control", "64-feature"),
        (spaces.Box(0, 255, (84, 84, 3), np.uint8), spaces.Discrete(4), None, "image observations, 4 actions"),
        (spaces.Box(0, 255, (128,), np.uint8), spaces.Discrete(4), None, "128-feature vector observations"),
        (VECTOR, spaces.Discrete(17), None, "17 actions"),
        (spaces.Box(-1.0, 1.0, (4, 4), np.float32), spaces.Discrete(3), None, "Box observations of shape (4, 4)"),
        (spaces.Discrete(16), spaces.Discrete(4), None, "Discrete observations, 4 actions"),
        (spaces.Dict({"x": VECTOR}), spaces.Discrete(3), None, "Dict observations"),
        (VECTOR, spaces.Box(-1.0, 1.0, (1,), np.float32), None, "Box actions"),
    ],
)
def test_dqn_falls_back_to_small_control_for_small_vectors_and_few_actions_only(
    observation_space, action_space, fallback, words
):
    choice = choose_fallback("dqn", observation_space, action_space)
    assert (choice.fallback.name if choice.fallback else None) == fallback
    assert words in choice.spaces
    assert choice.values == (dict(SMALL_CONTROL.values) if fallback else {})


def test_an_algorithm_without_fallbacks_keeps_its_defaults_whatever_the_spaces():
    assert choose_fallback("ppo", VECTOR, spaces.Discrete(3)).fallback is None
    run, cfg, name = algo_configs("ppo", "acrobot")
    assert name == "none" and cfg == PPOConfig()


def test_auto_gives_a_vector_env_without_a_preset_the_fallback_and_params_win_over_it():
    assert "Acrobot-v1" not in PRESETS["dqn"]
    _, cfg, name = algo_configs("dqn", "acrobot")
    assert name == "small-control" and cfg == DQNConfig(**SMALL_CONTROL.values)
    _, cfg, name = algo_configs("dqn", "acrobot", params={"learning_rate": 1e-3})
    assert name == "small-control" and cfg == DQNConfig(**{**SMALL_CONTROL.values, "learning_rate": 1e-3})


def test_an_image_env_a_preset_none_and_fallback_false_keep_the_library_defaults():
    _, cfg, name = algo_configs("dqn", "distrl_spaceenvs:QuadrantEnv")  # uint8 images, 4 actions
    assert name == "none" and cfg == DQNConfig()
    _, cfg, name = algo_configs("dqn", "acrobot", "none")
    assert name == "none" and cfg == DQNConfig()
    _, cfg, name = algo_configs("dqn", "acrobot", fallback=False)
    assert name == "none" and cfg == DQNConfig()


def test_an_env_with_a_preset_keeps_it():
    _, cfg, name = algo_configs("dqn", "lunarlander")
    preset = {k: v for k, v in PRESETS["dqn"]["LunarLander-v3"].items() if k != "total_steps"}
    assert name == "LunarLander-v3" and cfg == DQNConfig(**preset)
    assert cfg.learning_starts == 0 and cfg.gradient_steps == -1  # the preset's, not the fallback's 1,000 and 8


def test_the_fallback_reads_the_env_as_its_wrappers_and_kwargs_leave_it():
    # QuadrantEnv with a wrapper that flattens its image to 100 uint8 features: still no small-control vector
    run = {"wrappers": ("gymnasium.wrappers:FlattenObservation",)}
    _, cfg, name = algo_configs("dqn", "distrl_spaceenvs:QuadrantEnv", run=run)
    assert name == "none" and cfg == DQNConfig()
    # the same env, 4x4: 16 features
    run = {"wrappers": ("gymnasium.wrappers:FlattenObservation",), "env_kwargs": ("size=4",)}
    _, cfg, name = algo_configs("dqn", "distrl_spaceenvs:QuadrantEnv", run=run)
    assert name == "small-control" and cfg.net_arch == (256, 256)


def _train(tmp_path, *args):
    run_dir = tmp_path / "run"
    fast = ["--total-steps", "48", "--learning-starts", "16", "--eval-episodes", "1", "--run-dir", str(run_dir)]
    code = main(["train", "dqn", *args, *fast])
    return code, json.loads((run_dir / "config.json").read_text())["dqn"]


def test_the_first_line_names_the_fallback_and_why_and_flags_win_over_it(tmp_path, capsys):
    code, recorded = _train(tmp_path, "mountaincar", "--learning-rate", "1e-3")
    lines = capsys.readouterr().err.splitlines()
    assert code == 0
    assert (
        lines[0]
        == "preset: none for MountainCar-v0; fallback: small-control (2-feature vector observations, 3 actions)"
    )
    expected = dataclasses.asdict(DQNConfig(**{**SMALL_CONTROL.values, "learning_rate": 1e-3, "learning_starts": 16}))
    assert recorded == json.loads(json.dumps(expected))


@pytest.mark.parametrize(
    "args, learning_rate",
    [
        (["mountaincar", "--preset", "none"], DQNConfig().learning_rate),
        (["cartpole"], PRESETS["dqn"]["CartPole-v1"]["learning_rate"]),
        (["mountaincar", "--quiet"], SMALL_CONTROL.values["learning_rate"]),
    ],
)
def test_no_first_line_with_a_preset_with_preset_none_or_quiet(tmp_path, capsys, args, learning_rate):
    code, recorded = _train(tmp_path, *args)
    assert code == 0 and recorded["learning_rate"] == learning_rate
    assert "preset: none" not in capsys.readouterr().err


def test_an_image_env_is_told_that_it_keeps_the_library_defaults(tmp_path, capsys):
    code, recorded = _train(tmp_path, "distrl_spaceenvs:QuadrantEnv", "--buffer-size", "64")
    assert code == 0 and recorded["learning_rate"] == DQNConfig().learning_rate
    assert capsys.readouterr().err.splitlines()[0] == (
        "preset: none for distrl_spaceenvs:QuadrantEnv; fallback: none, library defaults "
        "(image observations, 4 actions)"
    )


def test_help_says_that_an_env_without_a_preset_gets_a_fallback(capsys):
    # (that --help and a refused flag load no simulator for such an env: tests/cli/test_cli.py's no-import test)
    with pytest.raises(SystemExit) as shown:
        main(["train", "dqn", "acrobot", "--help"])
    assert shown.value.code == 0 and "fallback chosen from its spaces" in capsys.readouterr().out


GAME = "pettingzoo.classic.tictactoe_v3"


def test_self_play_on_a_game_without_a_preset_gets_the_self_play_settings_and_says_so(tmp_path, capsys):
    """--self-play alone gets the settings that lost 3-4.5% to the random player (docs/results.md), not PPO's
    single-env defaults; flags still win, and the run's first line names the preset."""
    import distrl.cli.start as start

    started = []
    run_dir = tmp_path / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(start, "start_run", lambda algo, run, strategy, cfg, *rest: started.append((run, cfg)) or 0)
        assert main(["train", "ppo", GAME, "--self-play", "--n-steps", "32", "--run-dir", str(run_dir)]) == 0
        assert main(["train", "ppo", GAME, "--run-dir", str(run_dir)]) == 0
    (run, cfg), (plain_run, plain_cfg) = started
    preset = PRESETS["ppo"]["self-play"]
    assert (cfg.n_envs, cfg.batch_size, cfg.ent_coef, cfg.lr_schedule) == (8, 128, 0.01, "linear")
    assert cfg.n_steps == 32  # the flag over the preset
    assert (run.total_steps, run.random_opponent_share) == (preset["total_steps"], preset["random_opponent_share"])
    assert (plain_cfg.n_envs, plain_cfg.n_steps, plain_run.random_opponent_share) == (1, 2048, 0.0)

    code = main(["train", "ppo", GAME, "--self-play", "--total-steps", "512", "--eval-episodes", "1",
                 "--run-dir", str(tmp_path / "real")])  # fmt: skip
    assert code == 0
    first = capsys.readouterr().err.splitlines()[0]
    assert first == f"preset: self-play for {GAME} (--self-play on a game without a preset of its own)"
