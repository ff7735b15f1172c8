"""Networks over one flat parameter buffer, with hand-written backward passes.

Small RL networks spend most of their update time in per-operation overhead, not
in arithmetic (docs/architecture.md, "Why a flat buffer and closed-form gradients").
distrl keeps every parameter of a model in one contiguous tensor and every gradient
in another, so that averaging gradients over workers is one all-reduce, clipping is
one norm and Adam is a handful of element-wise operations. Algorithms state the
gradient of their loss with respect to each sample's log-probability, entropy and
value; the functions here carry it through the distribution heads and the MLP
trunks. ``tests/test_nets.py`` and ``tests/algos/`` check every gradient against
autograd.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from gymnasium import spaces

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


class ParamBuffer:
    """Named parameters laid out in one flat tensor, gradients in another of equal size."""

    def __init__(self, shapes: dict[str, tuple[int, ...]], device: torch.device | str = "cpu"):
        self.shapes = dict(shapes)
        self.offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, shape in self.shapes.items():
            size = math.prod(shape)
            self.offsets[name] = (start, start + size)
            start += size
        self.size = start
        self.param = torch.nn.Parameter(torch.zeros(start, device=device))
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

    def grad_view(self, name: str) -> torch.Tensor:
        start, end = self.offsets[name]
        return self.grad[start:end].view(self.shapes[name])

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {name: self.view(name).detach().cpu().clone() for name in self.shapes}

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.shapes) - set(state)
        unexpected = set(state) - set(self.shapes)
        if missing or unexpected:
            raise KeyError(f"parameter names differ: missing {sorted(missing)}, unexpected {sorted(unexpected)}")
        for name, tensor in state.items():
            if tuple(tensor.shape) != self.shapes[name]:
                raise ValueError(f"{name}: shape {tuple(tensor.shape)} != {self.shapes[name]}")
            self.view(name).copy_(tensor)


def mlp_shapes(prefix: str, sizes: tuple[int, ...]) -> dict[str, tuple[int, ...]]:
    """Parameter shapes of an MLP with layer widths ``sizes`` (input first, output last)."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        shapes[f"{prefix}.{i}.weight"] = (fan_in, fan_out)  # [in, out]: x @ W, no transpose
        shapes[f"{prefix}.{i}.bias"] = (fan_out,)
    return shapes


