"""The embedded Ray instance listens on loopback only: every server of its processes (GCS, raylet, the
driver's and the workers' core workers, the agents) binds 127.0.0.1, not every interface. A cluster joined
with an address is left as Ray sets it up.

The session runs in a child process with a Ray temporary directory of its own (RAY_TMPDIR), so that no
other Ray instance of the test session is measured in its place.
"""

import ipaddress
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("ray")
psutil = pytest.importorskip("psutil")

pytestmark = pytest.mark.multiprocess


LISTENERS = r"""
import json, os, time
import psutil
from distrl.strategies.ray_engine import ray_session

with ray_session("", num_cpus=1) as ray:
    node_ip = ray.util.get_node_ip_address()

    @ray.remote
    class Probe:
        def pid(self):
            return os.getpid()

    probe = Probe.remote()
    ray.get(probe.pid.remote())  # a worker process, with its own server, is up
    time.sleep(2)  # the agents the raylet starts bind their ports meanwhile
    me = psutil.Process()
    procs = {me.pid: me, **{p.pid: p for p in me.children(recursive=True)}}
    listeners = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.status == psutil.CONN_LISTEN and conn.pid in procs:
            try:
                cmdline = procs[conn.pid].cmdline()
            except psutil.Error:
                continue
            name = os.path.basename(cmdline[0]).strip() if cmdline else "?"  # gcs_server, raylet, ray::Probe...
            listeners.append({"ip": conn.laddr.ip, "port": conn.laddr.port, "pid": conn.pid,
                              "name": "driver" if conn.pid == me.pid else name})
print(json.dumps({"node_ip": node_ip, "listeners": listeners}))
"""


def _is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped  # ::ffff:127.0.0.1, an IPv6 socket bound to 127.0.0.1 only
    return address.is_loopback


def test_every_server_of_the_embedded_instance_listens_on_loopback_only(ray_tmp):
    """The GCS, the raylet, the driver, the actor's worker and the agents each listen, and all on loopback."""
    env = {**os.environ, "RAY_TMPDIR": ray_tmp}
    proc = subprocess.run([sys.executable, "-c", LISTENERS], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    listeners = result["listeners"]
    assert result["node_ip"] == "127.0.0.1"
    names = {entry["name"] for entry in listeners}
    assert {"gcs_server", "raylet", "driver"} <= names, listeners
    assert any(name.startswith("ray::Probe") for name in names), listeners
    assert [entry for entry in listeners if not _is_loopback(entry["ip"])] == []


def test_only_the_embedded_instance_keeps_its_loopback_address(monkeypatch):
    """Ray keeps 127.0.0.1 as the node address while the embedded instance starts (its local-only mode);
    joining a cluster with an address leaves Ray's setting as it was, and both restore it after."""
    import ray
    import ray._private.ray_constants as constants

    from distrl.strategies import ray_engine

    before = constants.ENABLE_RAY_CLUSTER
    seen = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append(constants.ENABLE_RAY_CLUSTER))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    with ray_engine.ray_session("", debug=True):
        assert constants.ENABLE_RAY_CLUSTER == before
    with ray_engine.ray_session("auto", debug=True):
        pass
    assert seen == [False, before]
    assert constants.ENABLE_RAY_CLUSTER == before
