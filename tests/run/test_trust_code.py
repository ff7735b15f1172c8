"""Loading someone else's run imports nothing its config names (env entry point, wrappers, policy factory)
unless the user names it again or passes --trust-code / trust_code=True."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from distrl import PPO
from distrl.cli import main
from distrl.config import ConfigError
from distrl.run.checkpoint import STATE

TESTS = Path(__file__).parents[1]
# What a crafted config can name, field by field; each import of distrl_marker leaves the marker file.
NAMED = {
    "env": {"env": "distrl_marker:make_env"},
    "wrapper": {"wrappers": ["distrl_marker:wrap"]},
    "policy": {"policy": "distrl_marker:net"},
}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A small finished PPO run on a registered id, with a checkpoint to resume from."""
    run_dir = tmp_path_factory.mktemp("trust") / "run"
    code = main(
        [
            "train",
            "ppo",
            "CartPole-v1",
            "--total-steps",
            "128",
            "--n-envs",
            "2",
            "--n-steps",
            "32",
            "--batch-size",
            "64",
            "--n-epochs",
            "1",
            "--checkpoint-every",
            "64",
            "--eval-episodes",
            "1",
            "--run-dir",
            str(run_dir),
            "--quiet",
        ]
    )
    assert code == 0
    return run_dir


def craft(trained: Path, tmp_path: Path, run_fields: dict) -> Path:
    """A copy of the run's last periodic checkpoint whose config names what ``run_fields`` say."""
    source = sorted((trained / "checkpoints").glob("step-*"))[-1]
    target = tmp_path / "crafted" / "checkpoints" / source.name
    target.mkdir(parents=True)
    for file in source.iterdir():
        (target / file.name).write_bytes(file.read_bytes())
    state = json.loads((target / STATE).read_text())
    state["config"]["run"].update(run_fields)
    (target / STATE).write_text(json.dumps(state))
    return tmp_path / "crafted"


def cli(*args, marker: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, DISTRL_TEST_MARKER=str(marker), PYTHONPATH=str(TESTS))
    return subprocess.run(
        [sys.executable, "-m", "distrl", *args], capture_output=True, text=True, env=env, timeout=300, check=False
    )


@pytest.mark.parametrize("field", NAMED)
def test_eval_resume_and_load_refuse_a_run_that_names_code_and_import_nothing(trained, tmp_path, monkeypatch, field):
    crafted = craft(trained, tmp_path, NAMED[field])
    marker = tmp_path / "marker"
    monkeypatch.setenv("DISTRL_TEST_MARKER", str(marker))
    name = next(iter(NAMED[field].values()))
    name = name[0] if isinstance(name, list) else name

    with pytest.raises(ConfigError, match=rf"names code that loading it would import and run: .*{name}.*--trust-code"):
        PPO.load(crafted)
    assert main(["eval", str(crafted), "--episodes", "1"]) == 2
    assert main(["export", str(crafted)]) == 2 and not (crafted / "export").exists()
    assert main(["train", "ppo", "CartPole-v1", "--resume", str(crafted), "--total-steps", "192", "--quiet"]) == 2
    assert not marker.exists() and "distrl_marker" not in sys.modules

    # the flag is what decides: with it, the named module is imported (and here the marker appears)
    result = cli("eval", str(crafted), "--episodes", "1", "--trust-code", marker=marker)
    assert marker.exists(), result.stderr


def test_the_command_line_example_of_the_issue_runs_no_shell_command(trained, tmp_path, capsys):
    # in-process: the module the config names (subprocess) is imported already, so nothing is left behind
    marker = tmp_path / "marker"
    crafted = craft(trained, tmp_path, {"env": "subprocess:run", "env_kwargs": [f"args=touch {marker}", "shell=true"]})
    for command in (["eval", str(crafted)], ["train", "ppo", "CartPole-v1", "--resume", str(crafted)]):
        assert main(command) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and "env='subprocess:run'" in lines[0] and "--trust-code" in lines[0]
        assert not marker.exists()
    code = main(["eval", str(crafted), "--trust-code"])
    err = capsys.readouterr().err
    assert marker.exists(), err  # subprocess.run ran: exactly what the gate exists to prevent
    assert code == 2 and "not a gymnasium.Env" in err


def test_names_the_user_passes_again_need_no_flag(trained, tmp_path, monkeypatch):
    marker = tmp_path / "marker"
    crafted = craft(trained, tmp_path, NAMED["wrapper"])
    # the same wrapper passed again by the user is theirs: the resume goes ahead and imports it
    result = cli(
        "train",
        "ppo",
        "CartPole-v1",
        "--resume",
        str(crafted),
        "--wrapper",
        "distrl_marker:wrap",
        "--total-steps",
        "192",
        "--quiet",
        marker=marker,
    )
    assert result.returncode == 0, result.stderr
    assert marker.exists()
    # in Python, a replacement given to load is the user's too
    monkeypatch.setenv("DISTRL_TEST_MARKER", str(tmp_path / "unused"))
    model = PPO.load(craft(trained, tmp_path / "b", NAMED["env"]), env="CartPole-v1")
    model.close()


def test_a_run_on_a_registered_id_loads_with_no_flag(trained):
    model = PPO.load(trained)
    mean, _ = model.evaluate(1)
    model.close()
    assert mean > 0
    assert main(["eval", str(trained), "--episodes", "1"]) == 0
