"""IQL (Kostrikov, Nair & Levine 2021, arXiv:2110.06169): an expectile regression of V on Q, a TD loss of Q on V of
the next state, advantage-weighted regression for the policy; and its step on a batch of dataset transitions.

Losses are summed over a batch's samples, as every loss in :mod:`distrl.algos` (:mod:`distrl.algos.offline` says
why). The advantage weights and bootstrap values are constants of a step (detached here).
"""

from __future__ import annotations

import torch

from distrl.algos.learned import Learned, Networks, Target, batch_stats, seeded
from distrl.algos.protocols import Sync
from distrl.config import IQLConfig
from distrl.data.replay import Transitions
from distrl.nets.offline import LOG_STD_MAX, LOG_STD_MIN, GaussianActor, TwinCritic, ValueNet


def expectile_loss(diff: torch.Tensor, tau: float) -> torch.Tensor:
    """``sum_i |tau - 1(d_i < 0)| d_i^2``: the asymmetric squared loss whose minimiser is the tau-expectile.

    IQL's ``d = Q(s, a) - V(s)`` with Q from the target critics, detached by the caller (:func:`iql_value_loss`
    does it): only V learns from this loss. With ``tau > 0.5`` a V below Q costs more than a V above it, so V
    approaches an upper expectile of Q over the dataset's actions.

    Args:
        diff: [B] the differences ``d``.
        tau: the expectile, in (0, 1) (0.7 for MuJoCo, 0.9 for AntMaze in the paper).
    """
    weight = (tau - (diff < 0).to(diff.dtype)).abs()
    return (weight * diff.square()).sum()


def iql_value_loss(q_target_min: torch.Tensor, v: torch.Tensor, tau: float) -> torch.Tensor:
    """IQL's value loss, :func:`expectile_loss` of ``min_i Q'_i(s, a) - V(s)`` (the Q-values detached here).

    Args:
        q_target_min: [B] the smaller of the target critics' values of the dataset's (s, a).
        v: [B] the value network's ``V(s)``.
        tau: the expectile.
    """
    return expectile_loss(q_target_min.detach() - v, tau)


def iql_critic_loss(
    q1: torch.Tensor,
    q2: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_v: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """``sum_i sum_{k=1,2} (Q_k(s, a) - (r + gamma (1 - terminated) V(s')))^2``, the target detached here.

    IQL bootstraps from the value network, never from an action the dataset lacks: this is where the method
    avoids querying Q out of distribution. No factor 1/2, as the reference (ikostrikov/implicit_q_learning).

    Args:
        q1, q2: [B] both critics' values of the dataset's (s, a).
        rewards, terminated: [B] the transitions' rewards and 1.0 where the episode terminated.
        next_v: [B] the value network's ``V(s')``.
        gamma: the discount.
    """
    target = (rewards + gamma * (1.0 - terminated) * next_v).detach()
    return ((q1 - target).square() + (q2 - target).square()).sum()


def iql_actor_loss(
    log_prob: torch.Tensor,
    q_target_min: torch.Tensor,
    v: torch.Tensor,
    beta: float,
    max_weight: float = 100.0,
) -> torch.Tensor:
    """Advantage-weighted regression: ``-sum_i min(exp(beta (Q(s_i, a_i) - V(s_i))), max_weight) log pi(a_i|s_i)``.

    The weights are constants (detached here): the policy clones the dataset's actions, the better ones more.
    ``beta`` is the paper's inverse temperature (3.0 for MuJoCo, 10.0 for AntMaze); the clip at 100 is the
    reference's, not in the paper, and keeps one large advantage from dominating a batch.

    Args:
        log_prob: [B] the policy's log-density of each dataset action.
        q_target_min: [B] the smaller of the target critics' values of the dataset's (s, a).
        v: [B] the value network's ``V(s)``.
        beta: the inverse temperature.
        max_weight: the largest weight a sample gets.
    """
    weight = torch.exp(beta * (q_target_min - v).detach()).clamp(max=max_weight)
    return -(weight * log_prob).sum()


# ---- the step ----


class IQLAlgo(Networks):
    """IQL: the value function's expectile step, the critics' step bootstrapping from V(s'), the target critics'
    Polyak step, then the policy's advantage-weighted step. V(s') and the advantages use V as it was before its
    step, as CORL's implementation does (the authors' code uses V after it; the two differ by one step of V)."""

    sampling = "normal"  # sample(obs, standard normals [B, A]), the draw its online exploration takes too

    def __init__(self, cfg: IQLConfig, obs_dim: int, action_dim: int, device: torch.device, seed: int):
        self.cfg = cfg
        net = (cfg.net_arch, cfg.activation)
        self.actor = Learned(seeded(seed, lambda: GaussianActor(obs_dim, action_dim, *net)), cfg.learning_rate, device)
        self.critic = Learned(
            seeded(seed + 1, lambda: TwinCritic(obs_dim, action_dim, *net)), cfg.learning_rate, device
        )
        self.value = Learned(seeded(seed + 2, lambda: ValueNet(obs_dim, *net)), cfg.learning_rate, device)
        self.critic_target = Target(self.critic, device)
        self.learned = {"actor": self.actor, "critic": self.critic, "value": self.value}
        self.gradient_steps = 0

    def _targets(self) -> dict[str, Target]:
        return {"critic_target": self.critic_target}

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        cfg = self.cfg
        with torch.no_grad():
            target_q1, target_q2 = self.critic_target.module(batch.obs, batch.actions)
            q_min = torch.minimum(target_q1, target_q2)
            next_v = self.value.module(batch.next_obs)
        v = self.value.module(batch.obs)
        value_loss = iql_value_loss(q_min, v, cfg.expectile)
        value_sums = self.value.step(value_loss, batch_stats(batch, value_loss, v.sum()), sync)
        q1, q2 = self.critic.module(batch.obs, batch.actions)
        critic_loss = iql_critic_loss(q1, q2, batch.rewards, batch.terminated, next_v, cfg.gamma)
        critic_sums = self.critic.step(critic_loss, batch_stats(batch, critic_loss, q1.sum()), sync)
        self.critic_target.follow(cfg.tau)
        log_prob = self.actor.module.log_prob(batch.obs, batch.actions)
        actor_loss = iql_actor_loss(log_prob, q_min, v.detach(), cfg.beta, cfg.max_weight)
        actor_sums = self.actor.step(actor_loss, batch_stats(batch, actor_loss), sync)
        self.gradient_steps += 1
        count = max(value_sums[0], 1.0)
        return {
            "losses/value_loss": value_sums[1] / count,
            "losses/v_mean": value_sums[2] / count,
            "losses/critic_loss": critic_sums[1] / count,
            "losses/q_mean": critic_sums[2] / count,
            "losses/actor_loss": actor_sums[1] / count,
        }

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.module(obs)

    @torch.no_grad()
    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """A draw of the Gaussian policy (clipped to [-1, 1]) for standard normal ``noise``; online, its
        exploration."""
        actor = self.actor.module
        std = actor.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX).exp()
        return (actor(obs) + std * noise).clamp(-1.0, 1.0)

    explore = sample
