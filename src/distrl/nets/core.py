"""Networks over one flat parameter buffer, with closed-form backward passes below their outputs.

Small RL networks spend most of their update time in per-operation overhead, not
in arithmetic (docs/architecture.md, "Why a flat buffer and closed-form gradients").
distrl keeps every parameter of a model in one contiguous tensor and every gradient
in another, so that averaging gradients over workers is one all-reduce, clipping is
one norm and Adam is a handful of element-wise operations.

The contract: an algorithm writes its loss plainly in ``algos/`` (``ppo_loss``, ``sac``'s, ``dqn``'s) as a
function of the network's outputs; autograd over that small graph gives d(loss)/d(outputs)
(:func:`distrl.algos.autodiff.output_grads`: per sample, d(loss)/d(log_prob), d(loss)/d(entropy),
d(loss)/d(value) or d(loss)/d(Q)). The backward passes here take those and carry them, in closed form,
through the distribution heads (:mod:`distrl.nets.distributions`) and the MLP trunks into the gradient
buffer. Nothing here knows a loss. ``tests/nets/test_nets.py`` and ``tests/algos/`` check every gradient
against autograd through the whole network.
"""

from __future__ import annotations

import hashlib
import math

import numpy as np
import torch

from distrl.nets.dense import MIN_PRODUCT, WIDE, onednn_products, times_transposed


