"""PPO's loss fused: the value of :func:`distrl.algos.ppo.ppo_loss` and its derivative in closed form, in one pass.

Autograd over PPO's own small graph (a dozen element-wise operations on B-element tensors) costs more than its
arithmetic: 145-160 µs a minibatch on a 2-core machine against about 16 µs in closed form
(``benchmarks/loss_autograd_cost.py``), a fifth of a run at the zoo's CartPole settings. :func:`ppo_loss` in
``algos/ppo.py`` stays the definition a reader finds; this module computes the same loss and the gradients the
network's backward pass takes, d(loss)/d(log_prob, entropy, value), and the tests hold the two together
(``torch.autograd.gradcheck`` in float64, and equality with autograd on ``ppo_loss`` in float32).
``PPOConfig.fused_loss=False`` runs the plain loss through autograd instead.

The derivation, per sample, with weight ``w`` (1 on valid samples, 0 elsewhere; the loss is their weighted sum),
``r = exp(l - l_old)`` the ratio of the log-probability ``l``, ``A`` the advantage, ``e`` the clip range::

    policy   p = max(u, c),  u = -A r,  c = -A clip(r, 1 - e, 1 + e)
             du/dl = -A r                        (dr/dl = r)
             dc/dl = -A r  where 1 - e <= r <= 1 + e, else 0 (clip passes the gradient at its bounds)
    value    s = (v - R)^2,  ds/dv = 2 (v - R);  with clip_range_vf = f:
             q = (v_c - R)^2,  v_c = v_old + clip(v - v_old, -f, f),  dq/dv = 2 (v_c - R) where |v - v_old| <= f
             value = max(s, q)
    loss     sum_i w_i (p_i + vf_coef value_i - ent_coef entropy_i)

    d loss/d l       = w (dp/dl)
    d loss/d v       = w vf_coef (d value/dv)
    d loss/d entropy = -w ent_coef   (none at all when ent_coef is 0: the loss does not use the entropy)

A max takes the derivative of its larger argument. At a tie it takes half of each, the subgradient autograd gives
``torch.max``, so that the two paths agree everywhere. For the policy a tie happens only where the two branches are
the same function of ``l`` (``r`` within the clip range, its bounds included) or where ``A = 0``: the derivative
there is the unclipped one, ``-A r``. At ``r = 1 + e`` exactly (or ``1 - e``) the policy term is not
differentiable (the clipped side is flat beyond the bound): the subgradient is then the unclipped side's,
``-A r``, as autograd's.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch


class FusedPPOLoss(NamedTuple):
    """PPO's loss of a minibatch (as :class:`~distrl.algos.ppo.PPOLoss` holds it) and its gradients."""

    loss: torch.Tensor | None
    """Scalar: the per-sample loss summed over valid samples (None when not asked for: a training step needs only
    the gradients and the per-sample parts)."""
    policy_loss: torch.Tensor
    """[B] clipped surrogate."""
    value_loss: torch.Tensor
    """[B] squared error of the value (clipped with ``clip_range_vf``)."""
    ratio: torch.Tensor
    """[B] probability ratio ``pi / pi_old`` of the taken actions."""
    log_ratio: torch.Tensor
    """[B] its logarithm, ``log_prob - old_log_prob``."""
    d_log_prob: torch.Tensor
    """[B] d(loss)/d(log_prob)."""
    d_entropy: torch.Tensor | None
    """[B] d(loss)/d(entropy); None when ``ent_coef`` is 0."""
    d_values: torch.Tensor
    """[B] d(loss)/d(value)."""

    @property
    def output_grads(self) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """d(loss)/d(log_prob, entropy, value), as a network's backward pass takes them."""
        return self.d_log_prob, self.d_entropy, self.d_values


def _max_weights(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How ``max(a, b)`` passes its derivative to ``a`` and to ``b``: 1 to the larger, half to each at a tie."""
    tie = (a == b).to(a.dtype) * 0.5
    return (a > b).to(a.dtype) + tie, (b > a).to(a.dtype) + tie


def fused_ppo_loss(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    old_log_prob: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    valid: torch.Tensor,
    clip_range: float,
    clip_range_vf: float | None,
    vf_coef: float,
    ent_coef: float,
    total: bool = True,
) -> FusedPPOLoss:
    """:func:`~distrl.algos.ppo.ppo_loss` and d(loss)/d(log_prob, entropy, values), all arguments [B], without
    autograd (see the module's docstring for the derivation). The arguments carry no graph: detach the network's
    outputs first (or go through :class:`PPOLossFunction`). ``total=False`` leaves the scalar loss out."""
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    gain = ratio * advantages  # A r: the policy term is -min(A r, A clip(r)) = max(u, c)
    clipped_gain = ratio.clamp(1.0 - clip_range, 1.0 + clip_range).mul_(advantages)
    # -A r where the unclipped branch is the larger or ties: a tie is r within the clip range (bounds included),
    # where the two branches are one function and autograd's halves add up to -A r, or A = 0, where -A r is 0
    takes_unclipped = gain <= clipped_gain
    policy_loss = torch.where(takes_unclipped, gain, clipped_gain).neg_()
    d_log_prob = torch.where(takes_unclipped, policy_loss, 0.0).mul_(valid)  # -A r, or 0 where clipped

    error = values - returns
    value_loss = error.square()
    if clip_range_vf is None:
        d_value = error * valid
    else:
        step = values - old_values
        clipped_error = old_values + step.clamp(-clip_range_vf, clip_range_vf) - returns
        clipped_loss = clipped_error.square()
        to_plain, to_clipped_value = _max_weights(value_loss, clipped_loss)
        step_in_range = ((step >= -clip_range_vf) & (step <= clip_range_vf)).to(step.dtype)
        value_loss = torch.max(value_loss, clipped_loss)
        d_value = (to_plain * error + to_clipped_value * step_in_range * clipped_error).mul_(valid)

    loss = policy_loss @ valid + vf_coef * (value_loss @ valid) if total else None
    d_entropy = None
    if ent_coef:
        if loss is not None:
            loss = loss - ent_coef * (entropy @ valid)
        d_entropy = valid * -ent_coef
    d_value.mul_(2.0 * vf_coef)
    return FusedPPOLoss(loss, policy_loss, value_loss, ratio, log_ratio, d_log_prob, d_entropy, d_value)


class PPOLossFunction(torch.autograd.Function):
    """:func:`fused_ppo_loss` as an autograd function of (log_prob, entropy, values): the scalar loss forward, the
    closed-form derivative backward. For ``gradcheck`` and for callers that run autograd through the loss."""

    @staticmethod
    def forward(
        ctx: Any, log_prob: torch.Tensor, entropy: torch.Tensor, values: torch.Tensor, *rest: Any
    ) -> torch.Tensor:
        fused = fused_ppo_loss(log_prob, entropy, values, *rest)
        d_entropy = fused.d_entropy if fused.d_entropy is not None else torch.zeros_like(entropy)
        ctx.save_for_backward(fused.d_log_prob, d_entropy, fused.d_values)
        ctx.extra_inputs = len(rest)
        return fused.loss

    @staticmethod
    def backward(ctx: Any, grad_loss: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        d_log_prob, d_entropy, d_values = ctx.saved_tensors
        return (grad_loss * d_log_prob, grad_loss * d_entropy, grad_loss * d_values, *([None] * ctx.extra_inputs))
