"""The embedded Ray instance is the run's own: it starts whatever other Ray cluster the machine has run
(a stale address file, a live `ray start` cluster), and refuses a connection that does not carry its
token.

Each test gives Ray a temporary directory of its own (RAY_TMPDIR), so the address files and clusters it
makes touch no other Ray on the machine.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.multiprocess


def _train(run_dir: Path, ray_tmp: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "reinforce",
            "CartPole-v1",
            "--strategy",
            "actor-learner",
            "--workers",
            "1",
            "--iterations",
            "2",
            "--run-dir",
            str(run_dir),
            "--quiet",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.mark.heavy
def test_the_embedded_instance_starts_beside_a_stale_address_file(ray_tmp, tmp_path):
    address_file = Path(ray_tmp, "ray", "ray_current_cluster")  # what a killed `ray start` leaves behind
    address_file.parent.mkdir(parents=True)
    address_file.write_text("127.0.0.1:1\n")
    proc = _train(tmp_path / "run", ray_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["iterations"] == 2


@pytest.mark.slow
def test_the_embedded_instance_starts_beside_a_live_ray_start_cluster(ray_tmp, tmp_path):
    from distributed import free_port

    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    subprocess.run(
        [
            ray,
            "start",
            "--head",
            "--port",
            str(port),
            "--num-cpus",
            "1",
            "--node-ip-address",
            "127.0.0.1",
            "--include-dashboard",
            "false",
            "--disable-usage-stats",
        ],
        env=env,
        check=True,
        timeout=180,
        capture_output=True,
    )
    assert Path(ray_tmp, "ray", "ray_current_cluster").read_text().strip().endswith(str(port))
    proc = _train(tmp_path / "run", ray_tmp)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # The run had its own instance: its session is not the cluster's, and the cluster still answers.
    session = (tmp_path / "run" / "ray-logs").resolve().parent.name
    cluster_sessions = {p.name for p in Path(ray_tmp, "ray").glob("session_2*")}
    assert session in cluster_sessions and len(cluster_sessions) == 2
    status = subprocess.run(
        [ray, "status", "--address", f"127.0.0.1:{port}"],
        env={**env, "RAY_AUTH_MODE": "token"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert status.returncode == 0, status.stderr


CHECK = r"""
import json, os, subprocess, sys
import psutil
from distrl.strategies.ray_engine import ray_session
from ray._private.authentication.authentication_utils import is_token_auth_enabled

with ray_session("") as ray:
    # the instance listens on loopback only (test_ray_loopback.py): the token guards connections made there
    gcs = "127.0.0.1:" + ray.get_runtime_context().gcs_address.rsplit(":", 1)[1]
    mine = psutil.Process().children(recursive=True)
    from ray._private import worker
    monitors = [info.process for info in worker._global_node.all_processes["monitor"]]
    monitor_alive_at_shutdown = []
    shutdown = ray.shutdown
    def spy_shutdown():
        monitor_alive_at_shutdown.extend(m.poll() is None for m in monitors)
        shutdown()
    ray.shutdown = spy_shutdown
    # A process outside the run: no token in its environment or its home directory.
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = sys.argv[1]
    env["RAY_gcs_server_port_wait_time_s"] = "1"  # one attempt: a refused one is retried each second for 20 s
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep 127.0.0.1 as it is, not the machine's outward address
    outside = subprocess.run([sys.executable, "-c", f"import ray; ray.init(address={gcs!r}); print('connected')"],
                             env=env, capture_output=True, text=True, timeout=120)
    print(json.dumps({"token": is_token_auth_enabled(), "processes": len(mine),
                      "outside_code": outside.returncode, "outside": outside.stdout + outside.stderr[-2000:]}))
print(json.dumps({"monitors": len(monitors), "monitor_alive_at_shutdown": monitor_alive_at_shutdown,
                  "left": [p.pid for p in mine if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]}))
"""


def test_the_embedded_instance_refuses_a_connection_without_its_token_and_stops_at_once(ray_tmp, tmp_path):
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    proc = subprocess.run(
        [sys.executable, "-c", CHECK, str(tmp_path)], env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result, stopped = (json.loads(line) for line in proc.stdout.strip().splitlines()[-2:])
    assert result["token"] is True
    assert result["processes"] >= 2, result
    assert result["outside_code"] != 0 and "connected" not in result["outside"], result["outside"]
    assert "AuthenticationError" in result["outside"] or "token-auth" in result["outside"], result["outside"]
    # the autoscaler monitor was gone before ray.shutdown began (Ray would give it 1 s to ignore its SIGTERM),
    # and nothing of the instance is left after it
    assert stopped["monitors"] == 1 and stopped["monitor_alive_at_shutdown"] == [False], stopped
    assert stopped["left"] == [], stopped
