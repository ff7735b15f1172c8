"""SAC's networks as ``torch.nn.Module``s on flat parameter buffers: images, Dict observations, a user's modules.

The same statements of the gradient as the closed-form networks in ``nets/sac.py``:

- the critic gets d(loss)/d(Q1, Q2) per sample and turns it into its parameter gradient with one
  vector-Jacobian product through the module;
- the actor's loss reaches the actor through the critic, and the chain is split at the action:
  ``action_grad`` is a vector-Jacobian product through the critic module with respect to its
  *action input* only (the action enters as a fresh leaf, so nothing flows into the actor or the
  critic's parameters there), and the actor then turns d(loss)/d(action, log-prob) into its own
  parameter gradient with a second one, through the reparameterised, tanh-squashed sample.

Module contracts: the actor's ``forward(obs) -> [B, 2 * action_dim]`` (means, then raw log-stds);
the critic's ``forward(obs, action) -> (q1, q2)``, each [B] or [B, 1]. Observations arrive as for
the on-policy module path (their stored dtype; Dict observations as packed rows).

With ``autocast`` (``--precision bf16``) the modules run under bfloat16 autocast, as the on-policy
module path does: their outputs come back as float32, and the parameters, their gradients, the action
gradient, the losses and Adam stay float32.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from distrl.config import ConfigError
from distrl.nets.core import ParamBuffer, write_grad
from distrl.nets.encoders import MLPHead
from distrl.nets.sac import LOG_STD_MAX, LOG_STD_MIN, squashed_log_prob


def _buffer(module: nn.Module, device: torch.device, extra: dict[str, tuple[int, ...]] | None = None) -> ParamBuffer:
    """A buffer holding ``module``'s parameters (copied in) and the ``extra`` entries."""
    named = dict(module.named_parameters())
    clash = set(named) & set(extra or {})
    if clash:
        raise ConfigError(f"the SAC critic module has parameters named {sorted(clash)}, which distrl adds: rename them")
    params = ParamBuffer({**{n: tuple(p.shape) for n, p in named.items()}, **(extra or {})}, device)
    with torch.no_grad():
        for name, p in named.items():
            params.view(name).copy_(p)
    return params


def _views(params: ParamBuffer, tensor: torch.Tensor, names: list[str]) -> dict[str, torch.Tensor]:
    views = params.views(tensor)
    return {n: views[n] for n in names}


def _autocast(device: torch.device, dtype: torch.dtype | None) -> AbstractContextManager[Any]:
    return torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None)


@dataclass
class ModuleSample:
    """Reparameterised actions ``tanh(mean + std * eps)`` still attached to the actor's graph."""

    action: torch.Tensor  # [B, A]
    log_prob: torch.Tensor  # [B]


