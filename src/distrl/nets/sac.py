"""Soft Actor-Critic networks: a tanh-squashed Gaussian actor and twin Q critics.

Both live in flat parameter buffers with closed-form backward passes below their outputs, like the PPO
actor-critic: SAC's losses are written plainly in ``algos/sac.py``, autograd over them gives
d(loss)/d(action), d(loss)/d(log_prob) and d(loss)/d(q), and the ``backward`` methods here carry those to
the parameters. ``tests/algos/test_sac.py`` checks every gradient against autograd through the whole network.
Actions are in [-1, 1]; the trainer rescales them to the env's bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from distrl.nets.core import MLP, ParamBuffer, mlp_shapes
from distrl.nets.distributions import LOG_SQRT_2PI

LOG_STD_MIN, LOG_STD_MAX = -20.0, 2.0
_LOG2 = math.log(2.0)


@dataclass
class SquashedSample:
    """Reparameterised samples ``a = tanh(mean + std * eps)`` with what the backward pass needs."""

    action: torch.Tensor  # [B, A] in (-1, 1)
    log_prob: torch.Tensor  # [B]
    eps: torch.Tensor  # [B, A]
    std: torch.Tensor  # [B, A]
    in_range: torch.Tensor  # [B, A] whether the raw log-std was inside [LOG_STD_MIN, LOG_STD_MAX]
    inputs: list[torch.Tensor]


def squashed_log_prob(u: torch.Tensor, eps: torch.Tensor, log_std: torch.Tensor) -> torch.Tensor:
    """log pi(tanh(u)) for u = mean + std * eps: Gaussian density minus log|d tanh/du|.

    ``log(1 - tanh(u)^2) = 2 (log 2 - u - softplus(-2u))``, which stays finite where
    tanh(u) rounds to +-1 (https://arxiv.org/abs/1801.01290, appendix C).
    """
    gaussian = -0.5 * eps.square() - log_std - LOG_SQRT_2PI
    log_det = 2.0 * (_LOG2 - u - F.softplus(-2.0 * u))
    return (gaussian - log_det).sum(-1)


class SquashedGaussianActor:
    """MLP obs -> [mean, log_std] (state dependent), squashed by tanh."""

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        net_arch: tuple[int, ...],
        activation: str,
        device: torch.device,
        seed: int,
        matmul_dtype: torch.dtype | None = None,
    ):
        """``matmul_dtype``: see :class:`MLP` (acting, one observation at a time in numpy, stays float32)."""
        self.obs_dim, self.action_dim = obs_dim, action_dim
        sizes = (obs_dim, *net_arch, 2 * action_dim)
        self.params = ParamBuffer(mlp_shapes("actor", sizes), device)
        self.net = MLP(self.params, "actor", sizes, activation, matmul_dtype)
        with torch.no_grad():
            self.net.init_uniform(torch.Generator().manual_seed(seed))
        self._acting = self.params if device.type == "cpu" else ParamBuffer(self.params.shapes, "cpu")
        self._numpy = MLP(self._acting, "actor", sizes, activation).numpy_forward()
        self.refresh_acting_copy()

    def refresh_acting_copy(self) -> None:
        if self._acting is not self.params:
            self._acting.data.copy_(self.params.data)

    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """Actions in [-1, 1] for a batch of observations; ``noise=None`` gives tanh(mean)."""
        out = self._numpy(obs)
        mean = out[:, : self.action_dim]
        if noise is None:
            return np.tanh(mean)
        log_std = np.clip(out[:, self.action_dim :], LOG_STD_MIN, LOG_STD_MAX)
        return np.tanh(mean + np.exp(log_std) * noise)

    def sample(self, obs: torch.Tensor, eps: torch.Tensor) -> SquashedSample:
        out, inputs = self.net.forward_cached(obs)
        mean, raw_log_std = out[:, : self.action_dim], out[:, self.action_dim :]
        log_std = raw_log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
        std = log_std.exp()
        u = mean + std * eps
        action = torch.tanh(u)
        in_range = (raw_log_std > LOG_STD_MIN) & (raw_log_std < LOG_STD_MAX)
        return SquashedSample(action, squashed_log_prob(u, eps, log_std), eps, std, in_range, inputs)

    def backward(self, sample: SquashedSample, d_action: torch.Tensor, d_log_prob: torch.Tensor) -> None:
        """Write parameter gradients from d(loss)/d(action) [B, A] and d(loss)/d(log_prob) [B].

        With eps fixed: da/du = 1 - a^2, d log_pi/du = 2a, d log_pi/d log_std = -1 (direct),
        du/d mean = 1, du/d log_std = std * eps.
        """
        a = sample.action
        d_lp = d_log_prob.unsqueeze(1)
        d_u = d_action * (1.0 - a.square()) + 2.0 * a * d_lp
        d_log_std = (d_u * sample.std * sample.eps - d_lp) * sample.in_range
        self.net.backward(sample.inputs, torch.cat([d_u, d_log_std], 1), accumulate=False)


@dataclass
class TwinQForward:
    q1: torch.Tensor  # [B]
    q2: torch.Tensor  # [B]
    inputs1: list[torch.Tensor]
    inputs2: list[torch.Tensor]


class TwinQ:
    """Two Q networks on [obs, action] (clipped double Q, Fujimoto et al. 2018).

    ``extra`` adds named parameters to the same buffer (SAC keeps log(alpha) there, so the
    critic and the entropy coefficient share one gradient sync and one Adam step).
    """

    def __init__(
        self,
        obs_dim: int,
        action_dim: int,
        net_arch: tuple[int, ...],
        activation: str,
        device: torch.device,
        seed: int,
        extra: dict[str, tuple[int, ...]] | None = None,
        matmul_dtype: torch.dtype | None = None,
    ):
        self.obs_dim = obs_dim
        sizes = (obs_dim + action_dim, *net_arch, 1)
        shapes = {**mlp_shapes("q1", sizes), **mlp_shapes("q2", sizes), **(extra or {})}
        self.params = ParamBuffer(shapes, device)
        self.q1 = MLP(self.params, "q1", sizes, activation, matmul_dtype)
        self.q2 = MLP(self.params, "q2", sizes, activation, matmul_dtype)
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed + 1)
            self.q1.init_uniform(generator)
            self.q2.init_uniform(generator)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> TwinQForward:
        x = torch.cat([obs, action], 1)
        q1, inputs1 = self.q1.forward_cached(x)
        q2, inputs2 = self.q2.forward_cached(x)
        return TwinQForward(q1.squeeze(1), q2.squeeze(1), inputs1, inputs2)

    @torch.no_grad()
    def min_q(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        x = torch.cat([obs, action], 1)
        return torch.minimum(self.q1(x), self.q2(x)).squeeze(1)

    def backward(self, fwd: TwinQForward, d_q1: torch.Tensor, d_q2: torch.Tensor) -> None:
        """Write the Q networks' parameter gradients (other entries of the buffer untouched)."""
        self.q1.backward(fwd.inputs1, d_q1.unsqueeze(1), accumulate=False)
        self.q2.backward(fwd.inputs2, d_q2.unsqueeze(1), accumulate=False)

    def action_grad(self, fwd: TwinQForward, d_q1: torch.Tensor, d_q2: torch.Tensor) -> torch.Tensor:
        """d(loss)/d(action) [B, A] through both Q networks, leaving parameter gradients alone."""
        g1 = self.q1.backward(fwd.inputs1, d_q1.unsqueeze(1), input_grad=True, param_grads=False)
        g2 = self.q2.backward(fwd.inputs2, d_q2.unsqueeze(1), input_grad=True, param_grads=False)
        assert g1 is not None and g2 is not None
        return (g1 + g2)[:, self.obs_dim :]