class ParamBuffer:
    """Named parameters laid out in one flat tensor, gradients in another of equal size."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], device: torch.device | str = "cpu", with_grad: bool = True):
        """``with_grad=False``: no gradient buffer (a copy that only acts, such as a generator's)."""
        self.shapes = dict(shapes)
        self.offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            self.offsets[name] = (start, start + size)
            start += size
        self.size = start
        self.param = torch.nn.Parameter(torch.zeros(start, device=device), requires_grad=with_grad)
        if with_grad:
            self.param.grad = torch.zeros(start, device=device)

    @property
    def data(self) -> torch.Tensor:
        return self.param.data

    @property
    def grad(self) -> torch.Tensor:
        assert self.param.grad is not None
        return self.param.grad

    def view(self, name: str) -> torch.Tensor:
        start, end = self.offsets[name]
        return self.data[start:end].view(self.shapes[name])

    def views(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """Every parameter as a view of ``tensor`` (the data, or the parameter itself for autograd to reach it).

        One split, not a slice per parameter: autograd then writes the flat gradient once, where each
        slice's backward filled a zeroed buffer of the whole size and added it in (18 full-size fills and
        adds per minibatch of a small CNN's 322,885 floats cost 26% of its steps)."""
        sizes = [end - start for start, end in self.offsets.values()]
        parts = torch.split(tensor, sizes)
        return {name: part.view(shape) for (name, shape), part in zip(self.shapes.items(), parts)}

    def grad_view(self, name: str) -> torch.Tensor:
        start, end = self.offsets[name]
        return self.grad[start:end].view(self.shapes[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: self.view(name).detach().cpu().clone() for name in self.shapes}

    def flat(self) -> np.ndarray:
        """A float32 copy of every parameter, the form weights travel in."""
        return self.data.detach().cpu().numpy().copy()

    def load_flat(self, flat: np.ndarray) -> None:
        """Overwrite every parameter from :meth:`flat`'s form (read-only arrays, as Ray hands them over, too)."""
        if flat.shape != (self.size,):
            raise ValueError(f"flat weights of shape {flat.shape} for a buffer of {self.size} parameters")
        if self.data.device.type == "cpu":
            self.data.numpy()[:] = flat
        else:
            self.data.copy_(torch.tensor(flat))

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.shapes) - set(state)
        unexpected = set(state) - set(self.shapes)
        if missing or unexpected:
            raise KeyError(f"parameter names differ: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, tensor in state.items():
            if tuple(tensor.shape) != self.shapes[name]:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {self.shapes[name]}")
            self.view(name).copy_(tensor)


def bind_module(
    module: torch.nn.Module, device: torch.device | str = "cpu", with_grad: bool = True, trainable_only: bool = False
) -> ParamBuffer:
    """Move a module's parameters into one :class:`ParamBuffer`, in place.

    Each parameter's data becomes a view of the buffer and its ``.grad`` a view of the buffer's
    gradient, so the module runs as it is (``model.generate``, ``save_pretrained``), Adam's step
    on the buffer updates it, and a backward pass accumulates into the flat gradient in place
    (autograd adds into an existing ``.grad`` rather than replacing it; torch's DDP relies on
    the same with ``gradient_as_bucket_view``). Tied parameters are one parameter, bound once.
    Weights become float32: the buffer is the master copy (autocast runs bf16 arithmetic on it).
    ``with_grad=False`` binds the weights only, for a copy that never learns.
    ``trainable_only=True`` binds only the parameters that require a gradient (a LoRA adapter's, its base
    model frozen): the others stay where and as they are, outside the buffer, so the optimizer, the
    gradient sync, weight transfers and checkpoints never see them.
    """
    module.to(device)
    named = {name: p for name, p in module.named_parameters() if p.requires_grad or not trainable_only}
    params = ParamBuffer({name: tuple(p.shape) for name, p in named.items()}, device, with_grad)
    with torch.no_grad():
        for name, p in named.items():
            params.view(name).copy_(p)
            p.data = params.view(name)
            if with_grad:
                p.grad = params.grad_view(name)
            else:
                p.requires_grad_(False)
    return params


def checksum(tensor: torch.Tensor) -> str:
    """A short hex digest of a tensor's bytes, for logs, tests and comparing replicas."""
    return hashlib.sha256(tensor.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]


def write_grad(params: ParamBuffer, grad: torch.Tensor | None) -> None:
    """Overwrite the buffer's gradient with an autograd result (zero when no output depended on it)."""
    if grad is None:
        params.grad.zero_()
    else:
        params.grad.copy_(grad)


def mlp_shapes(prefix: str, sizes: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of an MLP with layer widths ``sizes`` (input first, output last)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        shapes[f"{prefix}.{i}.weight"] = (fan_in, fan_out)  # [in, out]: x @ W, no transpose
        shapes[f"{prefix}.{i}.bias"] = (fan_out,)
    return shapes


def fast_tanh(x: torch.Tensor) -> torch.Tensor:
    """tanh of a tensor outside autograd; on the CPU through numpy, which was 7x faster than torch's here
    (6.5 us against 45 us for a 256x64 float32 batch, torch 2.13 on one thread) and agrees to 1 ulp."""
    if x.device.type == "cpu" and not x.requires_grad:
        return torch.from_numpy(np.tanh(x.numpy()))
    return torch.tanh(x)


class MLP:
    """Dense layers with tanh or ReLU between them and a linear output, over buffer views.

    ``matmul_dtype=torch.bfloat16`` multiplies in bfloat16 (forward and backward): each product's operands
    are rounded to bfloat16, its result comes back as float32, and everything else (biases, activations,
    gradients in the buffer, the weights themselves) stays float32. On a CPU with AVX-512 BF16 a 256x256
    product ran 4x faster. The weights are cast at every product, so whatever writes the buffer (Adam, a
    Polyak update, a broadcast) is seen at once. In float32 on a CPU where oneDNN multiplies faster than MKL
    (:func:`~distrl.nets.dense.onednn_products`), a layer at least ``WIDE`` on both sides takes a batch's products of
    ``MIN_PRODUCT`` multiply-adds or more through oneDNN, outside autograd.
    """

    def __init__(
        self,
        params: ParamBuffer,
        prefix: str,
        sizes: tuple[int, ...],
        activation: str,
        matmul_dtype: torch.dtype | None = None,
    ):
        self.params = params
        self.sizes = sizes
        self.activation = activation
        n = len(sizes) - 1
        self.weights = [params.view(f"{prefix}.{i}.weight") for i in range(n)]
        self.weights_t = [w.t() for w in self.weights]  # views: they follow in-place updates
        self.biases = [params.view(f"{prefix}.{i}.bias") for i in range(n)]
        self.weight_grads = [params.grad_view(f"{prefix}.{i}.weight") for i in range(n)]
        self.bias_grads = [params.grad_view(f"{prefix}.{i}.bias") for i in range(n)]
        self._act = fast_tanh if activation == "tanh" else torch.Tensor.relu_  # on a layer's own new output
        self.matmul_dtype = matmul_dtype if matmul_dtype != torch.float32 else None
        # float32 CPU layers wide on both sides multiply through oneDNN where it is the faster (nets/dense.py)
        self.onednn = [
            self.matmul_dtype is None
            and w.device.type == "cpu"
            and w.dtype == torch.float32
            and min(w.shape) >= WIDE
            and onednn_products()
            for w in self.weights
        ]

    def _onednn(self, rows: torch.Tensor, i: int) -> bool:
        """Whether layer ``i``'s product over ``rows``' batch goes to oneDNN (:mod:`distrl.nets.dense`)."""
        return self.onednn[i] and rows.shape[0] * self.weights[i].numel() >= MIN_PRODUCT

    def _layer(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if self._onednn(x, i) and not (torch.is_grad_enabled() and (x.requires_grad or self.weights[i].requires_grad)):
            return times_transposed(x, self.weights_t[i], self.biases[i])
        if self.matmul_dtype is None:
            return torch.addmm(self.biases[i], x, self.weights[i])
        return torch.mm(x.to(self.matmul_dtype), self.weights[i].to(self.matmul_dtype)).float().add_(self.biases[i])

    def init_orthogonal(self, hidden_gain: float, output_gain: float, generator: torch.Generator) -> None:
        """Orthogonal weights, zero biases (Engstrom et al. 2020, "Implementation Matters")."""
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            gain = output_gain if i == len(self.weights) - 1 else hidden_gain
            w = torch.empty(weight.shape[1], weight.shape[0])
            torch.nn.init.orthogonal_(w, gain=gain, generator=generator)
            weight.copy_(w.t())
            bias.zero_()

    def init_uniform(self, generator: torch.Generator) -> None:
        """U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for weights and biases, as torch.nn.Linear does."""
        for weight, bias in zip(self.weights, self.biases):
            bound = 1.0 / math.sqrt(weight.shape[0])
            weight.copy_(torch.empty(weight.shape).uniform_(-bound, bound, generator=generator))
            bias.copy_(torch.empty(bias.shape).uniform_(-bound, bound, generator=generator))

    @torch.no_grad()
    def copy_linears(
        self, linears: list[torch.nn.Linear], in_mean: torch.Tensor | None = None, in_std: torch.Tensor | None = None
    ) -> None:
        """Take the weights of ``torch.nn.Linear`` layers, in order, the shapes of this MLP's.

        With ``in_mean`` and ``in_std`` (of the first ``len(in_mean)`` inputs), the layers were trained on those
        inputs standardised, ``(x - mean) / std``; the first layer takes the standardisation in, so that this MLP
        of the raw inputs computes what they computed: ``W ((x - m) / s) + b = (W / s) x + (b - W (m / s))``.
        """
        if len(linears) != len(self.weights):
            raise ValueError(f"{len(linears)} linear layers for an MLP of {len(self.weights)}")
        for weight, bias, linear in zip(self.weights, self.biases, linears):
            if linear.weight.t().shape != weight.shape:
                raise ValueError(f"a layer of {tuple(linear.weight.t().shape)} for one of {tuple(weight.shape)}")
            weight.copy_(linear.weight.t())  # this MLP keeps [in, out]
            bias.copy_(linear.bias)
        if in_mean is not None and in_std is not None:
            n = len(in_mean)
            first = self.weights[0]
            self.biases[0].sub_((in_mean / in_std).to(first.dtype) @ first[:n])
            first[:n].div_(in_std.to(first.dtype).unsqueeze(1))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.weights) - 1
        for i in range(last + 1):
            x = self._layer(x, i)
            if i < last:
                x = self._act(x)
        return x

    def forward_cached(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Output and the input of every layer, for :meth:`backward`."""
        inputs = []
        last = len(self.weights) - 1
        for i in range(last + 1):
            inputs.append(x)
            x = self._layer(x, i)
            if i < last:
                x = self._act(x)
        return x, inputs

    def backward(
        self,
        inputs: list[torch.Tensor],
        grad_out: torch.Tensor,
        accumulate: bool = True,
        input_grad: bool = False,
        param_grads: bool = True,
    ) -> torch.Tensor | None:
        """Add (or, with ``accumulate=False``, write) d(loss)/d(parameters) into the buffer.

        Returns d(loss)/d(input) when ``input_grad`` is set, else None. With
        ``param_grads=False`` only the input gradient is computed (the buffer is untouched).
        """
        low = self.matmul_dtype
        grad = grad_out
        for i in range(len(self.weights) - 1, -1, -1):
            onednn = self._onednn(grad, i)
            if not param_grads:
                pass
            elif low is not None or onednn:  # a product of its own, then into the buffer
                if low is not None:
                    product = torch.mm(inputs[i].t().to(low), grad.to(low)).float()
                else:
                    product = times_transposed(inputs[i].t(), grad.t())
                if accumulate:
                    self.weight_grads[i].add_(product)
                    self.bias_grads[i].add_(grad.sum(0))
                else:
                    self.weight_grads[i].copy_(product)
                    torch.sum(grad, 0, out=self.bias_grads[i])
            elif accumulate:
                self.weight_grads[i].addmm_(inputs[i].t(), grad)
                self.bias_grads[i].add_(grad.sum(0))
            else:
                torch.mm(inputs[i].t(), grad, out=self.weight_grads[i])
                torch.sum(grad, 0, out=self.bias_grads[i])
            if i == 0 and not input_grad:
                return None
            if onednn:
                grad = times_transposed(grad, self.weights[i])
            elif low is None:
                grad = grad.mm(self.weights_t[i])
            else:
                grad = grad.to(low).mm(self.weights_t[i].to(low)).float()
            if i > 0:  # inputs[i] is the activation output of layer i - 1; grad is a new product, ours to change
                if self.activation == "tanh":
                    torch.ops.aten.tanh_backward.grad_input(grad, inputs[i], grad_input=grad)
                else:
                    torch.ops.aten.threshold_backward.grad_input(grad, inputs[i], 0.0, grad_input=grad)
        return grad

    def numpy_forward(self) -> NumpyMLP:
        """A numpy view of this MLP (CPU only): the same weights, far less per-call overhead."""
        return NumpyMLP([w.numpy() for w in self.weights], [b.numpy() for b in self.biases], self.activation)


class NumpyMLP:
    """Forward pass over numpy views of an :class:`MLP`'s weights, for acting step by step.

    Acting runs on a handful of observations at a time, where a torch call's fixed cost
    (several microseconds) exceeds the arithmetic; numpy's is a fraction of that.
    """

    def __init__(self, weights: list[np.ndarray], biases: list[np.ndarray], activation: str):
        self.layers = list(zip(weights, biases))
        self.tanh = activation == "tanh"

    def __call__(self, x: np.ndarray) -> np.ndarray:
        last = len(self.layers) - 1
        for i, (weight, bias) in enumerate(self.layers):
            x = x @ weight
            x += bias
            if i < last:
                x = np.tanh(x, out=x) if self.tanh else np.maximum(x, 0.0, out=x)
        return x
