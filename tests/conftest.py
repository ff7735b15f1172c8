import atexit
import logging
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
# Subprocesses (CLI tests, launched workers) must find the test environments too.
os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
torch.set_num_threads(1)
# Runs the tests write are recorded in a trust store of their own, never in the user's (see distrl.run.trust).
_trust_dir = tempfile.mkdtemp(prefix="distrl-trust-")
atexit.register(shutil.rmtree, _trust_dir, ignore_errors=True)
os.environ["DISTRL_TRUST_STORE"] = os.path.join(_trust_dir, "trusted.json")


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "run"


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for every Ray test of the session (of its xdist worker)."""
    ray = pytest.importorskip("ray")
    from distrl.strategies.ray_engine import loopback_node_address

    with loopback_node_address():  # listening on 127.0.0.1 only, as distrl's embedded instance does
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            logging_level=logging.WARNING,
            log_to_driver=False,
        )
    yield ray
    ray.shutdown()


def pytest_xdist_auto_num_workers(config):
    """`-n auto`: one worker per core this process may run on, at most 4; none (in-process) on one core.

    Many tests start processes of their own (ranks, Ray actors, CLI runs), so a worker per core already keeps every
    core busy, and each worker may hold a Ray instance of its own. PYTEST_XDIST_AUTO_NUM_WORKERS overrides it.
    """
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return int(os.environ["PYTEST_XDIST_AUTO_NUM_WORKERS"])
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return min(cores, 4) if cores > 1 else 0


def pytest_collection_modifyitems(items):
    """Learning tests (``slow``) run for minutes: an hour each before pytest-timeout fails them (420 s for the rest,
    pyproject.toml)."""
    for item in items:
        if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(3600))
