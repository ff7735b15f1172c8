import os
import sys
from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
sys.path.insert(0, str(TESTS))
# Subprocesses (CLI tests, launched workers) must find the test environments too.
os.environ["PYTHONPATH"] = os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
torch.set_num_threads(1)


@pytest.fixture
def run_dir(tmp_path):
    return tmp_path / "run"
