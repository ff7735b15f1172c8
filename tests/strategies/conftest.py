import logging
import shutil
import tempfile

import pytest

from distributed import kill_processes_naming


@pytest.fixture(scope="session")
def ray_local():
    """One local Ray instance for every Ray test of the session."""
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


@pytest.fixture
def ray_tmp():
    """A short temporary directory for a Ray instance of the test's own (RAY_TMPDIR)."""
    path = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
    yield path
    kill_processes_naming(path)  # a `ray start` cluster of the test, by its temp dir
    shutil.rmtree(path, ignore_errors=True)
