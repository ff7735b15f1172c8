"""TD3 (Fujimoto, van Hoof & Meger 2018, arXiv:1802.09477) and TD3+BC (Fujimoto & Gu 2021, arXiv:2106.06860):
clipped double-Q targets, and TD3's actor loss plus a behaviour-cloning term weighted against the Q scale; then
the step of either on a batch of transitions (TD3+BC's from a dataset, TD3's online from its replay).

Losses are summed over a batch's samples, as every loss in :mod:`distrl.algos` (:mod:`distrl.algos.offline` says
why). Where TD3+BC takes a statistic of the whole batch (its Q scale) the function takes what makes the sum over
workers exact.
"""

from __future__ import annotations

import numpy as np
import torch

from distrl.algos.learned import BatchNoise, Learned, Networks, Target, batch_stats, seeded
from distrl.algos.protocols import Sync
from distrl.config import TD3BCConfig
from distrl.data.replay import Transitions
from distrl.nets.offline import DeterministicActor, TwinCritic


def td3_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """``r + gamma (1 - terminated) min(Q'_1(s', a'), Q'_2(s', a'))`` per sample [B] (clipped double Q).

    The target policy smoothing is the caller's: ``a' = clip(pi'(s') + clip(eps, -c, c), -1, 1)`` with
    ``eps ~ N(0, sigma^2)`` goes into the target critics before this. Truncated episodes are not ``terminated``.

    Args:
        rewards, terminated: [B] the transitions' rewards and 1.0 where the episode terminated.
        next_q1, next_q2: [B] the target critics' values of the next state and the smoothed target action.
    """
    return rewards + gamma * (1.0 - terminated) * torch.minimum(next_q1, next_q2)


