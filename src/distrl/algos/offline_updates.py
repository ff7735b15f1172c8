"""One gradient step of each offline algorithm (BC, TD3+BC, IQL) on a batch of dataset transitions.

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

from typing import Any, Protocol

import numpy as np
import torch

from distrl.algos.learned import Learned, Target
from distrl.algos.offline import (
    bc_categorical_loss,
    bc_deterministic_loss,
    iql_actor_loss,
    iql_critic_loss,
    iql_value_loss,
    td3_critic_loss,
    td3_target,
    td3bc_actor_loss,
)
from distrl.algos.protocols import Sync
from distrl.config import BCConfig, IQLConfig, OfflineConfig, TD3BCConfig
from distrl.data.replay import Transitions
from distrl.nets.offline import CategoricalActor, DeterministicActor, GaussianActor, TwinCritic, ValueNet


class OfflineUpdate(Protocol):
    """What the offline loop asks of an algorithm."""

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        """One gradient step on this worker's part of a global batch of ``batch_size`` transitions."""
        ...

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's deterministic actions ([-1, 1], or indices) for observations [B, obs_dim]."""
        ...

    def reseed(self, seed: int, segment: int) -> None: ...

    def state_tensors(self) -> dict[str, torch.Tensor]: ...

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None: ...

    def broadcast_tensors(self) -> list[torch.Tensor]: ...


def _count(batch: Transitions) -> torch.Tensor:
    return torch.tensor(float(batch.obs.shape[0]), dtype=torch.float64)


def _stats(batch: Transitions, *values: torch.Tensor) -> torch.Tensor:
    """The sample count, then ``values`` (sums over this worker's samples), as one float64 tensor for the sync."""
    return torch.stack([_count(batch), *(v.detach().double() for v in values)])


