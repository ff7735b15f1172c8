"""ddp launch paths end to end: local launcher, torchrun, Ray; failures; resume."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

pytestmark = pytest.mark.multiprocess

SMALL = ["--n-envs", "4", "--n-steps", "32", "--batch-size", "64", "--n-epochs", "2", "--quiet"]


def distrl(*args, timeout=180, **kwargs):
    return subprocess.run(
        [sys.executable, "-m", "distrl", *args], capture_output=True, text=True, timeout=timeout, **kwargs
    )


def summary(run_dir):
    return json.loads((run_dir / "summary.json").read_text())


def test_local_launcher_runs_two_ranks_and_merges_their_episodes(tmp_path):
    run_dir = tmp_path / "run"
    result = distrl(
        "train",
        "ppo",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--total-steps",
        "4096",
        *SMALL,
        "--run-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr
    s = summary(run_dir)
    assert s["workers"] == 2 and s["strategy"] == "ddp" and s["total_steps"] == 4096
    merged = (run_dir / "monitor.csv").read_text().splitlines()[2:]
    per_rank = [(run_dir / "ranks" / f"rank-{r}.monitor.csv").read_text().splitlines()[2:] for r in range(2)]
    assert len(per_rank[0]) > 0 and len(per_rank[1]) > 0
    assert len(merged) == len(per_rank[0]) + len(per_rank[1])
    config = json.loads((run_dir / "config.json").read_text())
    assert config["strategy"]["workers"] == 2


def test_torchrun_launch_uses_the_same_code_path(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "-m",
            "distrl",
            "train",
            "ppo",
            "CartPole-v1",
            "--strategy",
            "ddp",
            "--total-steps",
            "2048",
            *SMALL,
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    assert summary(run_dir)["workers"] == 2 and summary(run_dir)["total_steps"] == 2048


@pytest.mark.heavy
def test_equivalent_scaling_is_recorded_and_impossible_scaling_fails_before_start(tmp_path):
    run_dir = tmp_path / "run"
    ok = distrl(
        "train",
        "ppo",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--scaling",
        "equivalent",
        "--total-steps",
        "1024",
        *SMALL,
        "--run-dir",
        str(run_dir),
    )
    assert ok.returncode == 0, ok.stderr
    effective = json.loads((run_dir / "config.json").read_text())["ppo_effective"]
    assert effective["n_steps"] == 16 and effective["learning_rate"] == pytest.approx(2 * 2e-3)  # preset lr 2e-3
    bad = distrl(
        "train",
        "ppo",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--scaling",
        "equivalent",
        "--n-steps",
        "33",
        "--n-envs",
        "2",
        "--batch-size",
        "33",
        "--run-dir",
        str(tmp_path / "bad"),
    )
    assert bad.returncode == 2 and "n_steps=33" in bad.stderr and not (tmp_path / "bad").exists()


@pytest.mark.heavy
def test_reinforce_runs_under_ddp_with_equivalent_scaling(tmp_path):
    run_dir = tmp_path / "run"
    ok = distrl(
        "train",
        "reinforce",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--scaling",
        "equivalent",
        "--iterations",
        "2",
        "--quiet",
        "--run-dir",
        str(run_dir),
    )
    assert ok.returncode == 0, ok.stderr
    assert summary(run_dir)["iterations"] == 2 and summary(run_dir)["workers"] == 2
    effective = json.loads((run_dir / "config.json").read_text())["reinforce_effective"]
    assert effective["episodes_per_iter"] == 8  # the preset's 16, over 2 workers
    bad = distrl(
        "train",
        "reinforce",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--scaling",
        "equivalent",
        "--episodes-per-iter",
        "15",
        "--run-dir",
        str(tmp_path / "bad"),
    )
    assert bad.returncode == 2 and "episodes_per_iter=15" in bad.stderr and not (tmp_path / "bad").exists()
    assert len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.heavy
def test_a_rank_that_raises_ends_the_job_naming_the_rank(tmp_path):
    start = time.monotonic()
    result = distrl(
        "train",
        "ppo",
        "distrl_testenvs:ExplodingOnRank1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--vec",
        "sync",
        "--total-steps",
        "100000",
        *SMALL,
        "--run-dir",
        str(tmp_path / "run"),
    )
    assert time.monotonic() - start < 60
    assert result.returncode == 1
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("distrl: error: rank 1 failed") and "boom from rank 1's env" in last


def test_the_launcher_names_the_rank_that_failed_in_substance_not_the_peer_that_exited_first():
    from distrl.strategies.launch import WorkerFailed, _wait_all, _Worker

    def rank(delay, message):
        code = f"import sys, time; time.sleep({delay}); print({message!r}, file=sys.stderr); sys.exit(1)"
        return subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)

    peer = "distrl: error: rank 0: RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1"
    workers = [_Worker(0, rank(0.0, peer)), _Worker(1, rank(0.5, "distrl: error: rank 1: ValueError: bad obs"))]
    with pytest.raises(WorkerFailed) as failed:
        _wait_all(workers)
    assert str(failed.value) == (
        "rank 1 failed (exit status 1): distrl: error: rank 1: ValueError: bad obs (then failed too: rank 0)"
    )


def test_ranks_are_forked_only_from_a_launcher_without_threads_of_its_own(monkeypatch):
    """A lock another thread holds at the fork stays held in the child: a launcher running threads (a notebook's
    kernel, a test runner's worker) starts each rank as a new interpreter instead."""
    import threading

    from distrl.strategies import launch

    stop = threading.Event()
    thread = threading.Thread(target=stop.wait, daemon=True)
    thread.start()
    try:
        assert not launch.fork_ranks("cpu")
    finally:
        stop.set()
        thread.join(timeout=5)
    monkeypatch.setattr(launch.threading, "active_count", lambda: 1)  # as `distrl train` is when it forks
    assert launch.fork_ranks("cpu") and not launch.fork_ranks("cuda")


def _training_ranks(tmp_path):
    """A `distrl train --strategy ddp --workers 2` far from its end, once both ranks train: the launcher and its
    ranks in rank order (psutil processes; the ranks are forked, their environ is the launcher's)."""
    psutil = pytest.importorskip("psutil")
    launcher = subprocess.Popen(
        [sys.executable, "-m", "distrl", "train", "ppo", "CartPole-v1", "--strategy", "ddp", "--workers", "2",
         "--total-steps", "10000000", *SMALL, "--run-dir", str(tmp_path / "run")],
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    parent = psutil.Process(launcher.pid)
    deadline = time.monotonic() + 60
    ranks = []
    while time.monotonic() < deadline:
        try:
            ranks = sorted(parent.children(), key=lambda child: (child.create_time(), child.pid))
        except psutil.Error:
            ranks = []
        if len(ranks) == 2 and (tmp_path / "run" / "monitor.csv").exists():
            return launcher, ranks
        time.sleep(0.2)
    launcher.kill()
    launcher.communicate()
    pytest.fail(f"the ranks did not start within 60 s: {len(ranks)} running")


def test_a_killed_rank_ends_the_job_within_60s_and_leaves_no_process(tmp_path):
    psutil = pytest.importorskip("psutil")
    launcher, (_, victim) = _training_ranks(tmp_path)
    time.sleep(1.0)
    children = psutil.Process(launcher.pid).children()
    os.kill(victim.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    _, err = launcher.communicate(timeout=60)
    assert time.monotonic() - killed_at < 60
    assert launcher.returncode == 1
    assert "rank 1 failed (killed by SIGKILL)" in err
    time.sleep(0.5)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.heavy
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_ranks_of_a_killed_launcher_end_with_it(tmp_path):
    """SIGKILL leaves the launcher no time to stop its ranks: each asked the kernel, before it began, to be killed
    with the launcher (PR_SET_PDEATHSIG, with prctl looked up in the launcher), so none is left orphaned."""
    psutil = pytest.importorskip("psutil")
    launcher, ranks = _training_ranks(tmp_path)
    launcher.kill()
    launcher.communicate(timeout=30)

    def running():  # a rank killed but not yet reaped by whoever inherited it is a zombie: not running
        alive = []
        for rank in ranks:
            try:
                if rank.status() != psutil.STATUS_ZOMBIE:
                    alive.append(rank.pid)
            except psutil.NoSuchProcess:
                pass
        return alive

    deadline = time.monotonic() + 10
    while running() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running(), f"ranks still running 10 s after the launcher was killed: {running()}"


@pytest.mark.heavy
def test_sac_runs_under_ddp(tmp_path):
    run_dir = tmp_path / "run"
    result = distrl(
        "train",
        "sac",
        "Pendulum-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--scaling",
        "equivalent",
        "--total-steps",
        "600",
        "--learning-starts",
        "200",
        "--batch-size",
        "32",
        "--net-arch",
        "32",
        "32",
        "--quiet",
        "--run-dir",
        str(run_dir),
    )
    assert result.returncode == 0, result.stderr
    s = summary(run_dir)
    assert s["workers"] == 2 and s["total_steps"] == 600
    effective = json.loads((run_dir / "config.json").read_text())["sac_effective"]
    assert effective["learning_starts"] == 100 and effective["learning_rate"] == pytest.approx(2 * 1e-3)  # preset 1e-3


# the compact buffer in the default run; the plain one's save and restore is also proven in one process (test_cli)
@pytest.mark.parametrize("compact", [pytest.param(False, marks=pytest.mark.slow), True])
@pytest.mark.heavy
def test_a_ddp_sac_run_resumed_with_every_ranks_replay_buffer_equals_the_uninterrupted_run(tmp_path, compact):
    from distrl.run import checkpoint

    args = [
        "train",
        "sac",
        "Pendulum-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--total-steps",
        "600",
        "--learning-starts",
        "100",
        "--batch-size",
        "32",
        "--net-arch",
        "32",
        "32",
        "--save-replay",
        "--checkpoint-every",
        "300",
        "--quiet",
        *(["--optimize-memory-usage"] if compact else []),
    ]
    for name in ("full", "run"):
        result = distrl(*args, "--run-dir", str(tmp_path / name))
        assert result.returncode == 0, result.stderr
    older = tmp_path / "run" / "checkpoints" / f"step-{300:012d}"
    assert sorted(p.name for p in older.glob("replay*")) == ["replay-rank1.safetensors", "replay.safetensors"]
    again = distrl(*args, "--resume", str(older))
    assert again.returncode == 0, again.stderr
    tensors = [checkpoint.load(tmp_path / name / "model")[0] for name in ("full", "run")]
    assert all(torch.equal(tensors[0][k], tensors[1][k]) for k in tensors[0])  # rank 1 kept its own transitions


def test_ddp_run_resumes_from_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    args = ["train", "ppo", "CartPole-v1", "--strategy", "ddp", "--workers", "2", *SMALL]
    first = distrl(*args, "--total-steps", "1024", "--checkpoint-every", "512", "--run-dir", str(run_dir))
    assert first.returncode == 0, first.stderr
    again = distrl(*args, "--resume", str(run_dir), "--total-steps", "2048")
    assert again.returncode == 0, again.stderr
    assert summary(run_dir)["total_steps"] == 2048

    def rows(path):
        return len(path.read_text().splitlines()) - 2

    episodes = summary(run_dir)["episodes"]  # each episode logged once, across both processes and both ranks
    assert rows(run_dir / "monitor.csv") == episodes
    assert sum(rows(run_dir / "ranks" / f"rank-{r}.monitor.csv") for r in (0, 1)) == episodes


# resuming a ddp run from its checkpoint is in the default run (test_ddp_run_resumes_from_its_checkpoint)
@pytest.mark.slow
def test_resume_auto_under_torchrun_restarts_continues_a_killed_rank_from_the_newest_checkpoint(tmp_path):
    psutil = pytest.importorskip("psutil")
    slow = [
        "distrl_testenvs:SlowCartPole",
        "--strategy",
        "ddp",
        "--total-steps",
        "2048",
        "--checkpoint-every",
        "512",
        "--seed",
        "3",
        *SMALL,
    ]  # 2 ms a step: an iteration lasts about 0.3 s, long enough to be cut
    run_dir = tmp_path / "elastic"
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            "--max-restarts",
            "1",
            "-m",
            "distrl",
            "train",
            "ppo",
            *slow,
            "--resume",
            "auto",
            "--run-dir",
            str(run_dir),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while not list((run_dir / "checkpoints").glob("step-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    ranks = [c for c in psutil.Process(agent.pid).children(recursive=True) if c.environ().get("RANK") == "1"]
    assert len(ranks) == 1 and not (run_dir / "summary.json").exists(), "no checkpoint before the run ended"
    ranks[0].kill()
    _, err = agent.communicate(timeout=180)
    assert agent.returncode == 0, err[-3000:]
    assert "failed (exitcode: -9) local_rank: 1" in err  # torchrun saw the kill and started the group again
    events = (run_dir / "events.log").read_text()
    assert "(torchrun restart 1)" in events and "resumed at step " in events
    whole = tmp_path / "whole"  # the same run, never interrupted
    done = distrl("train", "ppo", *slow, "--workers", "2", "--run-dir", str(whole))
    assert done.returncode == 0, done.stderr
    assert summary(run_dir)["total_steps"] == summary(whole)["total_steps"] == 2048

    def episodes(run):
        return [line.rsplit(",", 1)[0] for line in (run / "monitor.csv").read_text().splitlines()[2:]]  # r,l

    assert episodes(run_dir) == episodes(whole)  # each episode once, none lost, none twice
    from distrl.run import checkpoint

    assert (
        checkpoint.load(run_dir / checkpoint.MODEL_DIR)[0].keys()
        == checkpoint.load(whole / checkpoint.MODEL_DIR)[0].keys()
    )
    for name, value in checkpoint.load(run_dir / checkpoint.MODEL_DIR)[0].items():
        assert torch.equal(value, checkpoint.load(whole / checkpoint.MODEL_DIR)[0][name]), name


@pytest.mark.heavy
def test_resume_auto_needs_a_run_dir_and_starts_afresh_in_one_without_a_checkpoint(tmp_path):
    bad = distrl("train", "ppo", "CartPole-v1", "--resume", "auto", "--total-steps", "256", *SMALL)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "distrl: error: resume='auto' needs --run-dir: the run directory to continue, or to start in"
    )
    run_dir = tmp_path / "run"
    run_dir.mkdir()  # what a start killed before its first checkpoint leaves: a config and episodes
    (run_dir / "monitor.csv").write_text('#{"t_start": 0, "env_id": "CartPole-v1"}\nr,l,t\n9,9,0.1\n')
    first = distrl(
        "train", "ppo", "CartPole-v1", "--resume", "auto", "--total-steps", "256", *SMALL, "--run-dir", str(run_dir)
    )
    assert first.returncode == 0, first.stderr
    rows = (run_dir / "monitor.csv").read_text().splitlines()[2:]
    assert "9,9,0.1" not in rows and len(rows) == summary(run_dir)["episodes"]
    again = distrl(
        "train", "ppo", "CartPole-v1", "--resume", "auto", "--total-steps", "512", *SMALL, "--run-dir", str(run_dir)
    )  # finished: auto continues it
    assert again.returncode == 0, again.stderr
    assert summary(run_dir)["total_steps"] == 512


@pytest.mark.heavy
def test_ray_launcher_places_ranks_as_actors(tmp_path):
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    result = distrl(
        "train",
        "ppo",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--launcher",
        "ray",
        "--total-steps",
        "2048",
        *SMALL,
        "--run-dir",
        str(run_dir),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert summary(run_dir)["workers"] == 2 and summary(run_dir)["total_steps"] == 2048


def test_the_ray_launcher_names_the_rank_that_failed_in_substance(ray_local):
    from distrl.strategies.launch import WorkerFailed
    from distrl.strategies.ray_launch import _wait_ray

    def _fail_after(delay, error):  # defined here so that Ray ships it by value
        import time

        time.sleep(delay)
        raise error

    fail = ray_local.remote(_fail_after)
    refs = [
        fail.remote(0.0, RuntimeError("[gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1")),
        fail.remote(0.5, ValueError("bad obs")),
    ]
    with pytest.raises(WorkerFailed) as failed:
        _wait_ray(ray_local, refs)
    # rank 0 is reported too when its task has failed by then; on a busy machine it may start late
    assert str(failed.value).startswith("rank 1 failed: ValueError: bad obs")


def test_unreachable_ray_cluster_is_a_clear_error(tmp_path):
    pytest.importorskip("ray")
    result = distrl(
        "train",
        "ppo",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--ray-address",
        "127.0.0.1:1",
        "--total-steps",
        "1024",
        *SMALL,
        "--run-dir",
        str(tmp_path / "r"),
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("distrl: error: ray_address='127.0.0.1:1'")


@pytest.mark.slow
def test_ddp_with_two_workers_solves_cartpole(tmp_path):
    run_dir = tmp_path / "run"
    result = distrl(
        "train",
        "ppo",
        "CartPole-v1",
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--quiet",
        "--run-dir",
        str(run_dir),
        timeout=600,
    )
    assert result.returncode == 0, result.stderr
    assert summary(run_dir)["final_eval_mean_return"] >= 475
