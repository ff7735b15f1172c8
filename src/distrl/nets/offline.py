"""The offline algorithms' networks, as ``torch.nn`` modules: policies and critics over flat observations.

They run autograd end to end (the module path of DESIGN's contract): each algorithm binds a module's parameters
to one flat buffer (:func:`~distrl.nets.core.bind_module`), so the gradient sync, Adam, the start-up broadcast
and checkpoints see a buffer, as for every other network. Actions are in [-1, 1]; the trainer rescales the
dataset's and the policy's to and from the env's bounds. Layers start as ``torch.nn.Linear`` does, as in the
methods' reference implementations.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from distrl.nets.dense import Dense
from distrl.nets.distributions import gaussian_terms

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
"""The range of a policy's log standard deviation (CORL's IQL and SAC; the IQL authors' code clips at -5)."""


CHUNK_BYTES = 1 << 19
"""On a CPU an :class:`MLP` runs a batch in chunks of rows whose widest layer's output is at most this many bytes
(512 KiB, half of a 1 MiB L2 cache): 512 rows of a 256-wide float32 layer, 1,024 in bfloat16. Each layer's output
is then read by the next while still in cache, where a 7,680-row pass (CQL's sampled actions) streams every
activation through memory and runs its products at 83 GFLOP/s against 100 at 512 rows. One CQL step on one thread of
a Zen 4 core: 7.7-8.5 steps/s in one pass, 10.0-10.3 in chunks (benchmarks/offline_vs_d3rlpy.py, docs/benchmarks.md)."""


