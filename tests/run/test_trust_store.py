"""A run this user trained on this machine loads the code its config names with no flag; the same run with
its config edited, or copied from elsewhere, is refused until `distrl trust RUN`, and every way out the
refusal names is a flag that exists."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from distrl import PPO
from distrl.cli import main
from distrl.config import ConfigError
from distrl.run import trust
from distrl.run.checkpoint import STATE

OWN_CODE = ["--wrapper", "distrl_testenvs:double_reward", "--policy", "distrl_spaceenvs:tiny_net"]


@pytest.fixture(scope="module")
def own_run(tmp_path_factory):
    """A finished run on CartPole with a wrapper and a policy factory of the user's, one periodic checkpoint."""
    run_dir = tmp_path_factory.mktemp("own") / "run"
    flags = ["--total-steps", "128", "--n-envs", "2", "--n-steps", "32", "--batch-size", "64", "--n-epochs", "1"]
    flags += ["--checkpoint-every", "64", "--eval-episodes", "1", "--run-dir", str(run_dir), "--quiet"]
    assert main(["train", "ppo", "CartPole-v1", *OWN_CODE, *flags]) == 0
    return run_dir


def edit_config(run: Path, **fields) -> None:
    for state_file in run.glob(f"**/{STATE}"):
        state = json.loads(state_file.read_text())
        state["config"]["run"].update(fields)
        state_file.write_text(json.dumps(state))


def test_a_run_written_here_loads_without_a_flag(own_run):
    store = json.loads(trust.store_path().read_text())
    assert str(own_run.resolve()) in store["runs"]  # recorded when its checkpoints were written
    assert main(["eval", str(own_run), "--episodes", "1"]) == 0
    PPO.load(own_run).close()


def test_an_edited_config_is_refused_until_trusted(own_run, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(own_run, run)
    assert main(["eval", str(run), "--episodes", "1"]) == 2  # the same files under another path: from elsewhere
    edited = tmp_path / "edited"
    shutil.copytree(own_run, edited)
    edit_config(edited, seed=99)
    trust.remember(edited / "model", {"algo": "ppo", "config": {}})  # another digest for it changes nothing
    with pytest.raises(ConfigError, match="distrl trust RUN"):
        PPO.load(edited)
    capsys.readouterr()
    assert main(["trust", str(edited)]) == 0
    said = capsys.readouterr().out
    assert "distrl_testenvs:double_reward" in said and "distrl_spaceenvs:tiny_net" in said
    assert main(["eval", str(edited), "--episodes", "1"]) == 0
    edit_config(edited, seed=100)  # changed after it was trusted: refused again
    assert main(["eval", str(edited), "--episodes", "1"]) == 2


def test_every_flag_the_refusal_names_is_accepted(own_run, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(own_run, copy)
    assert main(["eval", str(copy), "--episodes", "1"]) == 2
    message = capsys.readouterr().err.strip().splitlines()
    assert len(message) == 1
    suggested = set(re.findall(r"--[a-z-]+", message[0].split("pass that code yourself:")[1]))
    assert suggested == {"--wrapper", "--policy"}
    # the refusal's ways out, each taken: trust-code, and naming the code yourself (eval and resume)
    assert main(["eval", str(copy), "--episodes", "1", "--trust-code"]) == 0
    assert main(["eval", str(copy), "--episodes", "1", *OWN_CODE]) == 0
    resumed = ["train", "ppo", "CartPole-v1", "--resume", str(copy), *OWN_CODE, "--total-steps", "192", "--quiet"]
    assert main(resumed) == 0


def test_eval_env_kwargs_replace_the_runs(own_run, capsys):
    capsys.readouterr()
    assert main(["eval", str(own_run), "--episodes", "2", "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    # CartPole's sutton_barto_reward pays 0 per step and -1 at the end: the return turns non-positive
    assert main(["eval", str(own_run), "--episodes", "2", "--json", "--env-kwargs", "sutton_barto_reward=true"]) == 0
    changed = json.loads(capsys.readouterr().out)
    assert plain["mean_return"] > 0 >= changed["mean_return"]


def test_a_store_that_cannot_be_written_does_not_stop_a_run(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv(trust.STORE_ENV, str(blocker / "trusted.json"))
    run_dir = tmp_path / "run"
    flags = ["--total-steps", "64", "--n-envs", "1", "--n-steps", "64", "--batch-size", "64", "--n-epochs", "1"]
    assert (
        main(["train", "ppo", "CartPole-v1", *OWN_CODE, *flags, "--eval-episodes", "1", "--run-dir", str(run_dir)]) == 0
    )
    events = (run_dir / "events.log").read_text()
    assert "could not record the run" in events and "--trust-code" in events
    assert not os.path.exists(blocker / "trusted.json")