def _built(seed: int, make: Any) -> Any:
    """``make()``, with torch's global generator (which ``nn.Linear`` initialises from) seeded and restored."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


class _Counters:
    """The steps an algorithm counts itself, kept in checkpoints and the start-up broadcast."""

    learned: dict[str, Learned]
    gradient_steps: int

    def _counters(self) -> torch.Tensor:
        steps = [learned.optimizer.steps for learned in self.learned.values()]
        return torch.tensor([self.gradient_steps, *steps], dtype=torch.float64)

    def after_broadcast(self, counters: torch.Tensor) -> None:
        values = counters.tolist()
        self.gradient_steps = int(values[0])
        for learned, steps in zip(self.learned.values(), values[1:]):
            learned.optimizer.steps = int(steps)

    def broadcast_tensors(self) -> list[torch.Tensor]:
        tensors = [t for learned in self.learned.values() for t in learned.broadcast_tensors()]
        return [*tensors, *(t.params.data for t in self._targets().values()), self._counters()]

    def _targets(self) -> dict[str, Target]:
        return {}

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for name, learned in self.learned.items():
            tensors.update(learned.state_tensors(name))
        for name, target in self._targets().items():
            tensors.update(target.state_tensors(name))
        tensors["gradient_steps"] = torch.tensor([self.gradient_steps], dtype=torch.int64)
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, learned in self.learned.items():
            learned.load_state_tensors(tensors, name)
        for name, target in self._targets().items():
            target.load_state_tensors(tensors, name)
        self.gradient_steps = int(tensors["gradient_steps"][0])

    def reseed(self, seed: int, segment: int) -> None:
        return None


class BCAlgo(_Counters):
    """Behaviour cloning: :func:`~distrl.algos.offline.bc_deterministic_loss` for Box actions (a tanh policy),
    :func:`~distrl.algos.offline.bc_categorical_loss` for Discrete ones."""

    def __init__(self, cfg: BCConfig, obs_dim: int, actions: int, discrete: bool, device: torch.device, seed: int):
        self.discrete = discrete
        make = CategoricalActor if discrete else DeterministicActor
        self.actor = Learned(
            _built(seed, lambda: make(obs_dim, actions, cfg.net_arch, cfg.activation)), cfg.learning_rate, device
        )
        self.learned = {"actor": self.actor}
        self.gradient_steps = 0

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        out = self.actor.module(batch.obs)
        if self.discrete:
            loss = bc_categorical_loss(out, batch.actions)
        else:
            loss = bc_deterministic_loss(out, batch.actions)
        sums = self.actor.step(loss, _stats(batch, loss), sync)
        self.gradient_steps += 1
        return {"losses/bc_loss": sums[1] / max(sums[0], 1.0)}

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.actor.module(obs)
        return out.argmax(-1) if self.discrete else out


class TD3BCAlgo(_Counters):
    """TD3+BC: the critics' clipped double-Q step every gradient step; every ``policy_freq``-th the actor's step
    (:func:`~distrl.algos.offline.td3bc_actor_loss`, its Q scale the mean over every worker's samples) and the
    targets' Polyak step."""

    def __init__(self, cfg: TD3BCConfig, obs_dim: int, action_dim: int, device: torch.device, seed: int):
        self.cfg, self.action_dim, self.device = cfg, action_dim, device
        net = (cfg.net_arch, cfg.activation)
        self.actor = Learned(
            _built(seed, lambda: DeterministicActor(obs_dim, action_dim, *net)), cfg.learning_rate, device
        )
        self.critic = Learned(
            _built(seed + 1, lambda: TwinCritic(obs_dim, action_dim, *net)), cfg.learning_rate, device
        )
        self.actor_target, self.critic_target = Target(self.actor, device), Target(self.critic, device)
        self.learned = {"actor": self.actor, "critic": self.critic}
        self.gradient_steps = 0
        self.generator = torch.Generator(device=device)
        self.reseed(seed, 0)

    def _targets(self) -> dict[str, Target]:
        return {"actor_target": self.actor_target, "critic_target": self.critic_target}

    def reseed(self, seed: int, segment: int) -> None:
        self.generator.manual_seed(int(np.random.SeedSequence([seed, segment, 0x7D3]).generate_state(1)[0]))

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        cfg = self.cfg
        noise = torch.randn((batch_size, self.action_dim), generator=self.generator, device=self.device)
        if batch.rows is not None:
            noise = noise[torch.as_tensor(batch.rows, device=self.device)]
        with torch.no_grad():
            smoothing = (noise * cfg.policy_noise).clamp(-cfg.noise_clip, cfg.noise_clip)
            next_action = (self.actor_target.module(batch.next_obs) + smoothing).clamp(-1.0, 1.0)
            next_q1, next_q2 = self.critic_target.module(batch.next_obs, next_action)
            y = td3_target(batch.rewards, batch.terminated, next_q1, next_q2, cfg.gamma)
        q1, q2 = self.critic.module(batch.obs, batch.actions)
        critic_loss = td3_critic_loss(q1, q2, y)
        sums = self.critic.step(critic_loss, _stats(batch, critic_loss, q1.sum()), sync)
        self.gradient_steps += 1
        count = max(sums[0], 1.0)
        metrics = {"losses/critic_loss": sums[1] / count, "losses/q_mean": sums[2] / count}
        if self.gradient_steps % cfg.policy_freq:
            return metrics
        action = self.actor.module(batch.obs)
        q1_pi, _ = self.critic.module(batch.obs, action)
        q_abs = sync.all_sum(np.array([float(q1_pi.detach().abs().sum()), float(batch.obs.shape[0])]))
        actor_loss = td3bc_actor_loss(q1_pi, action, batch.actions, cfg.alpha, q_abs[0] / max(q_abs[1], 1.0))
        actor_sums = self.actor.step(actor_loss, _stats(batch, actor_loss), sync)
        self.actor_target.follow(cfg.tau)
        self.critic_target.follow(cfg.tau)
        metrics["losses/actor_loss"] = actor_sums[1] / count
        return metrics

    @torch.no_grad()
    def act(self, obs: torch.Tensor) -> torch.Tensor:
        return self.actor.module(obs)


class IQLAlgo(_Counters):
    """IQL: the value function's expectile step, the critics' step bootstrapping from V(s') (computed before it),
    the target critics' Polyak step, then the policy's advantage-weighted step (advantages from V before its
    step), in the reference's order."""

    def __init__(self, cfg: IQLConfig, obs_dim: int, action_dim: int, device: torch.device, seed: int):
        self.cfg = cfg
        net = (cfg.net_arch, cfg.activation)
        self.actor = Learned(_built(seed, lambda: GaussianActor(obs_dim, action_dim, *net)), cfg.learning_rate, device)
        self.critic = Learned(
            _built(seed + 1, lambda: TwinCritic(obs_dim, action_dim, *net)), cfg.learning_rate, device
        )
        self.value = Learned(_built(seed + 2, lambda: ValueNet(obs_dim, *net)), cfg.learning_rate, device)
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
        value_sums = self.value.step(value_loss, _stats(batch, value_loss, v.sum()), sync)
        q1, q2 = self.critic.module(batch.obs, batch.actions)
        critic_loss = iql_critic_loss(q1, q2, batch.rewards, batch.terminated, next_v, cfg.gamma)
        critic_sums = self.critic.step(critic_loss, _stats(batch, critic_loss, q1.sum()), sync)
        self.critic_target.follow(cfg.tau)
        log_prob = self.actor.module.log_prob(batch.obs, batch.actions)
        actor_loss = iql_actor_loss(log_prob, q_min, v.detach(), cfg.beta, cfg.max_weight)
        actor_sums = self.actor.step(actor_loss, _stats(batch, actor_loss), sync)
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


def make_offline_algo(
    algo: str, cfg: OfflineConfig, obs_dim: int, actions: int, discrete: bool, device: torch.device, seed: int
) -> BCAlgo | TD3BCAlgo | IQLAlgo:
    """The update of ``algo`` for observations of ``obs_dim`` and ``actions`` action dimensions (or choices)."""
    if algo == "bc":
        assert isinstance(cfg, BCConfig)
        return BCAlgo(cfg, obs_dim, actions, discrete, device, seed)
    if algo == "td3bc":
        assert isinstance(cfg, TD3BCConfig)
        return TD3BCAlgo(cfg, obs_dim, actions, device, seed)
    assert algo == "iql" and isinstance(cfg, IQLConfig)
    return IQLAlgo(cfg, obs_dim, actions, device, seed)
