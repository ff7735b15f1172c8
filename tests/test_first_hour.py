"""What a new user meets in the first hour: the version, help that reads right, progress counted in what
bounds the run, one end line, a quiet console on Ray, errors in the user's own names."""

import dataclasses
import importlib.metadata
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import distrl
from distrl.cli import main
from distrl.cli.runs import EvalArgs, PlotArgs
from distrl.config import GRPOConfig, PPOConfig, REINFORCEConfig, RunConfig, SACConfig, StrategyConfig
from distrl.envs.names import SHORT_NAMES
from distrl.tune.study import TuneArgs

TESTS = Path(__file__).parent


def test_version_flag_and_attribute_agree_with_the_installed_package(capsys):
    assert main(["--version"]) == 0
    installed = importlib.metadata.version("distrl")
    assert capsys.readouterr().out.strip() == f"distrl {installed}"
    assert distrl.__version__ == installed


def test_top_level_help_lists_every_short_name(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert all(re.search(rf"\b{name}\b", out) for name in SHORT_NAMES), out


def _help(cls, field: str) -> str:
    from tyro._docstrings import get_field_docstring

    return get_field_docstring(cls, field, ())


@pytest.mark.parametrize(
    "cls", [RunConfig, StrategyConfig, PPOConfig, SACConfig, REINFORCEConfig, GRPOConfig, TuneArgs, EvalArgs, PlotArgs]
)
def test_every_help_text_flows_as_one_paragraph(cls):
    # tyro keeps a break before a line starting with anything but a letter: the help texts must join up
    for field in dataclasses.fields(cls):
        text = _help(cls, field.name)
        if text is not None:
            assert "\n" not in text, f"{cls.__name__}.{field.name}: {text!r}"


def test_help_describes_every_strategy_and_speaks_of_the_command_it_is_in():
    strategy = _help(StrategyConfig, "strategy")
    assert all(f"{name}:" in strategy for name in ("single", "ddp", "actor-learner", "decoupled", "pipeline"))
    workers = _help(StrategyConfig, "workers")
    assert "(ddp)" not in workers and all(word in workers for word in ("actor-learner", "pipeline", "decoupled"))
    run_fields = " ".join(_help(RunConfig, f.name) or "" for f in dataclasses.fields(RunConfig))
    assert "SAC" not in run_fields and "PPO" not in run_fields  # run options appear in every algorithm's help


def test_an_iteration_bounded_run_counts_iterations_and_ends_with_one_labelled_line(tmp_path, capsys):
    code = main(
        [
            "train",
            "reinforce",
            "cartpole",
            "--iterations",
            "3",
            "--episodes-per-iter",
            "4",
            "--eval-episodes",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    assert code == 0
    err = capsys.readouterr().err.splitlines()
    progress = [line for line in err if re.match(r"(steps|iterations) [\d,]+/", line)]
    assert progress and all(line.startswith("iterations ") and "/3 " in line for line in progress)
    ends = [line for line in err if line.startswith("done:")]
    assert len(ends) == 1 and not any("total time" in line for line in err)
    assert re.match(
        r"done: 3 iterations, [\d,]+ steps, 12 episodes in [\d.]+s training \([\d,]+ SPS\), "
        r"[\d.]+s total; eval return -?[\d.]+ ± [\d.]+; run dir ",
        ends[0],
    ), ends[0]


@pytest.mark.parametrize("algo", ["ppo", "sac"])
def test_iterations_are_refused_where_they_would_be_ignored(algo, tmp_path, capsys):
    assert (
        main(
            [
                "train",
                algo,
                "pendulum" if algo == "sac" else "cartpole",
                "--iterations",
                "3",
                "--run-dir",
                str(tmp_path / "run"),
            ]
        )
        == 2
    )
    assert f"iterations=3 is not allowed for {algo}: must be 0" in capsys.readouterr().err


def _in_a_terminal(args: list[str]) -> str:
    """Run ``distrl ARGS`` with a pseudo-terminal as stdout and stderr; its output without escape codes."""
    import pty

    main_fd, worker_fd = pty.openpty()
    env = dict(os.environ, COLUMNS="120", TERM="xterm", PYTHONPATH=str(TESTS))
    proc = subprocess.Popen(
        [sys.executable, "-m", "distrl", *args], stdout=worker_fd, stderr=worker_fd, stdin=subprocess.DEVNULL, env=env
    )
    os.close(worker_fd)
    chunks = []
    while True:
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    proc.wait(timeout=120)
    os.close(main_fd)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", b"".join(chunks).decode(errors="replace"))
    return "\n".join(line for line in re.split(r"[\r\n]+", text) if line.strip())


def test_in_a_terminal_the_bar_ends_on_the_real_count_above_the_summary(tmp_path):
    # 3 envs x 128 steps: the run passes 1,000 steps at 1,152
    out = _in_a_terminal(
        [
            "train",
            "ppo",
            "cartpole",
            "--total-steps",
            "1000",
            "--n-envs",
            "3",
            "--n-steps",
            "128",
            "--batch-size",
            "128",
            "--eval-episodes",
            "1",
            "--run-dir",
            str(tmp_path / "run"),
        ]
    )
    lines = out.splitlines()
    assert lines[-1].startswith("done: 1,152 steps"), out
    bars = [line for line in lines if line.startswith("steps ")]
    assert bars and re.search(r"\b1152/1152\b", bars[-1]), bars[-1]
    assert lines.index(bars[-1]) < len(lines) - 1


def test_learn_shows_progress_only_when_asked(capsys):
    from distrl import PPO

    model = PPO("CartPole-v1", n_envs=2, n_steps=64, batch_size=64, n_epochs=1)
    model.learn(256)
    assert capsys.readouterr().err == ""
    model.learn(256, progress_bar=True)
    err = capsys.readouterr().err
    assert re.search(r"^steps 512/512 ", err, re.M), err  # counted over the model's life, as num_steps
    model.close()


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_ray_start_up_chatter_goes_to_the_run_directory(tmp_path):
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
            "actor-learner",
            "--workers",
            "1",
            "--total-steps",
            "512",
            "--n-envs",
            "2",
            "--n-steps",
            "64",
            "--batch-size",
            "64",
            "--eval-episodes",
            "1",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == "" and result.stdout == ""  # --quiet and Ray's notices elsewhere: nothing at all
    assert (run_dir / "ray-start.log").is_file()  # what Ray printed while starting, if anything


def test_start_up_output_of_a_process_and_its_children_lands_in_the_file(tmp_path, capfd):
    from distrl.strategies.ray_engine import output_to

    log = tmp_path / "start.log"
    with output_to(log):
        os.write(1, b"from this process\n")  # what Ray's own code writes to the process's stdout
        subprocess.run([sys.executable, "-c", "import sys; print('from a child', file=sys.stderr)"], check=True)
    os.write(1, b"after\n")
    assert log.read_text().splitlines() == ["from this process", "from a child"]
    out, err = capfd.readouterr()
    assert out == "after\n" and err == ""
    with pytest.raises(RuntimeError), output_to(None):  # no file: a failure shows what was printed
        os.write(2, b"what went wrong\n")
        raise RuntimeError
    assert "what went wrong" in capfd.readouterr().err


def test_errors_about_a_custom_env_name_what_the_user_typed(tmp_path, capsys, monkeypatch):
    monkeypatch.syspath_prepend(str(TESTS))
    assert main(["train", "sac", "distrl_spaceenvs:SignsEnv", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert "env='distrl_spaceenvs:SignsEnv' has a MultiDiscrete action space" in err and "custom/" not in err


def test_one_pygame_distribution():
    # gymnasium's rendering extras pull pygame-ce; pygame itself would install over the same import
    requirements = [r.split(";")[0].strip() for r in importlib.metadata.requires("distrl") or []]
    assert not [r for r in requirements if re.match(r"pygame\b(?!-ce)", r)], requirements
    assert any(r.startswith("pygame-ce") for r in requirements)
