"""REINFORCE (Williams 1992): ascend ``E[sum_t log pi(a_t|s_t) (G_t - b(s_t))]``.

``G_t`` is the discounted return from step t to the episode's end; with ``baseline`` a
learned state value is subtracted (and fitted to ``G_t``). Returns (or advantages) are
standardised over the whole batch, over every worker. One gradient step per batch of
whole episodes.
"""

from __future__ import annotations

import numpy as np
import torch

from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.estimators import discounted_returns
from distrl.algos.optim import ClippedAdam
from distrl.algos.protocols import Sync
from distrl.config import REINFORCEConfig
from distrl.data.episodes import EpisodeBatch
from distrl.nets import Agent


def episode_returns_to_go(rewards: np.ndarray, starts: np.ndarray, gamma: float) -> np.ndarray:
    """Discounted return from every step to the end of its episode, for concatenated episodes."""
    return np.concatenate([discounted_returns(rewards[a:b], gamma) for a, b in zip(starts[:-1], starts[1:])])


def reinforce_loss(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    returns: torch.Tensor,
    advantages: torch.Tensor,
    baseline: bool,
    vf_coef: float,
    ent_coef: float,
) -> torch.Tensor:
    """REINFORCE's objective on the network's outputs, summed over the batch's steps (all arguments [B])::

        loss = -log_prob * A + vf_coef * (v - G)^2 - ent_coef * entropy

    ``A`` is the (standardised) return or, with a ``baseline``, the return less the detached value;
    the value term fits the baseline to the return ``G`` and is left out without one.
    """
    loss = -log_prob * advantages
    if baseline:
        loss = loss + vf_coef * (values - returns).square()
    if ent_coef:
        loss = loss - ent_coef * entropy
    return loss.sum()


class REINFORCEAlgo:
    """Monte-Carlo policy gradient over an agent (its critic is the optional baseline)."""

    def __init__(self, cfg: REINFORCEConfig, agent: Agent):
        self.cfg = cfg
        self.agent = agent
        self.optimizer = ClippedAdam(agent.params, cfg.learning_rate, eps=1e-8, max_grad_norm=cfg.max_grad_norm)

    def update(self, batch: EpisodeBatch, sync: Sync) -> dict[str, float]:
        cfg, agent, device = self.cfg, self.agent, self.agent.device
        returns = torch.from_numpy(episode_returns_to_go(batch.rewards, batch.starts, cfg.gamma)).float().to(device)
        obs = torch.from_numpy(batch.obs).to(device)
        actions = torch.from_numpy(batch.actions).to(device)
        if agent.recurrent:  # each episode one sequence from the initial state
            fwd = agent.forward_episodes(obs, batch.starts)
        else:
            fwd = agent.forward_train(obs)
        terms = agent.dist_terms(fwd, actions)
        advantages = returns - fwd.values.detach() if cfg.baseline else returns
        if cfg.normalize_returns:
            adv = advantages.double()
            count, total, total_sq = sync.all_sum(np.array([len(adv), float(adv.sum()), float(adv.square().sum())]))
            mean = total / max(count, 1.0)
            std = np.sqrt(max(total_sq / max(count, 1.0) - mean * mean, 0.0))
            advantages = (advantages - mean) / (std + 1e-8)
        outputs = leaves(terms.log_prob, terms.entropy, fwd.values)
        loss = reinforce_loss(*outputs, returns, advantages, cfg.baseline, cfg.vf_coef, cfg.ent_coef)
        agent.backward(fwd, terms, actions, *output_grads(loss, outputs))
        with torch.no_grad():
            value_loss = (fwd.values - returns).square() if cfg.baseline else torch.zeros_like(returns)
            stats = torch.stack(
                [
                    torch.tensor(float(len(returns)), device=terms.log_prob.device),
                    (-terms.log_prob * advantages).sum(),
                    value_loss.sum(),
                    terms.entropy.sum(),
                ]
            ).double()
        sync.gradients(agent.params.grad, stats)
        count = float(stats[0])
        grad_norm = self.optimizer.step(samples=count)
        agent.refresh_acting_copy()
        return {
            "losses/policy_loss": float(stats[1]) / count,
            "losses/value_loss": float(stats[2]) / count,
            "losses/entropy": float(stats[3]) / count,
            "losses/grad_norm": grad_norm,
        }

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.optimizer.state_dict()

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(tensors)