class ModuleSquashedActor:
    """A tanh-squashed Gaussian actor over a module; the interface of ``SquashedGaussianActor``."""

    def __init__(self, module: nn.Module, action_dim: int, device: torch.device, autocast: torch.dtype | None = None):
        self.module = module.to(device)
        self.action_dim = action_dim
        self.device = device
        self.autocast = autocast
        self.params = _buffer(module, device)
        self.names = list(self.params.shapes)

    def refresh_acting_copy(self) -> None:
        """Acting reads the buffer itself."""

    def _out(self, obs: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with _autocast(self.device, self.autocast):
            out = functional_call(self.module, _views(self.params, source, self.names), (obs.to(self.device),))
        out = out.float()
        if out.shape[-1] != 2 * self.action_dim:
            raise ConfigError(
                f"the SAC actor module returned {tuple(out.shape)}; it must return "
                f"[batch, {2 * self.action_dim}] (means, then log-stds)"
            )
        return out[:, : self.action_dim], out[:, self.action_dim :]

    @torch.no_grad()
    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        mean, raw_log_std = self._out(torch.as_tensor(obs), self.params.data)
        if noise is None:
            return torch.tanh(mean).cpu().numpy()
        std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
        return torch.tanh(mean + std * torch.as_tensor(noise, device=self.device)).cpu().numpy()

    def sample(self, obs: torch.Tensor, eps: torch.Tensor) -> ModuleSample:
        mean, raw_log_std = self._out(obs, self.params.param)
        log_std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        u = mean + log_std.exp() * eps
        return ModuleSample(torch.tanh(u), squashed_log_prob(u, eps, log_std))

    def backward(self, sample: ModuleSample, d_action: torch.Tensor, d_log_prob: torch.Tensor) -> None:
        """Write the actor's parameter gradient from d(loss)/d(action) [B, A] and d(loss)/d(log_prob) [B]."""
        (grad,) = torch.autograd.grad(
            [sample.action, sample.log_prob],
            [self.params.param],
            [d_action.detach(), d_log_prob.detach()],
            allow_unused=True,
        )
        write_grad(self.params, grad)


@dataclass
class ModuleQForward:
    q1: torch.Tensor  # [B]
    q2: torch.Tensor  # [B]
    action: torch.Tensor  # [B, A] the leaf the Q values were computed from


class ModuleTwinQ:
    """Twin Q functions over one module; ``extra`` entries (log alpha) share its buffer, as for ``TwinQ``.

    The target critic is a second instance over the same module: the module is only structure.
    """

    def __init__(
        self,
        module: nn.Module,
        device: torch.device,
        extra: dict[str, tuple[int, ...]] | None = None,
        autocast: torch.dtype | None = None,
    ):
        self.module = module.to(device)
        self.device = device
        self.autocast = autocast
        self.params = _buffer(module, device, extra)
        self.names = [n for n, _ in module.named_parameters()]

    def _q(self, obs: torch.Tensor, action: torch.Tensor, source: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with _autocast(self.device, self.autocast):
            q1, q2 = functional_call(
                self.module, _views(self.params, source, self.names), (obs.to(self.device), action)
            )
        return q1.reshape(-1).float(), q2.reshape(-1).float()

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> ModuleQForward:
        leaf = action.detach().requires_grad_(True)
        q1, q2 = self._q(obs, leaf, self.params.param)
        return ModuleQForward(q1, q2, leaf)

    @torch.no_grad()
    def min_q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.minimum(*self._q(obs, action, self.params.data))

    def backward(self, fwd: ModuleQForward, d_q1: torch.Tensor, d_q2: torch.Tensor) -> None:
        """Write the Q functions' parameter gradients (the ``extra`` entries are left to the caller)."""
        (grad,) = torch.autograd.grad(
            [fwd.q1, fwd.q2], [self.params.param], [d_q1.detach(), d_q2.detach()], allow_unused=True
        )
        write_grad(self.params, grad)

    def action_grad(self, fwd: ModuleQForward, d_q1: torch.Tensor, d_q2: torch.Tensor) -> torch.Tensor:
        """d(loss)/d(action) [B, A] through both Q functions, leaving parameter gradients alone."""
        (grad,) = torch.autograd.grad([fwd.q1, fwd.q2], [fwd.action], [d_q1.detach(), d_q2.detach()])
        return grad


class SACActorModule(nn.Module):
    """encoder → MLP → [means, log-stds]."""

    def __init__(self, encoder: nn.Module, action_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.encoder = encoder
        self.head = MLPHead((int(encoder.features_dim), *net_arch, 2 * action_dim), activation)  # type: ignore[arg-type]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(obs))


class TwinQModule(nn.Module):
    """Two Q functions over one encoder: encoder → [features, action] → an MLP each (clipped double Q).

    Both Q losses train the shared encoder; it runs once per critic call, not twice."""

    def __init__(self, encoder: nn.Module, action_dim: int, net_arch: tuple[int, ...], activation: str):
        super().__init__()
        self.encoder = encoder
        self.heads = nn.ModuleList(
            MLPHead((int(encoder.features_dim) + action_dim, *net_arch, 1), activation)  # type: ignore[arg-type]
            for _ in range(2)
        )

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.cat([self.encoder(obs), action], -1)
        q1, q2 = (head(inputs) for head in self.heads)
        return q1, q2