class MLP:
    """Dense layers with tanh or ReLU between them and a linear output, over buffer views."""

    def __init__(self, params: ParamBuffer, prefix: str, sizes: tuple[int, ...], activation: str):
        self.params = params
        self.sizes = sizes
        self.activation = activation
        n = len(sizes) - 1
        self.weights = [params.view(f"{prefix}.{i}.weight") for i in range(n)]
        self.weights_t = [w.t() for w in self.weights]  # views: they follow in-place updates
        self.biases = [params.view(f"{prefix}.{i}.bias") for i in range(n)]
        self.weight_grads = [params.grad_view(f"{prefix}.{i}.weight") for i in range(n)]
        self.bias_grads = [params.grad_view(f"{prefix}.{i}.bias") for i in range(n)]
        self._act = torch.tanh if activation == "tanh" else torch.relu

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

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            x = torch.addmm(bias, x, weight)
            if i < last:
                x = self._act(x)
        return x

    def forward_cached(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Output and the input of every layer, for :meth:`backward`."""
        inputs = []
        last = len(self.weights) - 1
        for i, (weight, bias) in enumerate(zip(self.weights, self.biases)):
            inputs.append(x)
            x = torch.addmm(bias, x, weight)
            if i < last:
                x = self._act(x)
        return x, inputs

    def backward(self, inputs: list[torch.Tensor], grad_out: torch.Tensor, accumulate: bool = True,
                 input_grad: bool = False) -> torch.Tensor | None:
        """Add (or, with ``accumulate=False``, write) d(loss)/d(parameters) into the buffer.

        Returns d(loss)/d(input) when ``input_grad`` is set, else None.
        """
        grad = grad_out
        for i in range(len(self.weights) - 1, -1, -1):
            if accumulate:
                self.weight_grads[i].addmm_(inputs[i].t(), grad)
                self.bias_grads[i].add_(grad.sum(0))
            else:
                torch.mm(inputs[i].t(), grad, out=self.weight_grads[i])
                torch.sum(grad, 0, out=self.bias_grads[i])
            if i == 0 and not input_grad:
                return None
            grad = grad.mm(self.weights_t[i])
            if i > 0:  # inputs[i] is the activation output of layer i - 1
                if self.activation == "tanh":
                    grad = torch.ops.aten.tanh_backward(grad, inputs[i])
                else:
                    grad = torch.ops.aten.threshold_backward(grad, inputs[i], 0.0)
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


# ---- distributions: log-probabilities, entropies and their gradients ----
#
# Algorithms give the gradient of their loss with respect to each sample's log-prob
# and entropy; these functions turn it into gradients of the head outputs.


@dataclass
class CategoricalTerms:
    log_prob: torch.Tensor   # [B]
    entropy: torch.Tensor    # [B]
    log_p: torch.Tensor      # [B, K] log-softmax of the logits
    p: torch.Tensor          # [B, K]


def categorical_terms(logits: torch.Tensor, actions: torch.Tensor) -> CategoricalTerms:
    """Log-probability of integer ``actions`` [B] under ``logits`` [B, K], and the entropy."""
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    log_prob = log_p.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    entropy = -(p * log_p).sum(-1)
    return CategoricalTerms(log_prob, entropy, log_p, p)


def categorical_grad(terms: CategoricalTerms, actions: torch.Tensor, d_log_prob: torch.Tensor,
                     d_entropy: torch.Tensor | None) -> torch.Tensor:
    """d(loss)/d(logits) [B, K] from d(loss)/d(log_prob) [B] and d(loss)/d(entropy) [B].

    d log p_a / d z_j = [a = j] - p_j, and d H / d z_j = -p_j (log p_j + H).
    """
    grad = terms.p * (-d_log_prob).unsqueeze(1)
    grad.scatter_add_(1, actions.long().unsqueeze(1), d_log_prob.unsqueeze(1))
    if d_entropy is not None:
        grad -= terms.p * (terms.log_p + terms.entropy.unsqueeze(1)) * d_entropy.unsqueeze(1)
    return grad


@dataclass
class GaussianTerms:
    log_prob: torch.Tensor   # [B]
    entropy: torch.Tensor    # [B]
    z: torch.Tensor          # [B, A] standardised actions (a - mean) / std
    std: torch.Tensor        # [A]


def gaussian_terms(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> GaussianTerms:
    """Diagonal Gaussian log-density of ``actions`` [B, A] and entropy [B]; log_std is [A]."""
    std = log_std.exp()
    z = (actions - mean) / std
    log_prob = (-0.5 * z.square()).sum(-1) - (log_std.sum() + _LOG_SQRT_2PI * mean.shape[1])
    entropy = (0.5 + _LOG_SQRT_2PI + log_std).sum().expand(mean.shape[0])
    return GaussianTerms(log_prob, entropy, z, std)


def gaussian_grad(terms: GaussianTerms, d_log_prob: torch.Tensor,
                  d_entropy: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """d(loss)/d(mean) [B, A] and d(loss)/d(log_std) [A].

    d log N / d mean = z / std, d log N / d log_std = z^2 - 1, d H / d log_std = 1.
    """
    d = d_log_prob.unsqueeze(1)
    d_mean = d * terms.z / terms.std
    d_log_std = (d * (terms.z.square() - 1.0)).sum(0)
    if d_entropy is not None:
        d_log_std += d_entropy.sum()
    return d_mean, d_log_std


@dataclass
class TrainForward:
    """A training forward pass: head outputs and the trunk caches for the backward pass."""

    head: torch.Tensor
    """Logits [B, K] or Gaussian means [B, A]."""
    values: torch.Tensor
    """Critic values [B]."""
    policy_inputs: list[torch.Tensor]
    critic_inputs: list[torch.Tensor]
class ActorCritic:
    """Separate policy and critic MLPs; a categorical or state-independent-std Gaussian policy."""

    def __init__(self, obs_dim: int, action_space: spaces.Space, net_arch: tuple[int, ...] = (64, 64),
                 activation: str = "tanh", log_std_init: float = 0.0, ortho_init: bool = True,
                 device: torch.device | str = "cpu", seed: int = 0):
        self.discrete = isinstance(action_space, spaces.Discrete)
        if self.discrete:
            assert isinstance(action_space, spaces.Discrete)
            self.action_dim = int(action_space.n)
            self.low = self.high = None
        else:
            assert isinstance(action_space, spaces.Box)
            self.action_dim = int(np.prod(action_space.shape))
            self.low = action_space.low.astype(np.float32)
            self.high = action_space.high.astype(np.float32)
        self.obs_dim = obs_dim
        self.device = torch.device(device)
        policy_sizes = (obs_dim, *net_arch, self.action_dim)
        critic_sizes = (obs_dim, *net_arch, 1)
        shapes = {**mlp_shapes("policy", policy_sizes), **mlp_shapes("critic", critic_sizes)}
        if not self.discrete:
            shapes["policy.log_std"] = (self.action_dim,)
        self.params = ParamBuffer(shapes, self.device)
        self.policy = MLP(self.params, "policy", policy_sizes, activation)
        self.critic = MLP(self.params, "critic", critic_sizes, activation)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            if ortho_init:
                self.policy.init_orthogonal(math.sqrt(2), 0.01, generator)
                self.critic.init_orthogonal(math.sqrt(2), 1.0, generator)
            else:
                self.policy.init_uniform(generator)
                self.critic.init_uniform(generator)
            if not self.discrete:
                self.params.view("policy.log_std").fill_(log_std_init)
        # Acting reads the weights through numpy views of a CPU buffer: the parameter buffer
        # itself on the CPU, a copy refreshed after each update otherwise.
        self._acting: ParamBuffer = self.params
        if self.device.type != "cpu":
            self._acting = ParamBuffer(self.params.shapes, "cpu")
            self.refresh_acting_copy()
        self._acting_policy = MLP(self._acting, "policy", policy_sizes, activation).numpy_forward()
        self._acting_log_std = None if self.discrete else self._acting.view("policy.log_std").numpy()

    def refresh_acting_copy(self) -> None:
        """Copy updated weights to the CPU acting copy (no-op when training on the CPU)."""
        if self._acting is not self.params:
            self._acting.data.copy_(self.params.data)

    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """Actions for a batch of (normalised) observations.

        ``noise`` is the randomness of sampling, drawn by the caller so that it depends on
        the environment and not on how environments are split over workers: uniforms [B]
        for a categorical policy (inverse-CDF sampling), standard normals [B, A] for a
        Gaussian policy. ``None`` acts deterministically (argmax or mean). Gaussian
        actions are returned unclipped; :meth:`env_action` clips them to the bounds.
        """
        out = self._acting_policy(obs)
        if self.discrete:
            if noise is None:
                return out.argmax(-1)
            probs = np.exp(out - out.max(-1, keepdims=True))
            cdf = np.cumsum(probs, -1)
            return np.minimum((noise[:, None] * cdf[:, -1:] > cdf).sum(-1), self.action_dim - 1)
        if noise is None:
            return out
        return out + np.exp(self._acting_log_std) * noise

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """The action to send to the env: Gaussian samples clipped to the action bounds."""
        if self.discrete:
            return action
        return np.clip(action, self.low, self.high)

    def noise_shape(self) -> tuple[int, ...]:
        """Shape of the per-step sampling noise of one environment (see :meth:`act`)."""
        return () if self.discrete else (self.action_dim,)

    @torch.no_grad()
    def values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(obs).squeeze(-1)

    @torch.no_grad()
    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self.dist_terms(self.policy(obs), actions).log_prob

    def dist_terms(self, head: torch.Tensor, actions: torch.Tensor) -> CategoricalTerms | GaussianTerms:
        """Log-probabilities and entropies of ``actions`` under the head outputs."""
        if self.discrete:
            return categorical_terms(head, actions)
        return gaussian_terms(head, self.params.view("policy.log_std"), actions)

    def forward_train(self, obs: torch.Tensor) -> TrainForward:
        """Both trunks, keeping what :meth:`backward` needs."""
        head, policy_inputs = self.policy.forward_cached(obs)
        values, critic_inputs = self.critic.forward_cached(obs)
        return TrainForward(head, values.squeeze(-1), policy_inputs, critic_inputs)

    def backward(self, fwd: TrainForward, terms: CategoricalTerms | GaussianTerms, actions: torch.Tensor,
                 d_log_prob: torch.Tensor, d_entropy: torch.Tensor | None, d_values: torch.Tensor) -> None:
        """Write the parameter gradients given d(loss)/d(log_prob, entropy, value) per sample.

        Every parameter receives exactly one contribution, so the buffer is overwritten
        rather than accumulated into (no zeroing pass needed).
        """
        if isinstance(terms, CategoricalTerms):
            d_head = categorical_grad(terms, actions, d_log_prob, d_entropy)
        else:
            d_head, d_log_std = gaussian_grad(terms, d_log_prob, d_entropy)
            self.params.grad_view("policy.log_std").copy_(d_log_std)
        self.policy.backward(fwd.policy_inputs, d_head, accumulate=False)
        self.critic.backward(fwd.critic_inputs, d_values.unsqueeze(1), accumulate=False)
