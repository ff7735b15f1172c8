"""SAC's three losses fused: the values of :func:`~distrl.algos.sac.critic_loss`,
:func:`~distrl.algos.sac.temperature_loss` and :func:`~distrl.algos.sac.actor_loss` and their derivatives with
respect to the networks' outputs, in closed form, without autograd.

SAC's losses are a handful of element-wise operations on B-element tensors, but each gradient step takes three
autograd passes over them (critic, entropy coefficient, actor), whose bookkeeping costs more than the arithmetic:
on Pendulum-v1, 1 thread on a 2-core machine with nothing else running, SAC ran 130 steps a second with these
closed forms against 117 through autograd, 11% faster (``benchmarks/sac_vs_sb3.py``'s SPS child, seeds 0-4,
alternating, medians; docs/benchmarks.md). The plain losses in ``algos/sac.py`` stay the definitions a reader
finds; this module computes the same values and the gradients the networks' backward passes take, and the tests
hold the two together (``torch.autograd.gradcheck`` in float64, equality with autograd on the plain losses in
float32). ``SACConfig.fused_loss=False`` runs the plain losses through autograd instead.

The derivation, per sample, with ``y`` the critic target, ``l`` the log-probability of the reparameterised action,
``H`` the target entropy and ``alpha`` the entropy coefficient (``y``, ``H`` and ``alpha`` are constants, and so
is ``l`` in the temperature loss, where the plain loss takes it detached)::

    critic       L_Q = 1/2 sum_i ((q1_i - y_i)^2 + (q2_i - y_i)^2)
                 dL_Q/dq1 = q1 - y,  dL_Q/dq2 = q2 - y
    temperature  L_a = -sum_i log_alpha (l_i + H)
                 dL_a/dlog_alpha = -sum_i (l_i + H)          (so L_a = log_alpha dL_a/dlog_alpha)
    actor        L_pi = sum_i (alpha l_i - min(q1_i, q2_i))
                 dL_pi/dl = alpha
                 dL_pi/dq1 = -1 where q1 < q2, 0 where q1 > q2, -1/2 where q1 = q2 (and dL_pi/dq2 = -1 - dL_pi/dq1)

A min takes the derivative of its smaller argument. At a tie it gives half to each, the subgradient autograd gives
``torch.min(q1, q2)`` (and ``torch.minimum``), so that the two paths agree everywhere; it is also what a central
difference sees at a tie, which is why ``gradcheck`` passes there. (SAC's closed form before the losses were
written plainly gave the whole -1 to ``q1`` at a tie.)
"""

from __future__ import annotations

from typing import Any

import torch


def fused_critic_loss(
    q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """:func:`~distrl.algos.sac.critic_loss` and d(loss)/d(q1, q2), all [B] (see the module's docstring). The
    arguments carry no graph: detach the critic's outputs first (or go through :class:`CriticLossFunction`)."""
    grad_q1, grad_q2 = q1 - target, q2 - target
    loss = 0.5 * (grad_q1.square() + grad_q2.square()).sum()
    return loss, (grad_q1, grad_q2)


def fused_temperature_loss(
    log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float
) -> tuple[torch.Tensor, tuple[torch.Tensor]]:
    """:func:`~distrl.algos.sac.temperature_loss` and d(loss)/d(log_alpha), with ``log_alpha`` a scalar and
    ``log_prob`` [B] (see the module's docstring). The arguments carry no graph."""
    grad_log_alpha = (log_prob + target_entropy).sum().neg_()
    return log_alpha * grad_log_alpha, (grad_log_alpha,)


def fused_actor_loss(
    log_prob: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, alpha: float
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    """:func:`~distrl.algos.sac.actor_loss` and d(loss)/d(log_prob, q1, q2), all [B] (see the module's docstring:
    -1 to the smaller Q-value, -1/2 to each at a tie, as autograd gives ``torch.min``). The arguments carry no
    graph."""
    grad_q1 = (q1 < q2).to(q1.dtype).add_((q1 == q2).to(q1.dtype), alpha=0.5).neg_()
    grad_q2 = grad_q1.neg().sub_(1.0)  # -1 - grad_q1: 0, -1 or -1/2, exactly
    loss = (alpha * log_prob - torch.minimum(q1, q2)).sum()
    return loss, (torch.full_like(log_prob, alpha), grad_q1, grad_q2)


class CriticLossFunction(torch.autograd.Function):
    """:func:`fused_critic_loss` as an autograd function of (q1, q2): the loss forward, its closed-form derivative
    backward (none to the target, a constant). For ``gradcheck``."""

    @staticmethod
    def forward(ctx: Any, q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        loss, grads = fused_critic_loss(q1, q2, target)
        ctx.save_for_backward(*grads)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_q1, grad_q2 = ctx.saved_tensors
        return grad_loss * grad_q1, grad_loss * grad_q2, None


class TemperatureLossFunction(torch.autograd.Function):
    """:func:`fused_temperature_loss` as an autograd function of log_alpha (log_prob and the target entropy are
    constants, as in the plain loss's use). For ``gradcheck``."""

    @staticmethod
    def forward(ctx: Any, log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
        loss, (grad_log_alpha,) = fused_temperature_loss(log_alpha, log_prob, target_entropy)
        ctx.save_for_backward(grad_log_alpha)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        (grad_log_alpha,) = ctx.saved_tensors
        return grad_loss * grad_log_alpha, None, None


class ActorLossFunction(torch.autograd.Function):
    """:func:`fused_actor_loss` as an autograd function of (log_prob, q1, q2) (alpha a constant). For
    ``gradcheck``."""

    @staticmethod
    def forward(ctx: Any, log_prob: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, alpha: float) -> torch.Tensor:
        loss, grads = fused_actor_loss(log_prob, q1, q2, alpha)
        ctx.save_for_backward(*grads)
        return loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_log_prob, grad_q1, grad_q2 = ctx.saved_tensors
        return grad_loss * grad_log_prob, grad_loss * grad_q1, grad_loss * grad_q2, None
