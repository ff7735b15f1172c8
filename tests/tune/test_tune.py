"""distrl tune: search spaces and preset files checked like flags, a study on CartPole that writes its
database, results and a best preset that trains to the best trial's return, crashed and interrupted
trials, and trials as Ray tasks."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

optuna = pytest.importorskip("optuna")

from distrl.cli import main  # noqa: E402
from distrl.config import ConfigError  # noqa: E402
from distrl.tune.budget import fit_space, trial_steps  # noqa: E402
from distrl.tune.space import build_space  # noqa: E402
from distrl.tune.trial import LOG_FILE, RESULT_FILE  # noqa: E402

TESTS = Path(__file__).parents[1]
States = optuna.trial.TrialState

# A small space on distrl's CartPole preset (32 envs x 16 steps): studies of a few seconds a trial.
SPACE = {
    "learning_rate": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True},
    "n_epochs": [2, 10],
    "n_steps": 16,
    "net_arch": [[32], "small"],
}


def _write(path: Path, data) -> Path:
    path.write_text(json.dumps(data))
    return path


def _tune(tmp_path: Path, *flags: str, space: dict = SPACE, trials: int = 4, budget: int = 12_288) -> list[str]:
    return [
        "tune",
        "ppo",
        "CartPole-v1",
        "--trials",
        str(trials),
        "--budget-steps",
        str(budget),
        "--study-dir",
        str(tmp_path / "study"),
        "--space",
        str(_write(tmp_path / "space.json", space)),
        "--no-default-space",
        "--evaluations",
        "3",
        "--eval-episodes",
        "5",
        *flags,
    ]


def _study(tmp_path: Path, name: str = "ppo-CartPole-v1"):
    return optuna.load_study(study_name=name, storage=f"sqlite:///{tmp_path / 'study' / 'study.db'}")


# ---- search spaces and preset files ----


def test_a_space_file_changes_the_default_space_and_maps_parameters_to_fields(tmp_path):
    space = build_space(
        "ppo",
        str(
            _write(
                tmp_path / "s.json",
                {
                    "gamma": [0.9, 0.99],
                    "n_envs": 4,
                    "net_arch": [[32, 16], "tiny"],
                    "one_minus_gae_lambda": {"type": "float", "low": 0.01, "high": 0.2, "log": True},
                },
            )
        ),
    )
    assert "one_minus_gamma" not in space.distributions  # gamma in the file replaces the zoo's one_minus_gamma
    assert space.fixed == {"n_envs": 4}
    assert {"learning_rate", "n_epochs", "gamma", "net_arch"} <= set(space.distributions)  # the rest stays
    values = space.values({"gamma": 0.99, "one_minus_gae_lambda": 0.05, "net_arch": "32x16", "learning_rate": 1e-3})
    assert values == {
        "n_envs": 4,
        "gamma": 0.99,
        "gae_lambda": pytest.approx(0.95),
        "net_arch": (32, 16),
        "learning_rate": 1e-3,
    }
    assert build_space("sac").values({"train_freq": 8})["gradient_steps"] == 8  # the zoo ties them
    only = build_space("ppo", str(_write(tmp_path / "o.json", {"n_epochs": [1, 2]})), defaults=False)
    assert set(only.distributions) == {"n_epochs"}


@pytest.mark.parametrize(
    "space, message",
    [
        ({"n_epoch": [1, 2]}, "'n_epoch' is not a ppo field"),
        ({"learning_rate": {"type": "float", "low": 1e-3}}, "{'type': 'float', 'low': 0.001} is not a valid range"),
        ({"learning_rate": {"type": "beta", "low": 0, "high": 1}}, "type must be float, int or categorical"),
        ({"one_minus_gamma": {"type": "float", "low": 0.5, "high": 2.0}}, "one_minus_ ranges must lie in (0, 1)"),
        ({"n_epochs": "ten"}, "n_epochs='ten' is not allowed: must be an integer"),
        ({"net_arch": [[64, -1]]}, "net_arch choice [64, -1] must be one of tiny"),
        ({"gradient_steps": {"same_as": "train_freq"}}, "'gradient_steps' is not a ppo field"),
    ],
)
def test_a_bad_space_file_is_one_line_naming_the_parameter(tmp_path, space, message):
    with pytest.raises(ConfigError) as err:
        build_space("ppo", str(_write(tmp_path / "s.json", space)))
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "preset, message",
    [
        ({"n_epoch": 3}, "n_epoch=3 is not a PPOConfig field"),
        ({"n_epochs": "ten"}, "n_epochs='ten' is not allowed: must be an integer"),
        ({"net_arch": [64, "a"]}, "net_arch=[64, 'a'] is not allowed: must be a list of integers"),
        ({"n_epochs": 0}, "n_epochs=0 is not allowed: must be > 0"),
        ({"algo": "sac", "batch_size": 64}, "is for algo='sac': this run trains ppo"),
        ({"total_steps": 1.5}, "total_steps=1.5 is not allowed: must be an integer"),
        ("[1, 2", "cannot be read"),
    ],
)
def test_a_bad_preset_file_is_one_line_exit_2_and_starts_nothing(tmp_path, capsys, preset, message):
    path = tmp_path / "p.json"
    path.write_text(preset if isinstance(preset, str) else json.dumps(preset))
    assert main(["train", "ppo", "CartPole-v1", "--preset", str(path), "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "run").exists()


def test_a_preset_file_sets_the_run_as_its_values_say_and_flags_still_win(tmp_path):
    path = _write(
        tmp_path / "p.json",
        {
            "algo": "ppo",
            "env": "CartPole-v1",
            "comment": "hand-written",
            "n_envs": 4,
            "n_steps": 32,
            "batch_size": 64,
            "net_arch": [32],
            "learning_rate": 1e-3,
            "total_steps": 256,
        },
    )
    run = tmp_path / "run"
    assert (
        main(
            ["train", "ppo", "CartPole-v1", "--preset", str(path), "--n-epochs", "3", "--run-dir", str(run), "--quiet"]
        )
        == 0
    )
    config = json.loads((run / "config.json").read_text())
    assert (config["ppo"]["n_envs"], config["ppo"]["n_steps"], config["ppo"]["net_arch"]) == (4, 32, [32])
    assert (config["ppo"]["learning_rate"], config["ppo"]["n_epochs"]) == (1e-3, 3)
    assert config["run"]["total_steps"] == 256 and config["run"]["preset"] == str(path)


# ---- studies ----


def test_the_space_keeps_only_what_a_trial_can_train_within_its_budget(tmp_path):
    sac = fit_space("sac", build_space("sac"), {}, budget=20_000, evaluations=5)
    assert sac.distributions["train_freq"].choices == (1, 4, 8, 16, 32, 64, 128, 256, 512)  # all <= 4000
    assert sac.distributions["learning_starts"].choices == (0, 1000)  # 10000 would leave under half to learn
    ppo = fit_space("ppo", build_space("ppo"), {"n_envs": 8}, budget=12_000, evaluations=5)
    assert ppo.distributions["n_steps"].choices == (32, 64, 128, 256)  # 8 x 256 <= 12000 / 5 < 8 x 512
    ranged = build_space(
        "ppo",
        str(_write(tmp_path / "s.json", {"n_steps": {"type": "int", "low": 16, "high": 4096, "step": 16}})),
        defaults=False,
    )
    narrowed = fit_space("ppo", ranged, {"n_envs": 8}, budget=12_000, evaluations=5).distributions["n_steps"]
    assert (narrowed.low, narrowed.high, narrowed.step) == (16, 288, 16)  # the last step with 8 x n_steps <= 2400
    assert trial_steps("ppo", {"n_envs": 8, "n_steps": 256}, 12_000, 5) == 10_240  # whole rollouts, not past
    assert trial_steps("sac", {"train_freq": 64}, 1000, 5) == 960
    dqn = fit_space("dqn", build_space("dqn"), {}, budget=20_000, evaluations=5)
    assert dqn.distributions["train_freq"].choices == (1, 4, 8, 16, 128, 256, 1000)  # all <= 4000
    assert dqn.distributions["learning_starts"].choices == (0, 1000, 5000)  # 10000 would leave under half
    assert build_space("dqn").values({"train_freq": 16})["gradient_steps"] == 16
    assert trial_steps("reinforce", {"episodes_per_iter": 8}, 1000, 5) == 1000  # episodes: known as they end
    with pytest.raises(ConfigError, match=r"n_steps=256 × n_envs=16 = 4096 steps is not allowed with budget_steps="):
        trial_steps("ppo", {"n_envs": 16, "n_steps": 256}, 12_000, 5)  # a space sampling n_envs can combine these


@pytest.mark.parametrize(
    "algo, space, budget, message",
    [
        ("ppo", None, 5000, "budget_steps=5000 is not allowed: must be >= 5120, one rollout (n_steps=32 × n_envs=32"),
        ("sac", {"learning_starts": 1000}, 1500, "budget_steps=1500 is not allowed: must be >= 2001, more than twice"),
    ],
)
def test_a_budget_no_trial_can_keep_is_refused_with_the_smallest_one(tmp_path, capsys, algo, space, budget, message):
    env = "CartPole-v1" if algo == "ppo" else "Pendulum-v1"
    flags = ["tune", algo, env, "--budget-steps", str(budget), "--study-dir", str(tmp_path / "study")]
    if space is not None:
        flags += ["--space", str(_write(tmp_path / "space.json", space))]
    assert main(flags) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "study").exists()  # refused before anything started


@pytest.mark.multiprocess
def test_every_trial_trains_within_the_budget(tmp_path):
    # 32 envs x (16, 64 or 256) steps a rollout: 256 cannot give each of 2 evaluations a rollout of 5000 / 2
    space = {**SPACE, "n_steps": [16, 64, 256]}
    flags = ["--evaluations", "2", "--pruner", "none", "--parallel", "2", "--eval-episodes", "2"]
    assert main(_tune(tmp_path, *flags, space=space, trials=2, budget=5000)) == 0
    trials = _study(tmp_path).get_trials()
    assert all(t.distributions["n_steps"].choices == (16, 64) for t in trials)
    for t in trials:
        run = Path(t.user_attrs["run_dir"])
        steps = json.loads((run / "summary.json").read_text())["total_steps"]
        rollout = 32 * t.params["n_steps"]
        assert 5000 - rollout < steps <= 5000 and steps % rollout == 0, (t.params, steps)
        assert json.loads((run / "preset.json").read_text())["total_steps"] == steps == t.user_attrs["steps"]


@pytest.mark.multiprocess
def test_a_study_writes_its_database_results_and_a_best_preset_that_reproduces_the_best_trial(tmp_path, capsys):
    assert main(_tune(tmp_path, "--parallel", "2", "--startup-trials", "2")) == 0
    out = capsys.readouterr().out
    study = _study(tmp_path)
    trials = study.get_trials()
    assert len(trials) == 4 and all(t.state in (States.COMPLETE, States.PRUNED) for t in trials)
    complete = [t for t in trials if t.state == States.COMPLETE]
    best = max(complete, key=lambda t: t.value)
    for t in trials:  # each trial is an ordinary run directory
        run = Path(t.user_attrs["run_dir"])
        summary = json.loads((run / "summary.json").read_text())
        assert (run / "monitor.csv").exists() and (run / "model").is_dir()
        if t.state == States.COMPLETE:
            assert summary["final_eval_mean_return"] == t.value and summary["total_steps"] == 12_288  # 24 rollouts
        else:  # pruned at an evaluation before the end of the budget
            assert t.intermediate_values and summary["total_steps"] < 12_288
    d = tmp_path / "study"
    preset = json.loads((d / "best.json").read_text())
    assert preset["total_steps"] == 12_288 and preset["algo"] == "ppo" and preset["n_steps"] == 16
    assert preset["learning_rate"] == best.params["learning_rate"] and preset["n_epochs"] == best.params["n_epochs"]
    assert preset["n_envs"] == 32  # the base preset's values come with it
    table = (d / "top_trials.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| rank")]
    assert [float(r.split("|")[3]) for r in rows] == sorted((t.value for t in complete), reverse=True)
    for plot in ("history.png", "importances.png"):
        assert (d / plot).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert f"best: trial {best.number}" in out
    # The best preset trained again (same seed) reaches the best trial's return.
    again = tmp_path / "again"
    assert (
        main(
            [
                "train",
                "ppo",
                "CartPole-v1",
                "--preset",
                str(d / "best.json"),
                "--run-dir",
                str(again),
                "--quiet",
                "--eval-episodes",
                "5",
            ]
        )
        == 0
    )
    summary = json.loads((again / "summary.json").read_text())
    std = json.loads((Path(best.user_attrs["run_dir"]) / "summary.json").read_text())["final_eval_std_return"]
    assert abs(summary["final_eval_mean_return"] - best.value) <= std + 1e-6


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_a_crashing_trial_is_recorded_failed_with_its_error_and_the_study_goes_on(tmp_path, capsys):
    # Every trial's network factory raises: each is recorded as failed, with the error, and the next starts.
    flags = ["--policy", "distrl_tunecrash:crashing_policy", "--trials", "2"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run(
        [sys.executable, "-m", "distrl", *_tune(tmp_path, *flags)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr
    trials = _study(tmp_path).get_trials()
    assert [t.state for t in trials] == [States.FAIL, States.FAIL]
    for t in trials:
        error = t.user_attrs["error"]  # the trial's one line: the factory, the exception, its message
        assert "policy='distrl_tunecrash:crashing_policy' raised RuntimeError" in error, t.user_attrs
        assert "factory fails" in error, t.user_attrs
    assert "no trial of study 'ppo-CartPole-v1' completed" in proc.stderr
    # Sampled values the config refuses fail at once, without a process, and the study goes on.
    capsys.readouterr()
    refused = {**SPACE, "batch_size": [100]}  # not a divisor of 32 x 16
    (tmp_path / "b").mkdir()
    assert main(_tune(tmp_path / "b", *["--trials", "2"], space=refused)) == 1
    trials = _study(tmp_path / "b").get_trials()
    assert [t.state for t in trials] == [States.FAIL, States.FAIL]
    assert all("batch_size=100 is not allowed" in t.user_attrs["error"] for t in trials)


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_killed_study_resumes_without_losing_or_repeating_a_trial(tmp_path):
    args = [sys.executable, "-m", "distrl", *_tune(tmp_path, "--pruner", "none", budget=40_960)]
    first = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    trials_dir = tmp_path / "study" / "trials"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # kill it once a trial has finished and the next one's process has it
        time.sleep(0.05)  # files only: a trial trains for seconds, so one seen running is still running
        if (trials_dir / "trial-0000" / RESULT_FILE).exists() and any(
            (d / LOG_FILE).exists() and not (d / RESULT_FILE).exists() for d in trials_dir.iterdir()
        ):
            break
    else:
        first.kill()
        pytest.fail("the study did not get under way")
    first.send_signal(signal.SIGKILL)
    first.wait(30)
    before = {t.number: t for t in _study(tmp_path).get_trials()}
    finished = {n: t.value for n, t in before.items() if t.state == States.COMPLETE}
    interrupted = [t for t in before.values() if t.state == States.RUNNING]
    assert finished and len(interrupted) == 1
    trial_dir = Path(interrupted[0].user_attrs["run_dir"])
    deadline = time.monotonic() + 10  # its trial process ends with the tune command
    while time.monotonic() < deadline and "this trial stops" not in (trial_dir / "trial.log").read_text():
        time.sleep(0.2)
    assert "the tune command ended; this trial stops" in (trial_dir / "trial.log").read_text()
    stamps = {n: (Path(before[n].user_attrs["run_dir"]) / "summary.json").stat().st_mtime_ns for n in finished}

    again = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{len(finished)} of 4 trials done, 1 interrupted trial(s) to run again" in again.stdout
    after = _study(tmp_path).get_trials()
    assert {t.number: t.value for t in after if t.number in finished} == finished  # kept, not run again
    assert all(
        (Path(before[n].user_attrs["run_dir"]) / "summary.json").stat().st_mtime_ns == stamps[n] for n in finished
    )
    lost = after[interrupted[0].number]
    assert lost.state == States.FAIL and lost.user_attrs["interrupted"]
    retry = [t for t in after if t.user_attrs.get("retry_of") == lost.number]
    assert len(retry) == 1 and retry[0].params == lost.params and retry[0].state == States.COMPLETE
    counted = [t for t in after if t.state == States.COMPLETE]
    assert len(counted) == 4  # four trials, none twice


@pytest.mark.multiprocess
@pytest.mark.slow  # the Ray runner; the process runner is what the default run proves
def test_trials_run_as_ray_tasks(tmp_path, capsys):
    pytest.importorskip("ray")
    assert main(_tune(tmp_path, "--engine", "ray", "--parallel", "2", "--trials", "2", "--pruner", "none")) == 0
    trials = _study(tmp_path).get_trials()
    assert [t.state for t in trials] == [States.COMPLETE, States.COMPLETE]
    for t in trials:
        summary = json.loads((Path(t.user_attrs["run_dir"]) / "summary.json").read_text())
        assert summary["final_eval_mean_return"] == t.value
    assert (tmp_path / "study" / "best.json").exists()


def test_a_study_name_reused_for_another_budget_is_refused(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path / 'shared.db'}"
    study = optuna.create_study(storage=storage, study_name="s", direction="maximize")
    study.set_user_attr("distrl", {"algo": "ppo", "env": "CartPole-v1", "budget_steps": 5})
    assert main(_tune(tmp_path, "--storage", storage, "--study", "s")) == 2
    assert "budget_steps=12288 differs from study 's'" in capsys.readouterr().err


# ---- offline algorithms ----


@pytest.fixture
def cartpole_dataset(tmp_path):
    """A CartPole dataset of random play, in tmp_path/datasets."""
    from distrl.data.minari_store import write_dataset
    from distrl.data.recorder import record_episodes
    from distrl.envs.vector import make_env

    env = make_env("CartPole-v1", 2)
    try:
        episodes = record_episodes(env, None, 600, seed=0, random=True)
        spaces = env.single_observation_space, env.single_action_space
        write_dataset("cartpole/random-v0", episodes, "CartPole-v1", *spaces, "random", str(tmp_path / "datasets"))
    finally:
        env.close()
    return tmp_path / "datasets"


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_an_offline_study_trains_every_trial_on_the_dataset_for_its_gradient_steps(tmp_path, cartpole_dataset):
    space = {"learning_rate": {"type": "float", "low": 1e-4, "high": 3e-3, "log": True}, "net_arch": [[32]]}
    flags = ["tune", "bc", "CartPole-v1", "--dataset", "cartpole/random-v0", "--datasets-dir", str(cartpole_dataset)]
    flags += ["--trials", "2", "--budget-steps", "60", "--evaluations", "2", "--eval-episodes", "2", "--parallel", "2"]
    flags += ["--study-dir", str(tmp_path / "study"), "--no-default-space", "--pruner", "none"]
    flags += ["--space", str(_write(tmp_path / "space.json", space))]
    assert main(flags) == 0
    trials = _study(tmp_path, "bc-CartPole-v1").get_trials()
    assert len(trials) == 2 and all(t.state == States.COMPLETE for t in trials)
    for t in trials:
        run = Path(t.user_attrs["run_dir"])
        preset = json.loads((run / "preset.json").read_text())
        assert preset["dataset"] == "cartpole/random-v0" and preset["datasets_dir"] == str(cartpole_dataset)
        assert json.loads((run / "summary.json").read_text())["total_steps"] == 60  # gradient steps
        assert json.loads((run / "config.json").read_text())["bc"]["learning_rate"] == t.params["learning_rate"]
    best = json.loads((tmp_path / "study" / "best.json").read_text())
    assert best["dataset"] == "cartpole/random-v0" and best["total_steps"] == 60


@pytest.mark.parametrize(
    "argv, says",
    [
        (["tune", "bc", "CartPole-v1"], "dataset='' is not allowed: every bc trial trains on a dataset"),
        (["tune", "ppo", "CartPole-v1", "--dataset", "cartpole/random-v0"], "dataset='cartpole/random-v0' is not "),
        (["tune", "iql", "Pendulum-v1", "--dataset", "cartpole/random-v0"], "has observation_space Box"),
        (["tune", "bc", "CartPole-v1", "--dataset", "cartpole/none-v0"], "dataset='cartpole/none-v0' is not in"),
        (
            ["tune", "cql", "CartPole-v1", "--dataset", "cartpole/random-v0", "--scheduler", "pbt"],
            "scheduler='pbt' is not available for cql",
        ),
    ],
)
def test_offline_study_mistakes_are_one_line_and_start_nothing(tmp_path, cartpole_dataset, capsys, argv, says):
    assert main([*argv, "--datasets-dir", str(cartpole_dataset), "--study-dir", str(tmp_path / "study")]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "study").exists()


@pytest.mark.parametrize("algo", ["bc", "td3bc", "iql", "cql"])
def test_an_offline_default_space_samples_configs_the_algorithm_takes(algo):
    from distrl.config import ALGO_CONFIGS

    space = build_space(algo)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(20):
        values = space.values(study.ask(space.distributions).params)
        cfg = ALGO_CONFIGS[algo](**values)  # refuses a value out of its range
        assert 0 < cfg.learning_rate <= 3e-3 and cfg.batch_size in (64, 128, 256, 512)
        if algo != "bc":
            assert 0.95 <= cfg.gamma < 1
