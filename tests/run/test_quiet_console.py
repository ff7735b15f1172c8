"""The console keeps distrl's own lines: other libraries' warnings go to the run's log and ALE's banner is
not printed, unless --debug."""

import os
import subprocess
import sys

import pytest


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "distrl", *args], capture_output=True, text=True, timeout=300, check=False
    )


@pytest.mark.parametrize("debug", [False, True])
def test_library_warnings_go_to_the_run_log_unless_debug(tmp_path, debug):
    run_dir = tmp_path / "run"
    flags = ["--total-steps", "64", "--n-envs", "1", "--n-steps", "64", "--batch-size", "64", "--n-epochs", "1"]
    flags += ["--wrapper", "distrl_testenvs:WarnsWhileStepping", "--eval-episodes", "1", "--run-dir", str(run_dir)]
    done = cli("train", "ppo", "CartPole-v1", *flags, *(["--debug"] if debug else []))
    assert done.returncode == 0, done.stderr
    log = run_dir / "warnings.log"
    if debug:
        assert "WarnsWhileStepping is deprecated" in done.stderr and not log.exists()
    else:
        assert "WarnsWhileStepping is deprecated" not in done.stderr
        assert "FutureWarning: distrl_testenvs.WarnsWhileStepping is deprecated" in log.read_text()


@pytest.mark.parametrize("debug", [False, True])
def test_ale_banner_only_with_debug(debug):
    pytest.importorskip("ale_py")
    code = "from distrl.envs.vector import make_single_env; make_single_env('ALE/Pong-v5', {}, ()).close()"
    env = {"DISTRL_DEBUG": "1"} if debug else {}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )
    assert done.returncode == 0, done.stderr
    assert ("Powered by Stella" in done.stdout + done.stderr) == debug
