"""Whether ``--precision bf16`` pays on this machine's CPU, and the note a run gives where it does not."""

from __future__ import annotations

from pathlib import Path

import torch

from distrl.config import RunConfig, StrategyConfig


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this machine's CPU computes in bfloat16 natively, read from Linux's /proc/cpuinfo: x86 with
    AVX-512 BF16 or AMX, Arm with its BF16 extension. None where that cannot be told (no /proc/cpuinfo)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    words = set(cpuinfo.split())
    if "flags" in words:  # x86
        return bool(words & {"avx512_bf16", "amx_bf16"})
    if "Features" in words:  # Arm
        return "bf16" in words
    return None


def bf16_emulated_note(
    run: RunConfig, strategy: StrategyConfig | None = None, cpuinfo: str | None = None
) -> str | None:
    """A note for a bf16 run whose networks run on a CPU that would emulate bfloat16, else None.

    Such a CPU runs bfloat16 products on slow fallback paths (``benchmarks/bf16_cpu.py`` measures how slow).
    The actors of ``actor-learner`` and ``pipeline`` run on the CPUs whatever ``--device`` says; no ``strategy``
    is ``single``."""
    if run.precision != "bf16" or cpu_has_native_bf16(cpuinfo) is not False:
        return None
    cpu_actors = strategy is not None and strategy.strategy in ("actor-learner", "pipeline")
    if not cpu_actors and run.device != "cpu" and torch.cuda.is_available():
        return None
    return (
        "precision=bf16: this CPU has no native bfloat16 arithmetic (x86: AVX-512 BF16 or AMX; Arm: BF16), so the "
        "networks bf16 applies to are emulated and can run about ten times slower than with --precision fp32"
    )
