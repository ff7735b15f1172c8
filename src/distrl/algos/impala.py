"""IMPALA's V-trace actor-critic (Espeholt et al. 2018, arXiv:1802.01561, section 4.2).

The learner's loss on a batch of actors' fragments, per valid step s, with V-trace's value targets
``v_s`` and advantages ``A_s = rho_s (r_s + gamma v_{s+1} - V(x_s))`` (:func:`distrl.algos.estimators.vtrace`,
computed for the learner's current network when the batch is prepared)::

    loss = -A_s log pi(a_s|x_s) + vf_coef * 0.5 (V(x_s) - v_s)^2 - ent_coef * H(pi(.|x_s))

averaged over the batch, one gradient step per batch (``n_epochs`` 1), as RLlib's IMPALA. No ratio
clipping: the truncated importance weight ``rho_s`` inside ``A_s`` is the whole off-policy correction.
With ``normalize_value`` V-trace runs on the critic's denormalised values and ``V(x_s) - v_s`` is taken in
normalised units (:mod:`distrl.algos.value_norm`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from distrl.algos.appo import vtrace_targets
from distrl.algos.optim import ClippedRMSprop
from distrl.algos.ppo import PPOAlgo, PPOLoss, Targets
from distrl.config import IMPALAConfig
from distrl.data.packed import Minibatch
from distrl.data.rollout import Rollout, Sequences
from distrl.nets import Agent


class IMPALALoss(NamedTuple):
    loss: torch.Tensor
    """Scalar: the per-sample loss summed over valid samples (the algorithm divides by the global count)."""
    policy_loss: torch.Tensor
    """[B] ``-A log pi``."""
    value_loss: torch.Tensor
    """[B] ``0.5 (V - v_s)^2``."""


def impala_loss(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    advantages: torch.Tensor,
    vs: torch.Tensor,
    valid: torch.Tensor,
    vf_coef: float,
    ent_coef: float,
) -> IMPALALoss:
    """IMPALA's objective on the network's outputs for B samples (all arguments [B]; see the module)."""
    policy_loss = -advantages * log_prob
    value_loss = 0.5 * (values - vs).square()
    loss = policy_loss + vf_coef * value_loss
    if ent_coef:
        loss = loss - ent_coef * entropy
    return IMPALALoss(loss @ valid, policy_loss, value_loss)


class IMPALAAlgo(PPOAlgo):
    """The IMPALA learning rule: PPO's batching, minibatches and sync with :func:`impala_loss` and V-trace."""

    cfg: IMPALAConfig

    def __init__(self, cfg: IMPALAConfig, agent: Agent, seed: int):
        super().__init__(cfg, agent, seed)
        if cfg.optimizer == "rmsprop":
            self.optimizer = ClippedRMSprop(
                agent.params, cfg.learning_rate, cfg.rmsprop_alpha, cfg.rmsprop_eps, cfg.max_grad_norm
            )

    def targets(
        self, rollout: Rollout, obs: torch.Tensor, actions: torch.Tensor, sequences: Sequences | None
    ) -> Targets:
        return vtrace_targets(self, self.cfg, rollout, obs, actions, sequences)

    def loss_and_output_grads(
        self, outputs: tuple[torch.Tensor, ...], mb: Minibatch, clip_range: float
    ) -> tuple[PPOLoss, tuple[torch.Tensor | None, ...]]:
        """IMPALA's loss has no fused form: autograd over :meth:`loss`, whatever ``fused_loss`` says."""
        return self.autograd_loss_and_output_grads(outputs, mb, clip_range)

    def loss(self, outputs: tuple[torch.Tensor, ...], mb: Minibatch, clip_range: float) -> PPOLoss:
        """:func:`impala_loss`, with the ratio to the behaviour policy for the statistics (it takes no part)."""
        log_prob, entropy, values = outputs
        loss = impala_loss(
            log_prob,
            entropy,
            values,
            mb.advantages,
            self.value_targets(mb.returns),
            mb.valid,
            self.cfg.vf_coef,
            self.cfg.ent_coef,
        )
        log_ratio = log_prob.detach() - mb.old_log_prob
        return PPOLoss(loss.loss, loss.policy_loss, loss.value_loss, log_ratio.exp(), log_ratio)
