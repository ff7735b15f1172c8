"""A training process keeps the memory it frees (glibc's thresholds fixed), so a step's products do not come
back as fresh pages from the kernel."""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys

import pytest

from distrl.config import RunConfig
from distrl.training import state

# Rounds of sixteen 256 KiB arrays (the size of a 256x256 float32 product) allocated, written and freed:
# with glibc's own thresholds the freed top of the heap goes back to the kernel at every round, and each round
# faults its pages in again; with the thresholds fixed, only the first round does.
PATTERN = """
import json, resource, sys
import numpy as np
from distrl.training.malloc import keep_freed_memory

def faults_per_round(rounds=20):
    faults = []
    for _ in range(rounds):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        arrays = [np.ones(65536, np.float32) for _ in range(16)]
        del arrays
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    return faults[1:]

default = faults_per_round()
took = keep_freed_memory()
faults_per_round(1)  # the first round after faults its pages in once
kept = faults_per_round()
print(json.dumps({"default": default, "took": took, "kept": kept, "torch": "torch" in sys.modules}))
"""


@pytest.mark.skipif(
    sys.platform != "linux" or platform.libc_ver()[0] != "glibc", reason="glibc's thresholds: Linux with glibc only"
)
def test_freed_memory_stays_in_the_process_for_the_next_allocations() -> None:
    out = subprocess.run([sys.executable, "-c", PATTERN], capture_output=True, text=True, timeout=60, check=True)
    result = json.loads(out.stdout)
    assert result["took"] is True
    assert not result["torch"]  # a process can set it before torch allocates anything
    assert statistics.median(result["default"]) > 500  # 4 MiB of fresh pages a round: 1,024 pages
    assert max(result["kept"]) < 20


@pytest.mark.parametrize("keep", [True, False])
def test_a_run_fixes_the_thresholds_unless_told_not_to(monkeypatch: pytest.MonkeyPatch, keep: bool) -> None:
    calls: list[bool] = []
    monkeypatch.setattr(state, "keep_freed_memory", lambda: calls.append(True) or True)
    state.set_cpu_options(RunConfig(algo="ppo", env="CartPole-v1", keep_freed_memory=keep))
    assert calls == ([True] if keep else [])
