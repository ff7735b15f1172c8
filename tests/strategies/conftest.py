import shutil
import tempfile

import pytest

from distributed import kill_processes_naming


@pytest.fixture
def ray_tmp():
    """A short temporary directory for a Ray instance of the test's own (RAY_TMPDIR)."""
    path = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths live under it
    yield path
    kill_processes_naming(path)  # a `ray start` cluster of the test, by its temp dir
    shutil.rmtree(path, ignore_errors=True)
