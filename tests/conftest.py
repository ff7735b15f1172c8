import os
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
os.environ["DISTRL_TRUST_STORE"] = os.path.join(tempfile.mkdtemp(prefix="distrl-trust-"), "trusted.json")


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "run"
