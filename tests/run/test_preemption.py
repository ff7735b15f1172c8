"""A run stopped by a signal (a cluster's preemption, Ctrl-C): it writes a checkpoint at the next iteration, every
ddp rank at the same one, exits with 128 + the signal's number, and resumed it ends exactly where a run that was
never stopped ends. Also the clock form of --checkpoint-every, and a second signal stopping at once."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from safetensors.torch import load_file

from distrl.config import ConfigError, PPOConfig, RunConfig
from distrl.config.argv import checkpoint_every_time
from distrl.run import preemption
from distrl.training import OnPolicyTrainer

SLOW = "distrl_testenvs:SlowCartPole"  # 2 ms a step: a run lasts long enough to be stopped in the middle


def train_args(run_dir, per_iteration, *extra):
    """A short PPO run that checkpoints after every iteration (``per_iteration`` steps), so that the checkpoint a
    stop writes falls where the uninterrupted run also restarts its episodes (a checkpoint is a segment
    boundary: see RunState.save_checkpoint)."""
    return [
        "train", "ppo", SLOW, "--env-kwargs", "delay=0.002", "--n-envs", "2", "--n-steps", "32",
        "--batch-size", "32", "--n-epochs", "1", "--total-steps", "1536", "--seed", "1",
        "--checkpoint-every", str(per_iteration), "--eval-episodes", "1", "--quiet", "--run-dir", str(run_dir),
        *extra,
    ]  # fmt: skip


def distrl(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "distrl", *args], capture_output=True, text=True, timeout=timeout)


def stop_after_first_checkpoint(args, run_dir, signum=signal.SIGTERM, group=False):
    """Start ``distrl *args``, send ``signum`` once its first checkpoint is on disk (to its whole process group
    with ``group``, as a terminal's Ctrl-C does), and return the finished process."""
    process = subprocess.Popen(
        [sys.executable, "-m", "distrl", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=group,
    )
    deadline = time.monotonic() + 180
    while not any((run_dir / "checkpoints").glob("step-*")):
        assert process.poll() is None, process.communicate()[1]
        assert time.monotonic() < deadline, "no checkpoint within 180 s"
        time.sleep(0.02)
    if group:
        os.killpg(process.pid, signum)
    else:
        process.send_signal(signum)
    _, stderr = process.communicate(timeout=180)
    process.stderr_text = stderr
    return process


def final_params(run_dir):
    return {k: v for k, v in load_file(run_dir / "model" / "tensors.safetensors").items() if k.startswith("params/")}


def episodes(run_dir):
    """The Monitor file's (return, length) rows, without the wall-clock column."""
    return [tuple(line.split(",")[:2]) for line in (run_dir / "monitor.csv").read_text().splitlines()[2:]]


@pytest.mark.parametrize(
    ("strategy", "per_iteration", "signum", "group"),
    [
        pytest.param("single", 64, signal.SIGTERM, False, id="single-SIGTERM"),
        # Ctrl-C: the terminal signals the whole process group
        pytest.param("single", 64, signal.SIGINT, True, id="single-Ctrl-C", marks=pytest.mark.slow),
        # the launcher passes it to rank 0 alone (the ranks have process groups of their own)
        pytest.param("ddp", 128, signal.SIGINT, True, id="ddp-Ctrl-C", marks=pytest.mark.heavy),
        pytest.param("ddp", 128, signal.SIGTERM, False, id="ddp-SIGTERM", marks=pytest.mark.slow),
        pytest.param("actor-learner", 128, signal.SIGTERM, False, id="actor-learner-SIGTERM", marks=pytest.mark.slow),
        # ranks as Ray actors: the driver passes the signal to rank 0 (Ray's workers block SIGINT; rank 0 unblocks it)
        pytest.param("ddp-ray", 128, signal.SIGINT, True, id="ddp-ray-launcher-Ctrl-C", marks=pytest.mark.slow),
    ],
)
def test_a_stopped_run_checkpoints_exits_and_resumes_to_the_uninterrupted_result(
    tmp_path, strategy, per_iteration, signum, group
):
    spread = {
        "single": [],
        "ddp-ray": ["--strategy", "ddp", "--launcher", "ray", "--workers", "2"],
    }.get(strategy, ["--strategy", strategy, "--workers", "2"])
    stopped_dir, whole_dir = tmp_path / "stopped", tmp_path / "whole"

    whole = subprocess.Popen(  # the same run, never stopped, beside it
        [sys.executable, "-m", "distrl", *train_args(whole_dir, per_iteration, *spread)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    stopped = stop_after_first_checkpoint(train_args(stopped_dir, per_iteration, *spread), stopped_dir, signum, group)
    assert stopped.returncode == 128 + signum, stopped.stderr_text
    assert not (stopped_dir / "model").exists()  # stopped, not finished
    checkpoints = sorted((stopped_dir / "checkpoints").glob("step-*"))
    at = int(checkpoints[-1].name.split("-")[1])
    assert 0 < at < 1536
    line = f"stopped by {signal.Signals(signum).name} at step {at:,}: checkpoint {checkpoints[-1]}"
    assert stopped.stderr_text.count(line) == 1, stopped.stderr_text  # said once, by the launcher or the run
    assert stopped.stderr_text.count("received: stopping at the next checkpoint") == 1, stopped.stderr_text
    assert line in (stopped_dir / "events.log").read_text()
    assert "Traceback" not in stopped.stderr_text

    resumed = distrl("train", "ppo", SLOW, "--resume", str(stopped_dir), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert whole.wait(timeout=240) == 0, whole.stderr.read()

    stopped_params, whole_params = final_params(stopped_dir), final_params(whole_dir)
    assert stopped_params.keys() == whole_params.keys()
    for name, value in whole_params.items():
        assert value.equal(stopped_params[name]), name
    assert episodes(stopped_dir) == episodes(whole_dir)  # each episode logged once, none lost


def test_the_first_signal_asks_for_a_stop_and_a_second_stops_at_once():
    before = signal.getsignal(signal.SIGTERM)
    with preemption.stop_signals_caught():
        with pytest.raises(SystemExit) as at_once:  # nothing listens yet (no trainer): nothing to checkpoint
            os.kill(os.getpid(), signal.SIGTERM)
        assert at_once.value.code == 128 + signal.SIGTERM
    with preemption.stop_signals_caught():
        preemption.listen()  # as a trainer does
        assert preemption.requested() == 0
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested() == signal.SIGTERM  # the run goes on to its checkpoint
        with pytest.raises(SystemExit) as stopped:
            os.kill(os.getpid(), signal.SIGINT)
        assert stopped.value.code == 128 + signal.SIGINT
    assert preemption.requested() == 0
    assert signal.getsignal(signal.SIGTERM) is before  # put back: the API and tests keep their own


def test_checkpoint_every_takes_a_time():
    assert checkpoint_every_time(["--checkpoint-every", "10min"]) == ["--checkpoint-every-s", "600"]
    assert checkpoint_every_time(["--checkpoint-every=90s", "--seed", "1"]) == [
        "--seed",
        "1",
        "--checkpoint-every-s",
        "90",
    ]
    assert checkpoint_every_time(["--checkpoint-every", "1.5h"]) == ["--checkpoint-every-s", "5400"]
    assert checkpoint_every_time(["--checkpoint-every", "50_000"]) == ["--checkpoint-every", "50_000"]
    with pytest.raises(ConfigError, match=r"checkpoint_every='10 minutes' is not allowed: must be a step count"):
        checkpoint_every_time(["--checkpoint-every", "10 minutes"])


def test_checkpoints_by_the_clock(tmp_path):
    """With --checkpoint-every-s a run checkpoints once that much time has passed since the last one, whatever the
    step count (a cluster that preempts on the clock)."""
    run = RunConfig(
        env=SLOW, env_kwargs=("delay=0.002",), total_steps=1024, seed=0, vec="sync", quiet=True,
        run_dir=str(tmp_path), checkpoint_every_s=0.3,
    )  # fmt: skip
    trainer = OnPolicyTrainer(run, PPOConfig(n_envs=2, n_steps=32, batch_size=32, n_epochs=1), run_dir=tmp_path)
    started = time.monotonic()
    trainer.train()
    took = time.monotonic() - started
    trainer.close()
    written = sorted((tmp_path / "checkpoints").glob("step-*"))
    assert took > 0.9  # 1,024 steps at 2 ms each: at least two checkpoints were due
    assert 2 <= len(written) <= took / 0.3 + 1
    assert all(int(path.name.split("-")[1]) % 64 == 0 for path in written)  # at ends of iterations


def test_a_bad_checkpoint_time_is_one_line(tmp_path):
    result = distrl("train", "ppo", "CartPole-v1", "--checkpoint-every", "10mins", "--run-dir", str(tmp_path / "r"))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "distrl: error: checkpoint_every='10mins' is not allowed: must be a step count (50000) or a time (90s, 10min, 2h)"
    ]
    assert not (tmp_path / "r").exists()


@pytest.mark.heavy
def test_a_pipeline_run_checkpoints_while_its_generators_run_and_stops_on_a_signal(tmp_path):
    """The pipeline's generators are under way at every checkpoint: their fragments finish into the buffer before
    the new segment starts (a checkpoint used to fail there), and a stop signal ends the run at one."""
    run = tmp_path / "run"
    args = train_args(run, 128, "--strategy", "pipeline", "--workers", "2")
    stopped = stop_after_first_checkpoint(args, run)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stderr_text
    assert "stopped by SIGTERM at step" in stopped.stderr_text
    resumed = distrl("train", "ppo", SLOW, "--resume", str(run), "--quiet")
    assert resumed.returncode == 0, resumed.stderr
    assert (run / "model").is_dir()
    # the learner's own events reach summary.json beside the generators' (they used to replace them there)
    events = json.loads((run / "summary.json").read_text())["events"]
    assert sum("resumed at step" in event for event in events) == 1, events


@pytest.mark.parametrize("algo", ["ppo", "reinforce", "sac", "grpo"])
def test_every_training_loop_stops_at_a_checkpoint_when_asked(tmp_path, monkeypatch, algo):
    """Each loop (on-policy, episodic, off-policy, group) reads the stop request in its iteration's votes, writes a
    checkpoint at that iteration's step and ends with Stopped; the request arrives at the 5th iteration here."""
    from distrl.config import GRPOConfig, REINFORCEConfig, SACConfig
    from distrl.training import make_trainer

    asked = iter(range(10_000))
    monkeypatch.setattr(preemption, "requested", lambda: signal.SIGTERM if next(asked) >= 4 else 0)
    env = {"ppo": "CartPole-v1", "reinforce": "CartPole-v1", "sac": "Pendulum-v1", "grpo": "toy"}[algo]
    cfg = {
        "ppo": PPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=1),
        "reinforce": REINFORCEConfig(n_envs=2, episodes_per_iter=2),
        "sac": SACConfig(n_envs=1, learning_starts=2, batch_size=8, buffer_size=100),
        "grpo": GRPOConfig(learner_steps=50),
    }[algo]
    run = RunConfig(env=env, algo=algo, total_steps=100_000, seed=0, quiet=True, run_dir=str(tmp_path))
    trainer = make_trainer(algo, run, cfg, run_dir=tmp_path)
    with pytest.raises(preemption.Stopped) as stopped:
        trainer.run_to_end(None, time.perf_counter())
    assert stopped.value.signum == signal.SIGTERM and stopped.value.exit_status == 143
    written = sorted((tmp_path / "checkpoints").glob("step-*"))
    assert [int(p.name.split("-")[1]) for p in written] == [trainer.steps]
    assert trainer.steps > 0 and trainer.iteration == 5
    assert f"stopped by SIGTERM at {trainer.progress_unit()} {trainer.steps:,}" in (tmp_path / "events.log").read_text()
    assert not (tmp_path / "model").exists()


def test_the_stop_hint_is_printed_once_and_works_as_printed(tmp_path, monkeypatch, capsys):
    """The line a stopped run ends with names the command that continues it, and that command, run as printed
    (no algorithm, env or flags: they are the run's), finishes the run with the run's own settings."""
    from distrl.cli import main

    run = tmp_path / "run"
    asked = iter(range(10_000))
    monkeypatch.setattr(preemption, "requested", lambda: signal.SIGTERM if next(asked) >= 2 else 0)
    args = ["train", "ppo", "CartPole-v1", "--n-envs", "2", "--n-steps", "16", "--batch-size", "32", "--n-epochs", "1",
            "--total-steps", "256", "--eval-episodes", "1", "--run-dir", str(run)]  # fmt: skip
    assert main(args) == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    assert err.count("stopped by SIGTERM") == 1, err
    hint = err.split("continue with: ")[1].strip()
    assert hint == f"distrl train --resume {run}"

    monkeypatch.setattr(preemption, "requested", lambda: 0)
    assert main(hint.split()[1:]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["total_steps"] == 256 and sum("resumed at step" in event for event in summary["events"]) == 1
    config = json.loads((run / "config.json").read_text())
    assert (config["ppo"]["n_steps"], config["ppo"]["n_envs"]) == (16, 2)  # the run's flags, not PPO's defaults


def test_resume_auto_without_algo_and_nothing_to_continue_says_what_is_missing(tmp_path):
    from distrl.cli.train import train_command

    with pytest.raises(ConfigError, match="holds no checkpoint to continue: name the algorithm and env to start it"):
        train_command(["--resume", "auto", "--run-dir", str(tmp_path / "empty")])
    assert not (tmp_path / "empty").exists()
