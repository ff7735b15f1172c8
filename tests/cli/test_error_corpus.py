"""Every name or address a user passes that is not what it must be is one line naming the flag, exit 2,
before anything is written: a corpus of such mistakes, each run through the command line."""

import http.server
import re
import subprocess
import sys
import threading

import pytest

from distrl.cli import main

SMALL = ["--total-steps", "64", "--n-envs", "1", "--n-steps", "64", "--batch-size", "64", "--eval-episodes", "1"]
TUNE = ["--trials", "1", "--budget-steps", "6000"]

CORPUS = [
    # (command line, the flag the line must name)
    (["train", "ppo", "NotAnEnv-v0"], "env="),
    (["train", "ppo", "distrl_testenvs:NotAnEnv"], "env="),
    (["train", "ppo", "distrl_testenvs:returns_none"], "env="),
    (["train", "ppo", "nosuchmodule:Env"], "env="),
    (["train", "ppo", "distrl_testenvs:missing_attr"], "env="),
    (["train", "ppo", "os:getcwd"], "env="),
    (["train", "ppo", "CartPole-v1", "--wrapper", "distrl_testenvs:broken_wrapper"], "wrappers"),
    (["train", "ppo", "CartPole-v1", "--wrapper", "nosuch:wrap"], "wrappers"),
    (["train", "ppo", "CartPole-v1", "--wrapper", "distrl_testenvs:NotAnEnv"], "wrappers"),
    (["train", "ppo", "CartPole-v1", "--wrapper", "os:getcwd"], "wrappers"),
    (["train", "ppo", "CartPole-v1", "--wrapper", "notamodulepath"], "wrappers"),
    (["train", "ppo", "CartPole-v1", "--policy", "distrl_spaceenvs:not_a_module"], "policy="),
    (["train", "ppo", "CartPole-v1", "--policy", "distrl_spaceenvs:TinyNet"], "policy="),
    (["train", "ppo", "CartPole-v1", "--policy", "os:getcwd"], "policy="),
    (["train", "sac", "Pendulum-v1", "--policy", "os:getcwd"], "policy="),
    (["train", "ppo", "CartPole-v1", "--policy", "nosuch:net"], "policy="),
    (["train", "ppo", "CartPole-v1", "--env-kwargs", "nosuchkwarg=1"], "env_kwargs="),
    (["train", "ppo", "CartPole-v1", "--preset", "/nonexistent.json"], "preset="),
    (["train", "ppo", "CartPole-v1", "--run-dir", "/proc/distrl/run"], "run_dir="),
    (["train", "ppo", "CartPole-v1", "--run-dir", "{file}"], "run_dir="),
    (["train", "ppo", "CartPole-v1", "--run-dir", "{file}/run"], "run_dir="),
    (["train", "ppo", "CartPole-v1", "--strategy", "ddp", "--workers", "2", "--run-dir", "{file}/run"], "run_dir="),
    (["train", "grpo", "bandit", "--reward", "nosuch:reward"], "rewards="),
    (["train", "a2c", "CartPole-v1"], "algo="),
    (["train", "appo", "CartPole-v1", "--vtrace-rho-bar", "0"], "vtrace_rho_bar="),
    (["tune", "ppo", "CartPole-v1", *TUNE, "--storage", "not-a-url"], "storage="),
    (["tune", "ppo", "CartPole-v1", *TUNE, "--storage", "sqlite:////proc/distrl/study.db"], "storage="),
    (["tune", "ppo", "CartPole-v1", *TUNE, "--study-dir", "{file}/study"], "study_dir="),
    (["eval", "/nonexistent"], "run="),
    (["eval", "{file}"], "run="),
    (["plot", "{file}"], "run="),
    (["trust", "/nonexistent"], "run="),
]


