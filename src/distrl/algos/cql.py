"""CQL (Kumar, Zhou, Tucker & Levine 2020, arXiv:2006.04779): the CQL(H) conservative penalty on top of SAC with
its Lagrangian weight (continuous actions), and on top of double DQN (discrete); and the steps of both on a batch
of dataset transitions.

Losses are summed over a batch's samples, as every loss in :mod:`distrl.algos` (:mod:`distrl.algos.offline` says
why). Where the Lagrangian takes the batch's mean penalty the function takes what makes the sum over workers
exact. The sampled actions' log-densities are constants of a step (detached here).
"""

from __future__ import annotations

import math

import torch

from distrl.algos.learned import BatchNoise, Learned, Networks, Target, batch_stats, seeded
from distrl.algos.protocols import Sync
from distrl.algos.sac import actor_loss, temperature_loss
from distrl.algos.td3 import td3_critic_loss, td3_target
from distrl.config import CQLConfig
from distrl.data.replay import Transitions
from distrl.nets.offline import LogScalar, QNetwork, SquashedGaussianActor, TwinCritic


def cql_penalty(
    q_random: torch.Tensor,
    q_policy: torch.Tensor,
    q_next_policy: torch.Tensor,
    log_prob_policy: torch.Tensor,
    log_prob_next_policy: torch.Tensor,
    q_data: torch.Tensor,
    action_dim: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """CQL(H)'s conservative penalty of one critic, ``sum_i [T logsumexp_j (x_ij / T) - Q(s_i, a_i)]``.

    The ``x_ij`` are importance-sampled estimates of ``log sum_a exp Q(s_i, a)`` from 3N actions per state,
    each Q-value minus the log-density of the distribution that proposed its action::

        Q(s, a_rand)  - log(0.5^A)          a_rand uniform in [-1, 1]^A, density 0.5^A
        Q(s, a_pi)    - log pi(a_pi | s)    a_pi ~ pi(.|s)
        Q(s, a'_pi)   - log pi(a'_pi | s')  a'_pi ~ pi(.|s'), the next state's actions at this state

    so ``- log(0.5^A) = + A log 2`` raises the uniform samples: a smaller density weighs a sample more. This is
    the reference's ``min_q_version=3`` (aviralkumar2907/CQL, rlkit ``cql.py``; CORL's ``cql.py`` alike),
    with the temperature dividing the whole entries, the density terms included. As the reference, the sum
    over 3N samples is not divided by 3N: that shifts the penalty by ``log 3N`` (no gradient), which matters
    only against the Lagrangian's ``target_action_gap``. The log-densities are constants (detached here).

    The critic's loss adds ``alpha' *`` this (``alpha'`` the fixed or Lagrangian weight, times the reference's
    ``min_q_weight``) to its TD loss; call it once per critic.

    Args:
        q_random: [B, N] ``Q(s, a_rand)`` of N uniform actions per state.
        q_policy: [B, N] ``Q(s, a_pi)`` of N actions sampled from the policy at s.
        q_next_policy: [B, N] ``Q(s, a'_pi)`` of N actions sampled from the policy at s'.
        log_prob_policy: [B, N] ``log pi(a_pi | s)``.
        log_prob_next_policy: [B, N] ``log pi(a'_pi | s')``.
        q_data: [B] ``Q(s, a)`` of the dataset's action.
        action_dim: A, the number of action dimensions (actions scaled to [-1, 1]).
        temperature: T; 1.0 in the paper's experiments.
    """
    log_uniform_density = action_dim * math.log(0.5)
    proposals = torch.cat(
        [
            q_random - log_uniform_density,
            q_policy - log_prob_policy.detach(),
            q_next_policy - log_prob_next_policy.detach(),
        ],
        dim=1,
    )
    return (temperature * torch.logsumexp(proposals / temperature, dim=1) - q_data).sum()


def cql_alpha_loss(
    log_alpha_prime: torch.Tensor, penalty_sum: torch.Tensor, count: float, target_action_gap: float
) -> torch.Tensor:
    """The Lagrangian's loss for CQL's conservative weight, ``-alpha' (sum_i penalty_i - count * target_gap)``.

    ``alpha' = clamp(exp(log_alpha'), 0, 1e6)``, as the reference (aviralkumar2907/CQL, ``with_lagrange``;
    CORL alike). Gradient descent on ``log_alpha'`` raises alpha' while the mean penalty exceeds the target gap
    and lowers it while it is below. The penalty is a constant here (detached).

    The reference's loss is ``-alpha' (mean penalty - gap)`` over its batch; this is that loss summed over
    samples, so that summed over workers and divided by the global count it is the reference's over the global
    batch, as the other losses (and SAC's temperature loss). The reference averages its two critics' penalties:
    pass ``(cql_penalty(critic 1) + cql_penalty(critic 2)) / 2``, times its ``min_q_weight`` if one is used.

    Args:
        log_alpha_prime: 0-dim, the learned log of the conservative weight.
        penalty_sum: 0-dim, :func:`cql_penalty` of this batch (summed over its samples).
        count: the number of samples ``penalty_sum`` was summed over.
        target_action_gap: the threshold tau of the paper's Lagrangian form.
    """
    alpha_prime = log_alpha_prime.exp().clamp(0.0, 1e6)
    return -alpha_prime * (penalty_sum.detach() - count * target_action_gap)


def cql_discrete_penalty(q_all: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """CQL(H) with DQN: ``sum_i [logsumexp_a Q(s_i, a) - Q(s_i, a_i)]``, exact over the discrete actions.

    Args:
        q_all: [B, n_actions] the Q network's values of every action.
        actions: [B] the dataset's action indices.
    """
    taken = q_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return (torch.logsumexp(q_all, dim=1) - taken).sum()


# ---- the step ----


class CQLAlgo(Networks):
    """CQL(H) on SAC for Box actions, in the reference's order: the entropy coefficient's step, the policy's
    (SAC's actor loss against the critics), then the critics' (the TD loss plus the conservative penalty
    :func:`cql_penalty`, weighted by ``conservative_weight``, times alpha' when it is learned by its Lagrangian),
    and the target critics' Polyak step. The target is SAC's without the entropy bonus (the reference's
    ``backup_entropy=False``)."""

    sampling = "normal"  # sample(obs, standard normals [B, A]), the draw its online exploration takes too

    def __init__(self, cfg: CQLConfig, obs_dim: int, action_dim: int, device: torch.device, seed: int):
        self.cfg, self.action_dim = cfg, action_dim
        net = (cfg.net_arch, cfg.activation)
        actor = seeded(seed, lambda: SquashedGaussianActor(obs_dim, action_dim, *net))
        self.actor = Learned(actor, cfg.actor_learning_rate, device)
        self.critic = Learned(
            seeded(seed + 1, lambda: TwinCritic(obs_dim, action_dim, *net)), cfg.learning_rate, device
        )
        self.log_alpha = Learned(LogScalar(1.0), cfg.learning_rate, device)
        self.critic_target = Target(self.critic, device)
        self.learned = {"actor": self.actor, "critic": self.critic, "log_alpha": self.log_alpha}
        self.lagrange = cfg.target_action_gap is not None
        if self.lagrange:
            self.log_alpha_prime = Learned(LogScalar(1.0), cfg.learning_rate, device)
            self.learned["log_alpha_prime"] = self.log_alpha_prime
        self.target_entropy = -float(action_dim)
        self.gradient_steps = 0
        self.noise = BatchNoise(device)
        self.reseed(seed, 0)

    def _targets(self) -> dict[str, Target]:
        return {"critic_target": self.critic_target}

    def reseed(self, seed: int, segment: int) -> None:
        self.noise.reseed(seed, segment, 0xC91)

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        cfg, a, n = self.cfg, self.action_dim, self.cfg.n_action_samples
        b = batch.obs.shape[0]
        eps_pi, eps_next = self.noise.normal(batch, batch_size, a), self.noise.normal(batch, batch_size, a)
        eps_here, eps_there = self.noise.normal(batch, batch_size, n, a), self.noise.normal(batch, batch_size, n, a)
        random_actions = self.noise.uniform(batch, batch_size, n, a)

        # the entropy coefficient, then the policy against the critics
        action, log_prob = self.actor.module.sample(batch.obs, eps_pi)
        log_alpha = self.log_alpha.module()
        alpha_loss = temperature_loss(log_alpha, log_prob.detach(), self.target_entropy)
        self.log_alpha.step(alpha_loss, batch_stats(batch, alpha_loss), sync)
        alpha = float(log_alpha.detach().exp())  # the value before its step, as SAC's
        q1_pi, q2_pi = self.critic.module(batch.obs, action)
        policy_loss = actor_loss(log_prob, q1_pi, q2_pi, alpha)
        actor_sums = self.actor.step(policy_loss, batch_stats(batch, policy_loss, log_prob.sum()), sync)

        # the critics: TD loss and the conservative penalty
        with torch.no_grad():
            next_action, _ = self.actor.module.sample(batch.next_obs, eps_next)
            next_q1, next_q2 = self.critic_target.module(batch.next_obs, next_action)
            y = td3_target(batch.rewards, batch.terminated, next_q1, next_q2, cfg.gamma)
            here, log_prob_here = self.actor.module.sample(batch.obs, eps_here)  # n actions per state, one pass
            there, log_prob_there = self.actor.module.sample(batch.next_obs, eps_there)
        q1, q2 = self.critic.module(batch.obs, batch.actions)
        sampled = torch.cat([random_actions, here, there], dim=1)  # [b, 3n, A], evaluated at s
        sq1, sq2 = self.critic.module(batch.obs.unsqueeze(1).expand(b, 3 * n, batch.obs.shape[1]), sampled)
        penalties = [
            cql_penalty(s[:, :n], s[:, n : 2 * n], s[:, 2 * n :], log_prob_here, log_prob_there, q, a, cfg.temperature)
            for s, q in ((sq1, q1), (sq2, q2))
        ]
        weight = cfg.conservative_weight
        critic_loss = td3_critic_loss(q1, q2, y)
        if self.lagrange:
            assert cfg.target_action_gap is not None
            log_alpha_prime = self.log_alpha_prime.module()
            alpha_prime = float(log_alpha_prime.detach().exp().clamp(0.0, 1e6))
            gap = b * cfg.target_action_gap
            conservative = alpha_prime * weight * (penalties[0] - gap + penalties[1] - gap)
            prime_loss = cql_alpha_loss(
                log_alpha_prime, weight * 0.5 * (penalties[0] + penalties[1]), b, weight * cfg.target_action_gap
            )
            self.log_alpha_prime.step(prime_loss, batch_stats(batch, prime_loss), sync)
        else:
            conservative = weight * (penalties[0] + penalties[1])
        loss = critic_loss + conservative
        sums = self.critic.step(loss, batch_stats(batch, critic_loss, penalties[0] + penalties[1], q1.sum()), sync)
        self.critic_target.follow(cfg.tau)
        self.gradient_steps += 1
        count = max(sums[0], 1.0)
        return {
            "losses/critic_loss": sums[1] / count,
            "losses/cql_penalty": sums[2] / (2 * count),
            "losses/q_mean": sums[3] / count,
            "losses/actor_loss": actor_sums[1] / count,
            "losses/entropy": -actor_sums[2] / count,
            "losses/ent_coef": alpha,
        }

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.module(obs)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """A draw of the squashed Gaussian policy for standard normal ``noise``; online, its exploration."""
        return self.actor.module.sample(obs, noise)[0]

    explore = sample


class DiscreteCQLAlgo(Networks):
    """CQL(H) on double DQN for Discrete actions: the squared TD error against ``r + gamma Q'(s', argmax_a Q(s', a))``
    plus ``conservative_weight`` times :func:`cql_discrete_penalty`; the target network follows by Polyak steps."""

    sampling = None  # greedy on its Q-values

    def __init__(self, cfg: CQLConfig, obs_dim: int, n_actions: int, device: torch.device, seed: int):
        self.cfg = cfg
        q = seeded(seed, lambda: QNetwork(obs_dim, n_actions, cfg.net_arch, cfg.activation))
        self.q = Learned(q, cfg.learning_rate, device)
        self.q_target = Target(self.q, device)
        self.learned = {"q": self.q}
        self.gradient_steps = 0

    @property
    def policy(self) -> Learned:
        return self.q

    def _targets(self) -> dict[str, Target]:
        return {"q_target": self.q_target}

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        cfg = self.cfg
        with torch.no_grad():
            best = self.q.module(batch.next_obs).argmax(1, keepdim=True)
            next_q = self.q_target.module(batch.next_obs).gather(1, best).squeeze(1)
            y = batch.rewards + cfg.gamma * (1.0 - batch.terminated) * next_q
        q_all = self.q.module(batch.obs)
        taken = q_all.gather(1, batch.actions.long().unsqueeze(1)).squeeze(1)
        td_loss = (taken - y).square().sum()
        penalty = cql_discrete_penalty(q_all, batch.actions)
        sums = self.q.step(
            td_loss + cfg.conservative_weight * penalty, batch_stats(batch, td_loss, penalty, taken.sum()), sync
        )
        self.q_target.follow(cfg.tau)
        self.gradient_steps += 1
        count = max(sums[0], 1.0)
        return {
            "losses/td_loss": sums[1] / count,
            "losses/cql_penalty": sums[2] / count,
            "losses/q_mean": sums[3] / count,
        }

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q.module(obs).argmax(-1)
