"""Whether ``--precision bf16`` pays on this machine's CPU, and the note a run gives where it does not.

The CPU's flags do not tell: a Xeon with AVX-512 BF16 and no AMX multiplied in bfloat16 at a third of its float32
rate, an AMD EPYC with the same flag at twice it. So a bf16 run times one product of each precision as it starts
(about a tenth of a second, most of it the first bfloat16 kernel built) and says so where bfloat16's is the slower."""

from __future__ import annotations

import time

import torch

from distrl.config import RunConfig, StrategyConfig
from distrl.nets.dense import read_cpuinfo

SIDE = 256
"""The products timed are SIDE x SIDE by SIDE x SIDE: a hidden layer's weights against a batch of 256."""
SLOWER = 1.2
"""The bfloat16 product's time over float32's above which a run says bf16 is slower here (below it, noise)."""


def cpu_has_native_bf16(cpuinfo: str | None = None) -> bool | None:
    """Whether this machine's CPU says it computes in bfloat16, read from Linux's /proc/cpuinfo: x86 with AVX-512
    BF16 or AMX, Arm with its BF16 extension. None where that cannot be told (no /proc/cpuinfo). A flag is not
    speed: :func:`product_seconds` measures."""
    if cpuinfo is None:
        cpuinfo = read_cpuinfo()
        if cpuinfo is None:
            return None
    words = set(cpuinfo.split())
    if "flags" in words:  # x86
        return bool(words & {"avx512_bf16", "amx_bf16"})
    if "Features" in words:  # Arm
        return "bf16" in words
    return None


def product_seconds(rounds: int = 5, products: int = 4) -> tuple[float, float]:
    """Seconds one SIDE-square matrix product takes on the CPU in float32 and in bfloat16, each the median of
    ``rounds`` rounds of ``products``, the precisions alternating, after one warm-up product each (oneDNN builds
    its kernels on the first). The operands come from a generator of their own: the run's random streams are
    left as they were."""
    generator = torch.Generator().manual_seed(0)
    operands = {
        dtype: (
            torch.rand(SIDE, SIDE, generator=generator).to(dtype),
            torch.rand(SIDE, SIDE, generator=generator).to(dtype),
        )
        for dtype in (torch.float32, torch.bfloat16)
    }
    times: dict[torch.dtype, list[float]] = {dtype: [] for dtype in operands}
    for a, b in operands.values():
        torch.mm(a, b)
    for _ in range(rounds):
        for dtype, (a, b) in operands.items():
            started = time.perf_counter()
            for _ in range(products):
                torch.mm(a, b)
            times[dtype].append((time.perf_counter() - started) / products)
    fp32, bf16 = (sorted(times[dtype])[rounds // 2] for dtype in operands)
    return fp32, bf16


def bf16_slow_note(run: RunConfig, strategy: StrategyConfig | None = None) -> str | None:
    """A note for a bf16 run whose networks run on a CPU that multiplies slower in bfloat16 than in float32,
    else None (and nothing timed where bf16 is not asked for or the networks are on a GPU).

    The actors of ``actor-learner`` and ``pipeline`` run on the CPUs whatever ``--device`` says; no ``strategy``
    is ``single``. ``benchmarks/bf16_cpu.py`` measures a whole network's step."""
    if run.precision != "bf16":
        return None
    cpu_actors = strategy is not None and strategy.strategy in ("actor-learner", "pipeline")
    if not cpu_actors and run.device != "cpu" and torch.cuda.is_available():
        return None
    fp32, bf16 = product_seconds()
    if bf16 <= SLOWER * fp32:
        return None
    return (
        f"precision=bf16: on this CPU a {SIDE}x{SIDE} product took {bf16 * 1e6:,.0f} us in bfloat16 against "
        f"{fp32 * 1e6:,.0f} us in float32 ({bf16 / fp32:.1f}x), so the networks bf16 applies to run slower than "
        "with --precision fp32"
    )