@pytest.mark.parametrize(("argv", "flag"), CORPUS, ids=[" ".join(argv[:4]) for argv, _ in CORPUS])
def test_a_mistaken_name_is_one_line_exit_2_and_writes_nothing(tmp_path, monkeypatch, capsys, argv, flag):
    monkeypatch.chdir(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("not a directory\n")
    argv = [a.replace("{file}", str(afile)) for a in argv]
    if argv[:2] == ["train", "ppo"]:
        argv = [*argv, *SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distrl: error: ") and flag in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # nothing written (runs/, a study, a database)


USER_CODE_RAISES = [
    # (command line, the field, the code it names, the exception its code raises while distrl builds it)
    (["train", "ppo", "CartPole-v1", "--wrapper", "distrl_testenvs:wrong_type_wrapper"], "wrappers", "TypeError"),
    (
        ["train", "ppo", "CartPole-v1", "--wrapper", "distrl_testenvs:wrong_type_wrapper", "--vec", "async"],
        "wrappers",
        "TypeError",
    ),
    (["train", "ppo", "distrl_testenvs:raising_factory"], "env", "RuntimeError"),
    (["train", "ppo", "distrl_testenvs:RaisingEnv"], "env", "ValueError"),
    (["train", "ppo", "CartPole-v1", "--policy", "distrl_spaceenvs:raising_net"], "policy", "AttributeError"),
    (["train", "dqn", "CartPole-v1", "--policy", "distrl_spaceenvs:raising_net"], "policy", "AttributeError"),
]


@pytest.mark.parametrize(
    ("argv", "field", "raised"), USER_CODE_RAISES, ids=[" ".join(a[1:5]) for a, *_ in USER_CODE_RAISES]
)
def test_user_code_that_raises_while_built_is_one_line_naming_it_exit_2_and_writes_nothing(
    tmp_path, monkeypatch, capsys, argv, field, raised
):
    monkeypatch.chdir(tmp_path)
    code = next(a for a in argv if ":" in a)
    if argv[:2] == ["train", "ppo"]:
        argv = [*argv, *SMALL]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    # the field and the code, the exception, and the line of the user's file that raised it
    assert re.match(
        rf"distrl: error: {field}='{code}' raised {raised} .*\(.*distrl_(test|space)envs\.py:\d+\): \S", err[0]
    ), err
    assert list(tmp_path.iterdir()) == []


class _NotAnMlflowServer(http.server.BaseHTTPRequestHandler):
    """A web server that answers every MLflow request with 404, as one that is not MLflow's does."""

    def do_GET(self):  # noqa: N802 - the name http.server calls
        self.send_error(404)

    do_POST = do_GET  # noqa: N815

    def log_message(self, *args):
        pass


@pytest.fixture
def not_mlflow():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NotAnMlflowServer)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


STORES = [
    # (MLFLOW_TRACKING_URI, what the line must say)
    ("file://{tmp}/mlruns", "MLFLOW_ALLOW_FILE_STORE=true"),
    ("{tmp}/mlruns", "MLFLOW_ALLOW_FILE_STORE=true"),
    ("sqlite:///{file}", "is not an SQLite database"),
    ("{server}", "cannot be opened: MlflowException"),  # refused only once MLflow opens it, after the run began
]


@pytest.mark.parametrize(
    ("uri", "said"), STORES, ids=["file-uri", "directory", "not-a-database", "not-an-mlflow-server"]
)
def test_a_tracker_store_that_refuses_to_open_is_one_line_exit_2_and_writes_nothing(
    tmp_path, monkeypatch, capsys, not_mlflow, uri, said
):
    environment_variables = pytest.importorskip("mlflow.environment_variables")
    if "mlruns" in uri and not hasattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE"):
        pytest.skip("MLflow before 3.13 opens its file store without being asked to")
    monkeypatch.chdir(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("not a database\n")
    uri = uri.format(tmp=tmp_path, file=afile, server=not_mlflow)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    assert main(["train", "ppo", "CartPole-v1", "--track", "mlflow", *SMALL]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"distrl: error: track='mlflow': MLFLOW_TRACKING_URI={uri!r}"), err
    assert said in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile"]  # no run directory, no store


def test_a_malformed_ray_address_is_one_line_exit_2(tmp_path):
    """In a process of its own: an in-process Ray instance left by another test would be used as it is."""
    argv = ["train", "ppo", "CartPole-v1", "--strategy", "actor-learner", "--ray-address", "not-an-address", *SMALL]
    done = subprocess.run(
        [sys.executable, "-m", "distrl", *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path
    )
    err = done.stderr.strip().splitlines()
    assert done.returncode == 2 and len(err) == 1 and "ray_address='not-an-address'" in err[0], done.stderr
    assert list(tmp_path.iterdir()) == []
