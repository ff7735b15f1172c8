"""A Ray cluster of two nodes on one machine (a head and a second raylet with its own CPUs, as Ray's own
tests make them): every Ray strategy places its workers on both and records where in summary.json; when
the second node is lost mid-run, actor-learner and the pipeline go on with what is left and say so, and
ddp ends naming the lost node."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from distributed import kill_processes_naming

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.multiprocess

TESTS = Path(__file__).parent.parent


class TwoNodes:
    def __init__(self):
        self.tmp = tempfile.mkdtemp(prefix="rc", dir="/tmp")  # short: Ray's socket paths live under it
        self.env = {**os.environ, "RAY_TMPDIR": self.tmp}
        self.proc = subprocess.Popen(
            [sys.executable, str(TESTS / "ray_two_nodes.py")],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        info = json.loads(self.proc.stdout.readline())
        self.address, self.head, self.second = info["address"], info["head"], info["second"]

    def command(self, word: str) -> dict:
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def add(self) -> None:
        self.second = self.command("add")["second"]

    def train(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-m", "distrl", "train", *args, "--ray-address", self.address, "--quiet"],
            env=self.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        kill_processes_naming(self.tmp)  # anything of this cluster still alive
        shutil.rmtree(self.tmp, ignore_errors=True)


@pytest.fixture(scope="module")
def nodes():
    cluster = TwoNodes()
    yield cluster
    cluster.close()


def finish(proc: subprocess.Popen, timeout: float = 240) -> subprocess.CompletedProcess:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def placed_nodes(summary: dict, role: str) -> list[str]:
    entries = summary["placement"][role]
    return [e["node"] for e in (entries if role == "ranks" else [row[0] for row in entries])]


SMALL = ["--total-steps", "1024", "--n-envs", "2", "--n-steps", "64", "--batch-size", "64"]


@pytest.mark.parametrize("strategy, role", [("ddp", "ranks"), ("actor-learner", "workers"), ("pipeline", "generators")])
def test_workers_are_placed_on_both_nodes_and_recorded(nodes, tmp_path, strategy, role):
    run_dir = tmp_path / "run"
    done = finish(
        nodes.train("ppo", "CartPole-v1", "--strategy", strategy, "--workers", "2", *SMALL, "--run-dir", str(run_dir))
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    # the pipeline counts every step its generators delivered: a fragment (2 envs x 64 steps) the other generator
    # delivered before the last batch counts too, when the machine is busy enough to let it arrive that early
    extra = 128 if strategy == "pipeline" else 0
    assert 1024 <= summary["total_steps"] <= 1024 + extra
    assert sorted(placed_nodes(summary, role)) == sorted([nodes.head, nodes.second])


def wait_for_training(run_dir: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        monitor = run_dir / "monitor.csv"
        if monitor.exists() and len(monitor.read_text().splitlines()) > 4:
            return
        time.sleep(0.1)
    raise AssertionError("the run never started training")


SLOW = [
    "distrl_testenvs:SlowCartPole",
    "--total-steps",
    "3072",
    "--n-envs",
    "2",
    "--n-steps",
    "64",
    "--batch-size",
    "64",
]  # 2 ms a step: about 4 s of collecting in all


# the pipeline's generator replacement is proven without a second node too (test_pipeline, test_pipeline_ppo)
@pytest.mark.parametrize(
    "strategy, role", [("actor-learner", "workers"), pytest.param("pipeline", "generators", marks=pytest.mark.slow)]
)
@pytest.mark.heavy
def test_losing_a_node_mid_run_the_run_goes_on_with_what_is_left_and_says_so(nodes, tmp_path, strategy, role):
    run_dir = tmp_path / "run"
    proc = nodes.train("ppo", *SLOW, "--strategy", strategy, "--workers", "2", "--run-dir", str(run_dir))
    wait_for_training(run_dir)
    lost = nodes.command("remove")["removed"]
    try:
        done = finish(proc)
    finally:
        nodes.add()
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["total_steps"] >= 3072
    rows = summary["placement"][role]
    on_lost = [i for i, row in enumerate(rows) if row[0].get("node") == lost]
    assert len(on_lost) == 1  # the worker that ran there was replaced on the node that is left
    replaced = rows[on_lost[0]]
    assert len(replaced) == 2 and replaced[1]["node"] == nodes.head
    events = " ".join(summary["events"])
    assert f"{'worker' if role == 'workers' else 'generator'} {on_lost[0]} " in events and "restart" in events
    assert lost[:8] in events  # the log names the node that was lost


# a lost rank ending the job by name is in the default run (test_launch); a lost node under actor-learner too
@pytest.mark.slow
def test_losing_a_node_ends_ddp_naming_the_node_within_the_timeout(nodes, tmp_path):
    run_dir = tmp_path / "run"
    proc = nodes.train(
        "ppo",
        *SLOW[:1],
        "--total-steps",
        "100000",
        *SLOW[3:],
        "--strategy",
        "ddp",
        "--workers",
        "2",
        "--timeout-s",
        "30",
        "--run-dir",
        str(run_dir),
    )
    wait_for_training(run_dir)
    lost = nodes.command("remove")["removed"]
    start = time.monotonic()
    try:
        done = finish(proc, timeout=120)
    finally:
        nodes.add()
    assert time.monotonic() - start < 30 + 15
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("distrl: error: rank ") and lost[:8] in last, done.stderr[-3000:]


@pytest.mark.slow  # 18 s; the other cluster tests keep the two nodes in the default run
def test_a_pbt_study_places_its_members_on_both_nodes(nodes, tmp_path):
    space = tmp_path / "space.json"
    space.write_text(json.dumps({"learning_rate": {"type": "float", "low": 1e-5, "high": 3e-3, "log": True}}))
    study = tmp_path / "study"
    args = ["--scheduler", "pbt", "--population", "4", "--budget-steps", "4096", "--perturbation-interval", "2048"]
    args += ["--space", str(space), "--no-default-space", "--eval-episodes", "2", "--study-dir", str(study)]
    result = subprocess.run(
        [sys.executable, "-m", "distrl", "tune", "ppo", "CartPole-v1", *args, "--ray-address", nodes.address],
        env=nodes.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    events = [json.loads(line) for line in (study / "lineage.jsonl").read_text().splitlines()]
    evals = [e for e in events if e["event"] == "eval"]
    assert {e["member"] for e in evals} == {f"member-{i:03d}" for i in range(4)}
    assert {e["node"] for e in evals} == {nodes.head, nodes.second}  # the cluster's CPUs, both nodes
    assert (study / "best_schedule.json").exists()
