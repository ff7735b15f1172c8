"""A dense layer whose float32 products on the CPU run through oneDNN where that library multiplies faster.

torch multiplies float32 matrices on an x86 CPU with MKL, whose AVX-512 kernels serve Intel's CPUs: on an AMD EPYC of
family 26 (Zen 5) a [256, 256] by [256, 256] product ran at 100 GFLOP/s on one thread through ``torch.mm`` and at 220
through oneDNN (``torch.ops.mkldnn._linear_pointwise``, the kernel torch's compiled CPU graphs call for a linear
layer), and at 7,680 rows 97 against 238. So on such a CPU (:func:`onednn_wins`) a :class:`Dense` layer at least
:data:`WIDE` wide on both sides runs its forward product and both of its backward products through oneDNN, for a batch
of :data:`MIN_PRODUCT` multiply-adds or more; elsewhere, and under autocast, tracing or compiling, it is
``nn.Linear``. The choice is read from the CPU, never timed, so every process of a run makes the same one. ``DISTRL_CPU_GEMM=onednn|aten`` overrides it (to compare the two on one CPU).
The values are float32 products in another summation order: within float32's rounding of ``nn.Linear``'s.
:class:`distrl.nets.core.MLP`, the closed-form networks, takes its wide products the same way.
"""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

import torch
from torch import nn
from torch.autograd.function import once_differentiable

from distrl.config import ConfigError

WIDE = 64
"""The narrowest side of a layer whose products go to oneDNN: at a layer's 1-wide output (a critic's) oneDNN took
three times MKL's time, at a 17-wide input about the same."""
AMD_FAMILY = 26
"""Zen 5, where oneDNN was measured the faster. A Zen 4 (family 25) runs AVX-512 in two 256-bit halves: there oneDNN
took 326 us for a 256 x 256 x 256 product against MKL's 343 and 360 for the weight gradient's against 344, and TD3+BC
ran 87-113 gradient steps/s through it against 127-135 through MKL, IQL 83-89 against 96, so it keeps MKL."""
MIN_PRODUCT = 1 << 22
"""The fewest multiply-adds (rows x in x out) a product goes to oneDNN with: its call costs about 15 us before any
arithmetic against MKL's 2, so at 64 x 64 x 64 it took 18 us against 7.5, at 256 x 64 x 64 about the same, and
from 2,048 x 64 x 64 (8.4 million) half MKL's time (one thread, the Zen 5)."""
OVERRIDE = "DISTRL_CPU_GEMM"
"""The environment variable that chooses the library for every process started after it is set."""


def read_cpuinfo() -> str | None:
    """Linux's /proc/cpuinfo, or None where there is none."""
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return None


def onednn_wins(cpuinfo: str | None, override: str | None = None) -> bool:
    """Whether :class:`Dense` layers multiply through oneDNN on this CPU: ``override`` (``onednn`` or ``aten``) where
    given, else an AMD CPU of family :data:`AMD_FAMILY` or later with AVX-512."""
    if override:
        if override not in ("onednn", "aten"):
            raise ConfigError(f"{OVERRIDE}={override!r} is not a CPU product library: must be 'onednn' or 'aten'")
        return override == "onednn"
    words = set((cpuinfo or "").split())
    family = re.search(r"^cpu family\s*:\s*(\d+)", cpuinfo or "", re.MULTILINE)
    amd = "AuthenticAMD" in words and family is not None and int(family.group(1)) >= AMD_FAMILY
    return amd and "avx512f" in words


@functools.cache
def onednn_products() -> bool:
    """:func:`onednn_wins` for this machine, where this build of torch has oneDNN's linear kernel (read once)."""
    available = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
    return available and onednn_wins(read_cpuinfo(), os.environ.get(OVERRIDE))


def times_transposed(a: torch.Tensor, b: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``a @ b.T (+ bias)`` through oneDNN; ``a`` and ``b`` may be transposed views."""
    return torch.ops.mkldnn._linear_pointwise(a, b, bias, "none", [], "")


class _OneDnnLinear(torch.autograd.Function):
    """``x @ W.T + b`` and its backward, each product through oneDNN: ``dx = g @ W``, ``dW = g.T @ x``."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return times_transposed(x, weight, bias)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight = ctx.saved_tensors
        need_x, need_weight, need_bias = ctx.needs_input_grad
        grad_x = times_transposed(grad, weight.t()) if need_x else None
        grad_weight = times_transposed(grad.t(), x.t()) if need_weight else None
        grad_bias = grad.sum(0) if ctx.has_bias and need_bias else None
        return grad_x, grad_weight, grad_bias


class Dense(nn.Linear):
    """``nn.Linear`` (the same parameters, names and initialisation) whose float32 CPU products run through oneDNN
    where :func:`onednn_products` says so, both its sides are at least :data:`WIDE` and a batch's product is at least
    :data:`MIN_PRODUCT` (acting on a few observations stays with MKL)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True):
        super().__init__(in_features, out_features, bias)
        self.onednn = min(in_features, out_features) >= WIDE and onednn_products()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if (
            self.onednn
            and x.dim() == 2
            and x.shape[0] * self.weight.numel() >= MIN_PRODUCT
            and x.dtype == torch.float32
            and x.device.type == "cpu"
            and not torch.is_autocast_enabled("cpu")
            and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling()
        ):
            return _OneDnnLinear.apply(x, self.weight, self.bias)
        return super().forward(x)
