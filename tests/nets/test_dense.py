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
def test_a_dense_layer_goes_back_to_linear_under_autocast_and_tracing_and_for_small_batches():
    from distrl.nets.dense import MIN_PRODUCT

    layer = Dense(64, 64)
    layer.onednn = True
    x = torch.randn(1024, 64)  # 1,024 x 64 x 64 multiply-adds: MIN_PRODUCT, through oneDNN
    assert x.shape[0] * 64 * 64 == MIN_PRODUCT
    plain = nn.functional.linear(x, layer.weight, layer.bias)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert layer(x).dtype == torch.bfloat16  # autocast's product, not the float32 one
    traced = torch.jit.trace(layer, (x,), check_trace=False)
    assert "mkldnn" not in str(traced.graph)  # an export graph holds plain linear layers
    assert torch.equal(traced(x), plain)
    few = layer(x[:8])  # acting on a few rows: torch's own product, to the bit
    assert type(few.grad_fn).__name__ == "AddmmBackward0" and torch.equal(few, plain[:8])
    out = layer(x)  # an input that needs no gradient: the weights' alone
    assert type(out.grad_fn).__name__ == "_OneDnnLinearBackward"
    torch.testing.assert_close(out, plain)
    out.sum().backward()
    torch.testing.assert_close(layer.weight.grad, torch.ones(64, 1024) @ x, rtol=1e-5, atol=1e-4)  # sums of 1,024
    torch.testing.assert_close(layer.bias.grad, torch.full((64,), 1024.0))


@needs_onednn
@pytest.mark.parametrize("accumulate", [True, False])
def test_the_closed_form_mlp_multiplies_wide_batches_through_onednn_to_float32s_rounding(accumulate):
    """distrl's closed-form MLP (PPO's, SAC's, DQN's) with oneDNN on and off, from the same weights: the output, the
    buffer's gradients (added to what is there, or written) and the input's gradient within float32's rounding, the
    wide layers' not all equal to the bit; a batch under MIN_PRODUCT (acting) goes through torch.mm, to the bit."""
    from distrl.nets.core import MLP, ParamBuffer, mlp_shapes
    from distrl.nets.dense import MIN_PRODUCT

    sizes = (11, 256, 256, 3)
    results = []
    for onednn in (True, False):
        torch.manual_seed(0)
        params = ParamBuffer(mlp_shapes("m", sizes))
        net = MLP(params, "m", sizes, "relu")
        net.init_uniform(torch.Generator().manual_seed(0))
        params.grad.fill_(0.5)
        net.onednn = [onednn and min(w.shape) >= 64 for w in net.weights]
        assert net.onednn == [False, onednn, False]
        x, upstream = torch.randn(256, 11), torch.randn(256, 3)
        with torch.no_grad():
            out, inputs = net.forward_cached(x)
            grad_x = net.backward(inputs, upstream, accumulate=accumulate, input_grad=True)
            acting = net(x[:4])
        assert 4 * 256 * 256 < MIN_PRODUCT
        results.append([out, params.grad.clone(), grad_x, acting])
    for ours, theirs in zip(*results):
        torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-5)
    assert not torch.equal(results[0][0], results[1][0]) and not torch.equal(results[0][1], results[1][1])
    assert torch.equal(results[0][3], results[1][3])
