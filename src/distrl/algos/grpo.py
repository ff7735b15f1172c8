"""Group-relative PPO (GRPO-style): advantages relative to the other samples drawn for the same input.

For every input state the generator draws a group of G actions; each action's advantage is
its reward minus the group's mean reward, divided by the group's standard deviation. The
loss is PPO's clipped surrogate against the behaviour log-probabilities (the generator's
policy may be a few versions old) plus a KL penalty to a frozen reference policy, estimated
per sample as ``exp(ref - new) - (ref - new) - 1`` (non-negative, unbiased; Schulman's k3).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from distrl.config import GRPOConfig


def group_advantages(rewards: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``[B, G]`` rewards → advantages normalised within each group of G (a row); a flat group gives 0."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True, unbiased=False)
    return (rewards - mean) / (std + eps)


def grpo_loss(log_probs: torch.Tensor, behaviour_log_probs: torch.Tensor, ref_log_probs: torch.Tensor,
              advantages: torch.Tensor, clip_range: float, kl_coef: float) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate against the behaviour policy plus ``kl_coef`` × KL(new ‖ reference), all means."""
    ratio = torch.exp(log_probs - behaviour_log_probs)
    surrogate = torch.minimum(ratio * advantages, ratio.clamp(1 - clip_range, 1 + clip_range) * advantages)
    log_ref_ratio = ref_log_probs - log_probs
    kl = (torch.exp(log_ref_ratio) - log_ref_ratio - 1).mean()
    policy_loss = -surrogate.mean()
    loss = policy_loss + kl_coef * kl
    clipped = ((ratio - 1).abs() > clip_range).float().mean()
    return loss, {"policy_loss": policy_loss.item(), "kl_ref": kl.item(), "clip_fraction": clipped.item()}


class GroupPolicy(nn.Module):
    """A categorical policy over ``n_actions`` for a flat observation: an MLP to logits."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: tuple[int, ...], seed: int):
        super().__init__()
        torch.manual_seed(seed)
        layers: list[nn.Module] = []
        sizes = (obs_dim, *hidden)
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.Tanh()]
        layers.append(nn.Linear(sizes[-1], n_actions))
        self.net = nn.Sequential(*layers)

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)

    def flat_weights(self) -> np.ndarray:
        return nn.utils.parameters_to_vector(self.parameters()).detach().numpy().copy()

    def load_flat_weights(self, flat: np.ndarray) -> None:
        nn.utils.vector_to_parameters(torch.from_numpy(flat), self.parameters())

    def log_probs(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``obs [B, D]``, ``actions [B, G]`` → log-probabilities ``[B, G]``."""
        return torch.log_softmax(self.logits(obs), dim=-1).gather(1, actions)

    @torch.inference_mode()
    def sample(self, obs: torch.Tensor, group_size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """G actions per row of ``obs`` and their log-probabilities, both ``[B, G]``."""
        log_p = torch.log_softmax(self.logits(obs), dim=-1)
        actions = torch.multinomial(log_p.exp(), group_size, replacement=True, generator=generator)
        return actions, log_p.gather(1, actions)


@dataclass(frozen=True)
class GroupBatch:
    """Scored groups: ``obs [B, D]``, ``actions``/``behaviour_log_probs``/``rewards`` ``[B, G]``; the version
    of the policy that drew each row."""

    obs: torch.Tensor
    actions: torch.Tensor
    behaviour_log_probs: torch.Tensor
    rewards: torch.Tensor
    versions: torch.Tensor


class GRPOAlgo:
    """One learner: policy, frozen reference copy and Adam; ``update`` is one gradient step."""

    def __init__(self, obs_dim: int, n_actions: int, cfg: GRPOConfig, seed: int):
        self.cfg = cfg
        self.policy = GroupPolicy(obs_dim, n_actions, cfg.net_arch, seed)
        self.reference = GroupPolicy(obs_dim, n_actions, cfg.net_arch, seed)
        self.reference.load_state_dict(self.policy.state_dict())
        self.reference.requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.policy.parameters(), lr=cfg.learning_rate)
        self.version = 0

    def update(self, batch: GroupBatch) -> dict[str, float]:
        advantages = group_advantages(batch.rewards)
        log_probs = self.policy.log_probs(batch.obs, batch.actions)
        with torch.no_grad():
            ref_log_probs = self.reference.log_probs(batch.obs, batch.actions)
        loss, stats = grpo_loss(log_probs, batch.behaviour_log_probs, ref_log_probs, advantages,
                                self.cfg.clip_range, self.cfg.kl_coef)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        grad_norm = nn.utils.clip_grad_norm_(self.policy.parameters(), self.cfg.max_grad_norm)
        self.optimizer.step()
        self.version += 1
        lag = self.version - 1 - batch.versions
        return {**stats, "loss": loss.item(), "grad_norm": float(grad_norm), "mean_reward": float(batch.rewards.mean()),
                "lag_mean": float(lag.float().mean()), "lag_max": float(lag.max())}

    def weights(self) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in self.policy.state_dict().items()}

    def flat_weights(self) -> np.ndarray:
        """The policy's parameters as one float32 vector: the cheapest form to send to a generator."""
        return self.policy.flat_weights()