class MLP(nn.Sequential):
    """Dense layers with an activation between them. With ``low_precision`` (``--precision bf16``) its products run
    under that dtype's autocast (float32 weights and gradients, operands rounded) and it returns float32, so every
    loss is worked in float32. On a CPU a batch of more rows than :data:`CHUNK_BYTES` allows goes through in chunks:
    each row's values as in one pass, to rounding."""

    low_precision: torch.dtype | None = None

    def __init__(self, *layers: nn.Module):
        super().__init__(*layers)
        self.width = max(layer.out_features for layer in layers if isinstance(layer, nn.Linear))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.low_precision is None:
            return self._rows(x, CHUNK_BYTES // (4 * self.width))
        with torch.autocast(x.device.type, dtype=self.low_precision):
            out = self._rows(x, CHUNK_BYTES // (self.low_precision.itemsize * self.width))
        return out.float()

    def _rows(self, x: torch.Tensor, rows: int) -> torch.Tensor:
        layers = super().forward
        if x.dim() < 2 or x.shape[0] <= rows or x.device.type != "cpu" or torch.jit.is_tracing():
            return layers(x)
        return torch.cat([layers(part) for part in x.split(rows)])


def mlp(sizes: tuple[int, ...], activation: str) -> MLP:
    """Dense layers of ``sizes`` (input first, output last) with ``activation`` between them, a linear output.

    ReLU works in place on the layer's output, which no backward pass needs (a dense layer's keeps its input): the
    same values without a new activation tensor per layer, about 5% of TD3+BC's step. The layers are
    :class:`~distrl.nets.dense.Dense`: ``nn.Linear``, with their float32 CPU products through oneDNN on the CPUs where
    it multiplies faster than torch's MKL."""
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(Dense(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(nn.ReLU(inplace=True) if activation == "relu" else nn.Tanh())
    return MLP(*layers)


def set_low_precision(module: nn.Module, dtype: torch.dtype | None) -> None:
    """Run every :class:`MLP` in ``module`` under ``dtype``'s autocast (None: float32 throughout)."""
    for part in module.modules():
        if isinstance(part, MLP):
            part.low_precision = dtype


class DeterministicActor(nn.Module):
    """``a = tanh(MLP(s))``: TD3's policy, and behaviour cloning's for Box actions."""

    def __init__(self, obs_dim: int, action_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.net = mlp((obs_dim, *net_arch, action_dim), activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.net(obs))


class CategoricalActor(nn.Module):
    """The logits of a categorical policy: behaviour cloning's for Discrete actions."""

    def __init__(self, obs_dim: int, n_actions: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.net = mlp((obs_dim, *net_arch, n_actions), activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class GaussianActor(nn.Module):
    """A Gaussian policy with mean ``tanh(MLP(s))`` and a learned, state-independent log standard deviation
    (IQL's); it acts with its mean."""

    def __init__(self, obs_dim: int, action_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.net = mlp((obs_dim, *net_arch, action_dim), activation)
        self.log_std = nn.Parameter(torch.zeros(action_dim))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The mean action."""
        return torch.tanh(self.net(obs))

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """[B] log-density of ``actions`` [B, A]."""
        return gaussian_terms(self(obs), self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX), actions).log_prob


class SquashedGaussianActor(nn.Module):
    """``a = tanh(u)``, ``u ~ N(mean(s), std(s))``: SAC's policy (CQL's), both from one MLP; it acts with
    ``tanh(mean)``."""

    def __init__(self, obs_dim: int, action_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.action_dim = action_dim
        self.net = mlp((obs_dim, *net_arch, 2 * action_dim), activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """The mode's action, ``tanh(mean)``."""
        return torch.tanh(self.net(obs)[..., : self.action_dim])

    def sample(self, obs: torch.Tensor, eps: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Reparameterised actions ``tanh(mean + std eps)`` [..., A] for noise ``eps`` (standard normal, the shape of
        the actions) and their log-densities [...], with tanh's change of variables. ``eps`` [B, N, A] for ``obs``
        [B, D] draws N actions per state from one forward pass."""
        out = self.net(obs)
        if eps.dim() == obs.dim() + 1:
            out = out.unsqueeze(-2)
        mean, log_std = out[..., : self.action_dim], out[..., self.action_dim :].clamp(LOG_STD_MIN, LOG_STD_MAX)
        u = mean + log_std.exp() * eps
        action = torch.tanh(u)
        # log N(u) - log(1 - tanh(u)^2), the latter as 2 (log 2 - u - softplus(-2u)), stable for large |u|
        log_prob = (-0.5 * eps.square() - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
        log_prob = log_prob - (2.0 * (math.log(2.0) - u - nn.functional.softplus(-2.0 * u))).sum(-1)
        return action, log_prob


class QNetwork(nn.Module):
    """Q(s, .) over Discrete actions, an MLP with one output per action."""

    def __init__(self, obs_dim: int, n_actions: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.net = mlp((obs_dim, *net_arch, n_actions), activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class LogScalar(nn.Module):
    """One learned scalar, kept as its logarithm (an entropy coefficient, CQL's alpha')."""

    def __init__(self, value: float):
        super().__init__()
        self.log_value = nn.Parameter(torch.tensor([math.log(value)]))

    def forward(self) -> torch.Tensor:
        return self.log_value[0]


class TwinCritic(nn.Module):
    """Two Q networks of (s, a), each an MLP of the concatenation."""

    def __init__(self, obs_dim: int, action_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.q1 = mlp((obs_dim + action_dim, *net_arch, 1), activation)
        self.q2 = mlp((obs_dim + action_dim, *net_arch, 1), activation)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q1 and Q2 [...] of observations and actions [..., D] and [..., A]. Inputs of more than two dimensions
        (CQL's sampled actions, [B, N, A]) go through the layers as one [B N, D + A] matrix: the layers' outputs are
        then whole tensors, not views, which an in-place ReLU would make autograd copy."""
        x = torch.cat([obs, actions], dim=-1)
        flat = x.reshape(-1, x.shape[-1])
        return self.q1(flat).view(x.shape[:-1]), self.q2(flat).view(x.shape[:-1])

    def first(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """The first critic's values alone (TD3's actor follows it)."""
        return self.q1(torch.cat([obs, actions], dim=-1)).squeeze(-1)


class ValueNet(nn.Module):
    """V(s), an MLP."""

    def __init__(self, obs_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.net = mlp((obs_dim, *net_arch, 1), activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)
