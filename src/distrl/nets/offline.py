"""The offline algorithms' networks, as ``torch.nn`` modules: policies and critics over flat observations.

They run autograd end to end (the module path of DESIGN's contract): each algorithm binds a module's parameters
to one flat buffer (:func:`~distrl.nets.core.bind_module`), so the gradient sync, Adam, the start-up broadcast
and checkpoints see a buffer, as for every other network. Actions are in [-1, 1]; the trainer rescales the
dataset's and the policy's to and from the env's bounds. Layers start as ``torch.nn.Linear`` does, as in the
methods' reference implementations.
"""

from __future__ import annotations

import torch
from torch import nn

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
"""The range of a Gaussian policy's log standard deviation (IQL's reference)."""


def mlp(sizes: tuple[int, ...], activation: str) -> nn.Sequential:
    """Dense layers of ``sizes`` (input first, output last) with ``activation`` between them, a linear output."""
    act = nn.ReLU if activation == "relu" else nn.Tanh
    layers: list[nn.Module] = []
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        layers.append(nn.Linear(fan_in, fan_out))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


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
        mean = self(obs)
        log_std = self.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        return torch.distributions.Normal(mean, log_std.exp()).log_prob(actions).sum(-1)


class TwinCritic(nn.Module):
    """Two Q networks of (s, a), each an MLP of the concatenation."""

    def __init__(self, obs_dim: int, action_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.q1 = mlp((obs_dim + action_dim, *net_arch, 1), activation)
        self.q2 = mlp((obs_dim + action_dim, *net_arch, 1), activation)

    def forward(self, obs: torch.Tensor, actions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, actions], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class ValueNet(nn.Module):
    """V(s), an MLP."""

    def __init__(self, obs_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.net = mlp((obs_dim, *net_arch, 1), activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs).squeeze(-1)
