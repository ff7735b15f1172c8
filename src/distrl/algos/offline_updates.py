"""One gradient step of each offline algorithm (BC, TD3+BC, IQL, CQL) on a batch of dataset transitions.

The losses are :mod:`distrl.algos.offline`'s, written plainly; the networks are :mod:`distrl.nets.offline`'s
modules, each on a flat buffer (:class:`~distrl.algos.learned.Learned`). Every loss is summed over this worker's
samples and every step divides by the global count after the sync, so workers that each hold a part of a batch
take the step one process would take on the whole of it (:class:`~distrl.data.offline.GlobalSampler` hands each
its part). Actions are in [-1, 1] (Box) or indices (Discrete).

Anything drawn at random within a step (TD3's target smoothing noise) is drawn for the whole batch from a
generator every worker seeds alike, and each takes the rows of its samples (``batch.rows``: their positions in the
global batch): the same noise meets the same sample wherever it is.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np
import torch

from distrl.algos.learned import BatchNoise, Learned, Networks, Target, batch_stats, seeded
from distrl.algos.offline import (
    bc_categorical_loss,
    bc_deterministic_loss,
    cql_alpha_loss,
    cql_discrete_penalty,
    cql_penalty,
    iql_actor_loss,
    iql_critic_loss,
    iql_value_loss,
    td3_actor_loss,
    td3_critic_loss,
    td3_target,
    td3bc_actor_loss,
)
from distrl.algos.protocols import Sync
from distrl.algos.sac import actor_loss, temperature_loss
from distrl.config import BCConfig, CQLConfig, IQLConfig, OfflineConfig, TD3BCConfig
from distrl.data.replay import Transitions
from distrl.nets.distributions import inverse_cdf_sample
from distrl.nets.offline import (
    LOG_STD_MAX,
    LOG_STD_MIN,
    CategoricalActor,
    DeterministicActor,
    GaussianActor,
    LogScalar,
    QNetwork,
    SquashedGaussianActor,
    TwinCritic,
    ValueNet,
)


class OfflineUpdate(Protocol):
    """What the offline loop asks of an algorithm."""

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        """One gradient step on this worker's part of a global batch of ``batch_size`` transitions."""
        ...

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's deterministic actions ([-1, 1], or indices) for observations [B, obs_dim]."""
        ...

    sampling: str | None
    """The noise a draw of the policy takes: ``"normal"``, standard normals [B, A] (IQL's Gaussian, CQL's squashed
    Gaussian); ``"uniform"``, uniforms [B] (behaviour cloning's categorical, Discrete actions); None where the
    policy is deterministic (a tanh action, a greedy choice) and acts with :meth:`act` alone."""

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """A draw of the policy for ``noise`` (see :attr:`sampling`): actions in [-1, 1], or indices."""
        ...

    @property
    def policy(self) -> Learned:
        """The module that acts: its mode's action in [-1, 1] (Box), or values to take the argmax of (Discrete)."""
        ...

    def after_broadcast(self, counters: torch.Tensor) -> None: ...

    def reseed(self, seed: int, segment: int) -> None: ...

    def state_tensors(self) -> dict[str, torch.Tensor]: ...

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None: ...

    def broadcast_tensors(self) -> list[torch.Tensor]: ...


class BCAlgo(Networks):
    """Behaviour cloning: :func:`~distrl.algos.offline.bc_deterministic_loss` for Box actions (a tanh policy),
    :func:`~distrl.algos.offline.bc_categorical_loss` for Discrete ones."""

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


class TD3BCAlgo(Networks):
    """TD3+BC: the critics' clipped double-Q step every gradient step; every ``policy_freq``-th the actor's step
    (:func:`~distrl.algos.offline.td3bc_actor_loss`, its Q scale the mean over every worker's samples) and the
    targets' Polyak step. With ``bc=False`` the actor's loss is TD3's own (:func:`~distrl.algos.offline.td3_actor_loss`)."""

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


class CQLAlgo(Networks):
    """CQL(H) on SAC for Box actions, in the reference's order: the entropy coefficient's step, the policy's
    (SAC's actor loss against the critics), then the critics' (the TD loss plus the conservative penalty
    :func:`~distrl.algos.offline.cql_penalty`, weighted by ``conservative_weight``, times alpha' when it is learned
    by its Lagrangian), and the target critics' Polyak step. The target is SAC's without the entropy bonus (the
    reference's ``backup_entropy=False``)."""

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
    plus ``conservative_weight`` times :func:`~distrl.algos.offline.cql_discrete_penalty`; the target network
    follows by Polyak steps."""

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


def make_offline_algo(
    algo: str,
    cfg: OfflineConfig,
    obs_dim: int,
    actions: int,
    discrete: bool,
    device: torch.device,
    seed: int,
    precision: str = "fp32",
) -> BCAlgo | TD3BCAlgo | IQLAlgo | CQLAlgo | DiscreteCQLAlgo:
    """The update of ``algo`` for observations of ``obs_dim`` and ``actions`` action dimensions (or choices), its
    networks' products in ``precision`` (fp32, or bf16 under autocast)."""
    made = _make(algo, cfg, obs_dim, actions, discrete, device, seed)
    made.set_precision(precision)
    return made


def _make(
    algo: str, cfg: OfflineConfig, obs_dim: int, actions: int, discrete: bool, device: torch.device, seed: int
) -> BCAlgo | TD3BCAlgo | IQLAlgo | CQLAlgo | DiscreteCQLAlgo:
    if algo == "bc":
        assert isinstance(cfg, BCConfig)
        return BCAlgo(cfg, obs_dim, actions, discrete, device, seed)
    if algo in ("td3bc", "td3"):
        assert isinstance(cfg, TD3BCConfig)
        return TD3BCAlgo(cfg, obs_dim, actions, device, seed, bc=algo == "td3bc")
    if algo == "iql":
        assert isinstance(cfg, IQLConfig)
        return IQLAlgo(cfg, obs_dim, actions, device, seed)
    assert algo == "cql" and isinstance(cfg, CQLConfig)
    if discrete:
        return DiscreteCQLAlgo(cfg, obs_dim, actions, device, seed)
    return CQLAlgo(cfg, obs_dim, actions, device, seed)
