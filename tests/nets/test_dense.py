"""Dense layers whose float32 CPU products may run through oneDNN: which CPUs choose it, and the same values and
gradients as ``nn.Linear`` either way."""

import pytest
import torch
from torch import nn

from distrl.config import ConfigError
from distrl.nets.dense import Dense, onednn_wins
from distrl.nets.offline import mlp

AMD = "vendor_id : AuthenticAMD\ncpu family : 26\nflags : fpu sse2 avx avx2 fma {}\n"
ZEN4 = "vendor_id : AuthenticAMD\ncpu family\t: 25\nflags : fpu sse2 avx avx2 fma avx512f avx512_bf16\n"
INTEL = "vendor_id : GenuineIntel\nflags : fpu sse2 avx avx2 fma {}\n"
ONEDNN = torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
needs_onednn = pytest.mark.skipif(not ONEDNN, reason="this build of torch has no oneDNN linear kernel")


@pytest.mark.parametrize(
    "cpuinfo, override, chosen",
    [
        (AMD.format("avx512f avx512bw avx512_bf16 avx512_vp2intersect"), None, True),  # Zen 5
        (ZEN4, None, False),  # AVX-512 in two halves: not measured, MKL kept
        (AMD.format(""), None, False),  # AVX2 alone: MKL's and oneDNN's kernels the same width
        (INTEL.format("avx512f avx512bw amx_bf16"), None, False),  # MKL's own AVX-512 kernels
        (None, None, False),  # no /proc/cpuinfo
        (INTEL.format("avx512f"), "onednn", True),
        (AMD.format("avx512f"), "aten", False),
    ],
    ids=["zen5", "zen4", "amd-avx2", "intel", "unknown", "forced-onednn", "forced-aten"],
)
def test_onednn_is_chosen_on_zen5_and_later_amd_cpus_with_avx512_unless_overridden(cpuinfo, override, chosen):
    assert onednn_wins(cpuinfo, override) is chosen


def test_an_unknown_override_is_one_line_naming_the_variable():
    with pytest.raises(ConfigError, match=r"^DISTRL_CPU_GEMM='mkl' is not a CPU product library: must be 'onednn'"):
        onednn_wins(AMD.format("avx512f"), "mkl")


def pair(sizes, onednn):
    """A :func:`mlp` and a copy of its weights with every layer's oneDNN path on (wide ones) or off."""
    torch.manual_seed(0)
    net = mlp(sizes, "relu")
    for layer in net:
        if isinstance(layer, Dense):
            layer.onednn = onednn and min(layer.in_features, layer.out_features) >= 64
    return net


@needs_onednn
def test_onednn_products_give_linears_values_and_gradients_through_an_mlp():
    """A critic's shape (17 inputs, two 256-wide layers, one output) over 600 rows, run in chunks of rows: the
    output, the input's gradient and every weight's and bias's within float32's rounding of ``nn.Linear``'s, and not
    all equal to the bit (the middle layer did go through the other library)."""
    sizes = (17, 256, 256, 1)
    fast, plain = pair(sizes, True), pair(sizes, False)
    assert [type(layer) for layer in fast] == [Dense, nn.ReLU, Dense, nn.ReLU, Dense]
    assert [getattr(layer, "onednn", None) for layer in fast] == [False, None, True, None, False]
    x = torch.randn(600, 17)
    results = []
    for net in (fast, plain):
        inputs = x.clone().requires_grad_()
        out = net(inputs)
        (out * torch.linspace(-1, 1, 600)[:, None]).sum().backward()
        results.append([out.detach(), inputs.grad] + [p.grad for p in net.parameters()])
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert any(not torch.equal(ours, theirs) for ours, theirs in zip(*results))


@needs_onednn
def test_a_dense_layer_goes_back_to_linear_under_autocast_and_tracing_and_for_a_frozen_input():
    layer = Dense(64, 64)
    layer.onednn = True
    x = torch.randn(8, 64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16  # autocast's product, not the float32 one
    traced = torch.jit.trace(layer, (x,), check_trace=False)
    assert "mkldnn" not in str(traced.graph)  # an export graph holds plain linear layers
    torch.testing.assert_close(traced(x), nn.functional.linear(x, layer.weight, layer.bias))
    out = layer(x)  # an input that needs no gradient: the weights' alone
    out.sum().backward()
    torch.testing.assert_close(layer.weight.grad, torch.ones(64, 8) @ x)
    torch.testing.assert_close(layer.bias.grad, torch.full((64,), 8.0))
