"""Reward functions that cost time, for ``benchmarks/reward_workers.py``: the reversal reward of
``tests/distrl_lm.py`` plus 5 ms per sample, either waited (a remote judge, a sandbox round trip) or
computed (a CPU-bound checker). Importable as ``bench_rewards:waiting`` with ``benchmarks/`` and ``tests/`` on
``PYTHONPATH``."""

from __future__ import annotations

import time

from distrl_lm import reversal

COST_S = 0.005
"""What each sample costs on top of the reversal reward."""


def waiting(prompts: list[str], completions: list[str], answer: list[str], **fields: object) -> list[float]:
    """The reversal reward after sleeping ``COST_S`` per sample: wall time that leaves the core free."""
    time.sleep(COST_S * len(completions))
    return reversal(prompts, completions, answer)


def computing(prompts: list[str], completions: list[str], answer: list[str], **fields: object) -> list[float]:
    """The reversal reward after ``COST_S`` of busy CPU per sample."""
    end = time.perf_counter() + COST_S * len(completions)
    while time.perf_counter() < end:
        pass
    return reversal(prompts, completions, answer)