def td3_critic_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``sum_i (Q_1(s, a) - y)^2 + (Q_2(s, a) - y)^2``, summed over samples (``target`` y detached).

    Divided by the batch size it is the reference's ``mse_loss(Q1, y) + mse_loss(Q2, y)`` (sfujim/TD3 and
    sfujim/TD3_BC): each critic's mean squared error, the two added, no factor 1/2 (distrl's SAC has one, as
    stable-baselines3's).

    Args:
        q1, q2: [B] both critics' values of the dataset's (s, a).
        target: [B] :func:`td3_target`.
    """
    return ((q1 - target).square() + (q2 - target).square()).sum()


def td3_actor_loss(q1_pi: torch.Tensor) -> torch.Tensor:
    """``-sum_i Q_1(s_i, pi(s_i))``: TD3's deterministic policy gradient through the first critic.

    Args:
        q1_pi: [B] the first critic's values of the policy's actions.
    """
    return -q1_pi.sum()


def td3bc_actor_loss(
    q1_pi: torch.Tensor,
    action_pi: torch.Tensor,
    dataset_action: torch.Tensor,
    alpha: float,
    q_abs_mean: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """TD3+BC's actor loss: ``sum_i [-lambda Q_1(s_i, pi(s_i)) + (1/A) ||pi(s_i) - a_i||^2]``.

    ``lambda = alpha / mean_i |Q_1(s_i, pi(s_i))|`` is a constant of the step: no gradient flows through the
    normaliser. It is the Q scale of the whole batch, so a caller that splits a batch over workers passes
    ``q_abs_mean``, the mean over every worker's samples (an all-reduced sum of ``|Q_1|`` over the global
    count); None computes it from this batch (a single worker's whole batch). The paper writes the normaliser
    over the minibatch's ``Q(s_i, a_i)``; the reference code (sfujim/TD3_BC, also CORL) and this use
    ``Q_1(s_i, pi(s_i))``.

    The behaviour-cloning term is averaged over the A action dimensions, as the reference's
    ``F.mse_loss(pi, action)``: the default ``alpha = 2.5`` was tuned with that scale (summed over dimensions
    it would be A times stronger).

    Args:
        q1_pi: [B] the first critic's values of the policy's actions.
        action_pi: [B, A] the policy's actions.
        dataset_action: [B, A] the dataset's actions.
        alpha: the paper's alpha (2.5 in its experiments).
        q_abs_mean: ``mean |Q_1(s, pi(s))|`` over the global batch, or None for this batch's.
    """
    if q_abs_mean is None:
        q_abs_mean = q1_pi.abs().mean()
    lam = alpha / torch.as_tensor(q_abs_mean, dtype=q1_pi.dtype, device=q1_pi.device).detach()
    bc = (action_pi - dataset_action).square().mean(dim=1)
    return (bc - lam * q1_pi).sum()


# ---- the step ----


class TD3BCAlgo(Networks):
    """TD3+BC: the critics' clipped double-Q step every gradient step; every ``policy_freq``-th the actor's step
    (:func:`td3bc_actor_loss`, its Q scale the mean over every worker's samples) and the targets' Polyak step.
    With ``bc=False`` the actor's loss is TD3's own (:func:`td3_actor_loss`)."""

    sampling = None  # a deterministic policy: its exploration noise (explore) is no draw of it

    def __init__(
        self, cfg: TD3BCConfig, obs_dim: int, action_dim: int, device: torch.device, seed: int, bc: bool = True
    ):
        self.cfg, self.action_dim, self.device, self.bc = cfg, action_dim, device, bc
        net = (cfg.net_arch, cfg.activation)
        self.actor = Learned(
            seeded(seed, lambda: DeterministicActor(obs_dim, action_dim, *net)), cfg.learning_rate, device
        )
        self.critic = Learned(
            seeded(seed + 1, lambda: TwinCritic(obs_dim, action_dim, *net)), cfg.learning_rate, device
        )
        self.actor_target, self.critic_target = Target(self.actor, device), Target(self.critic, device)
        self.learned = {"actor": self.actor, "critic": self.critic}
        self.gradient_steps = 0
        self.noise = BatchNoise(device)
        self.reseed(seed, 0)

    def _targets(self) -> dict[str, Target]:
        return {"actor_target": self.actor_target, "critic_target": self.critic_target}

    def reseed(self, seed: int, segment: int) -> None:
        self.noise.reseed(seed, segment, 0x7D3)

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        cfg = self.cfg
        noise = self.noise.normal(batch, batch_size, self.action_dim)
        with torch.no_grad():
            smoothing = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_action = (self.actor_target.module(batch.next_obs) + smoothing).clamp(-1.0, 1.0)
            next_q1, next_q2 = self.critic_target.module(batch.next_obs, next_action)
            y = td3_target(batch.rewards, batch.terminated, next_q1, next_q2, cfg.gamma)
        q1, q2 = self.critic.module(batch.obs, batch.actions)
        critic_loss = td3_critic_loss(q1, q2, y)
        sums = self.critic.step(critic_loss, batch_stats(batch, critic_loss, q1.sum()), sync)
        self.gradient_steps += 1
        count = max(sums[0], 1.0)
        metrics = {"losses/critic_loss": sums[1] / count, "losses/q_mean": sums[2] / count}
        if self.gradient_steps % cfg.policy_freq:
            return metrics
        action = self.actor.module(batch.obs)
        q1_pi = self.critic.module.first(batch.obs, action)
        if self.bc:
            q_abs = sync.all_sum(np.array([float(q1_pi.detach().abs().sum()), float(batch.obs.shape[0])]))
            actor_loss = td3bc_actor_loss(q1_pi, action, batch.actions, cfg.alpha, q_abs[0] / max(q_abs[1], 1.0))
        else:
            actor_loss = td3_actor_loss(q1_pi)
        actor_sums = self.actor.step(actor_loss, batch_stats(batch, actor_loss), sync)
        self.actor_target.follow(cfg.tau)
        self.critic_target.follow(cfg.tau)
        metrics["losses/actor_loss"] = actor_sums[1] / count
        return metrics

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.module(obs)

    @torch.no_grad()
    def explore(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """TD3's exploration: the policy's action plus ``exploration_noise`` times the standard normal ``noise``."""
        return (self.actor.module(obs) + self.cfg.exploration_noise * noise).clamp(-1.0, 1.0)
