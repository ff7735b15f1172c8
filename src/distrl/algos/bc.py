"""Behaviour cloning: a deterministic policy's squared error to the dataset's actions (Box), or a categorical
policy's cross-entropy (Discrete), and its step on a batch of dataset transitions.

Losses are summed over a batch's samples, as every loss in :mod:`distrl.algos` (:mod:`distrl.algos.offline` says
why).
"""

from __future__ import annotations

import torch

from distrl.algos.learned import Learned, Networks, batch_stats, seeded
from distrl.algos.protocols import Sync
from distrl.config import BCConfig
from distrl.data.replay import Transitions
from distrl.nets.distributions import inverse_cdf_sample
from distrl.nets.offline import CategoricalActor, DeterministicActor


def bc_deterministic_loss(action: torch.Tensor, dataset_action: torch.Tensor) -> torch.Tensor:
    """``sum_i (1/A) ||pi(s_i) - a_i||^2``: the squared error averaged over the A action dimensions, summed over
    samples.

    Averaged over dimensions as in TD3+BC's BC term and the reference implementations' BC: the gradient has their
    scale, and Adam's epsilon (fixed, beside the gradient's running magnitude) weighs what it weighs there.

    Args:
        action: [B, A] the deterministic policy's actions.
        dataset_action: [B, A] the dataset's actions.
    """
    return (action - dataset_action).square().mean(dim=1).sum()


def bc_categorical_loss(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``-sum_i log softmax(logits_i)[a_i]``: cross-entropy of the dataset's discrete actions, summed.

    Args:
        logits: [B, n_actions] the policy's unnormalised log-probabilities.
        actions: [B] the dataset's action indices.
    """
    return torch.nn.functional.cross_entropy(logits, actions.long(), reduction="sum")


# ---- the step ----


class BCAlgo(Networks):
    """Behaviour cloning: :func:`bc_deterministic_loss` for Box actions (a tanh policy), :func:`bc_categorical_loss`
    for Discrete ones."""

    def __init__(self, cfg: BCConfig, obs_dim: int, actions: int, discrete: bool, device: torch.device, seed: int):
        self.discrete = discrete
        self.sampling = "uniform" if discrete else None
        make = CategoricalActor if discrete else DeterministicActor
        self.actor = Learned(
            seeded(seed, lambda: make(obs_dim, actions, cfg.net_arch, cfg.activation)), cfg.learning_rate, device
        )
        self.learned = {"actor": self.actor}
        self.gradient_steps = 0

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        out = self.actor.module(batch.obs)
        if self.discrete:
            loss = bc_categorical_loss(out, batch.actions)
        else:
            loss = bc_deterministic_loss(out, batch.actions)
        sums = self.actor.step(loss, batch_stats(batch, loss), sync)
        self.gradient_steps += 1
        return {"losses/bc_loss": sums[1] / max(sums[0], 1.0)}

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.actor.module(obs)
        return out.argmax(-1) if self.discrete else out

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """The categorical policy's choice for uniforms ``noise`` [B], by inverse CDF (Discrete actions)."""
        logits = self.actor.module(obs).float().cpu().numpy()
        return torch.from_numpy(inverse_cdf_sample(logits, noise.cpu().numpy())).to(obs.device)
