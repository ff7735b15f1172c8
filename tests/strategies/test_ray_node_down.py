"""When the Ray node a run's learner runs on goes down (its raylet killed, an agent the raylet shares its fate
with killed, heartbeats missed), the run says so in one line naming the node and why, instead of restarting
actors that cannot start or waiting for data that cannot come.

The translation from what Ray reports (its error objects, its node table) to that line is checked on
constructed values; one heavy test kills the raylet of a real run."""

import os
import re
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from distrl.strategies import actors
from distrl.strategies.actors import ActorDied, RayActors, RayNodeDown, node_down_line

exceptions = pytest.importorskip("ray.exceptions")

NODE_ID = "57f32e869238337ce7aee93fcc65c58a3d81dda036550b5fbb4e956b"
LINE = re.compile(r"the Ray node 57f32e86 \(127\.0\.0\.1\) this process runs on went down: (?P<why>.+?); every actor")


def node(port: int, alive: bool = True, **death) -> dict:
    """An entry of Ray's node table (``ray.nodes()``) as Ray 2.x writes it, with the fields distrl reads."""
    return {
        "NodeID": NODE_ID,
        "Alive": alive,
        "NodeManagerAddress": "127.0.0.1",
        "NodeManagerPort": port,
        "DeathReason": 0,
        "DeathReasonMessage": "",
        **death,
    }


@pytest.fixture
def listening():
    """A port a raylet would listen on: one that accepts connections."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def refusing():
    """A port nothing listens on: a killed raylet's."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    return port


class FakeRay:
    """The few calls of the ``ray`` module the engine makes, answering as Ray does when its node is lost."""

    def __init__(self, nodes: list[dict], get_raises: Exception | None = None, wait_raises: Exception | None = None):
        self.table, self.get_raises, self.wait_raises = nodes, get_raises, wait_raises
        self.waits = 0

    def get_runtime_context(self):
        return SimpleNamespace(get_node_id=lambda: NODE_ID)

    def nodes(self):
        return self.table

    def get(self, pending, timeout):
        raise self.get_raises

    def wait(self, pending, num_returns, timeout):
        self.waits += 1
        if self.wait_raises is not None:
            raise self.wait_raises
        time.sleep(timeout)
        return [], pending


def test_a_node_ray_marked_dead_is_one_line_naming_it_and_rays_reason():
    line = node_down_line(
        node(1, alive=False, DeathReason=2, DeathReasonMessage="health check failed due to missing too many heartbeats")
    )
    assert "\n" not in line
    assert LINE.match(line)["why"] == "health check failed due to missing too many heartbeats (unexpected termination)"
    assert "ray-logs/" in line and "--resume RUN" in line
    assert LINE.match(node_down_line(node(1, alive=False)))["why"] == "Ray gave no reason"


def test_a_raylet_that_refuses_connections_is_named_before_ray_marks_its_node_dead():
    why = LINE.match(node_down_line(node(43689)))["why"]
    assert (
        why
        == "its raylet at 127.0.0.1:43689 refuses connections (killed or crashed; Ray has not marked the node dead yet)"
    )


def test_an_actor_lost_with_this_processs_node_stops_the_run_instead_of_a_restart(refusing):
    reason = "runtime_env_agent failed and raylet fate-shares with it."
    dead = node(refusing, alive=False, DeathReason=2, DeathReasonMessage=reason)
    engine = RayActors(FakeRay([dead], get_raises=exceptions.ActorDiedError()))
    with pytest.raises(RayNodeDown) as lost:
        engine.result("call", 1.0)
    assert LINE.match(str(lost.value))["why"] == f"{reason} (unexpected termination)"


def test_an_actor_that_dies_on_a_live_node_is_still_an_actor_death(listening):
    engine = RayActors(FakeRay([node(listening)], get_raises=exceptions.ActorDiedError()))
    with pytest.raises(ActorDied):
        engine.result("call", 1.0)


@pytest.mark.parametrize("error", [OSError("Broken pipe"), exceptions.LocalRayletDiedError()], ids=["wait", "get"])
def test_a_broken_connection_to_the_raylet_names_the_node_at_once(refusing, error):
    fake = FakeRay([node(refusing)], get_raises=error, wait_raises=error if isinstance(error, OSError) else None)
    engine = RayActors(fake)
    start = time.monotonic()
    with pytest.raises(RayNodeDown, match=f"its raylet at 127.0.0.1:{refusing} refuses connections"):
        engine.wait(["call"], 60.0) if isinstance(error, OSError) else engine.result("call", 60.0)
    assert time.monotonic() - start < 10.0  # the node table's answer, not Ray's verdict 16 s later


def test_a_wait_that_hears_nothing_notices_the_raylet_is_gone(monkeypatch, refusing):
    monkeypatch.setattr(actors, "CHECK_NODE_EVERY_S", 0.05)
    fake = FakeRay([node(refusing)])
    with pytest.raises(RayNodeDown, match="refuses connections"):
        RayActors(fake).wait(["call"], 60.0)
    assert fake.waits == 1  # one slice of the wait, then the check


def test_a_wait_on_a_live_node_times_out_as_before(monkeypatch, listening):
    monkeypatch.setattr(actors, "CHECK_NODE_EVERY_S", 0.05)
    fake = FakeRay([node(listening)])
    assert RayActors(fake).wait(["call"], 0.3) == []
    assert 3 <= fake.waits <= 7  # sliced, and the slices add up to the timeout


@pytest.mark.heavy
@pytest.mark.multiprocess
def test_a_killed_raylet_ends_the_run_with_one_line_naming_the_node(tmp_path, ray_tmp):
    psutil = pytest.importorskip("psutil")
    argv = ["train", "ppo", "CartPole-v1", "--strategy", "actor-learner", "--workers", "1"]
    argv += ["--total-steps", "100000000", "--run-dir", str(tmp_path / "run"), "--quiet"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "distrl", *argv],
        env={**os.environ, "RAY_TMPDIR": ray_tmp},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline, raylet = time.monotonic() + 180, None
        while raylet is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            family = psutil.Process(proc.pid).children(recursive=True)
            names = {p.pid: _name(p) for p in family}
            if "ray::RolloutWorker" in names.values():  # training has started
                raylet = next(p for p in family if names[p.pid] == "raylet")
        assert raylet is not None, "the run did not start its rollout worker"
        time.sleep(2)
        os.kill(raylet.pid, signal.SIGKILL)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    lines = err.strip().splitlines()
    assert proc.returncode == 1, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert re.fullmatch(
        r"distrl: error: the Ray node [0-9a-f]{8} \(127\.0\.0\.1\) this process runs on went down: .+; every actor on "
        r"it is gone: .+",
        lines[-1],
    ), err[-3000:]


def _name(process) -> str:
    try:
        return process.name()
    except Exception:  # noqa: BLE001 - a process that just ended has no name
        return ""
