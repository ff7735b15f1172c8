"""Group Relative Policy Optimization (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

For every prompt the policy draws a group of G completions; a completion's advantage is its reward
relative to the group's: ``A = r - mean(r_group)``, divided by the group's standard deviation unless
``scale_rewards='none'`` (Dr. GRPO, Liu et al. 2025, arXiv:2503.20783), or by the whole batch's with
``'batch'``. Every token of a completion carries its completion's advantage in PPO's clipped surrogate
against the behaviour log-probabilities (the generator's policy may be a few versions old), with the
clip range ``[1 - clip_range, 1 + clip_range_high]`` (DAPO's clip-higher, Yu et al. 2025,
arXiv:2503.14476), plus ``beta`` times the KL to a frozen reference model, estimated per token as
``exp(ref - new) - (ref - new) - 1`` (non-negative, unbiased; Schulman's k3).

Per-token losses become one number in one of three ways (``loss_type``):

- ``grpo``: each completion's mean over its tokens, then the mean over completions;
- ``dr_grpo``: the sum over all tokens divided by completions × ``max_new_tokens`` (no length bias);
- ``dapo``: the sum over all tokens divided by the number of tokens (token-level mean).

Each is a weighted sum of per-token losses divided by a count: weights ``1 / length`` and the number
of completions, weights 1 and completions × ``max_new_tokens``, weights 1 and the number of tokens.
So, as for every algorithm here, the learner sums weighted per-token gradients over its microbatches
(gradient accumulation) and over workers (``Sync``), divides by the global count, clips, and steps:
the gradient is the one of the whole global batch, however it is split.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from distrl.algos.optim import ClippedAdam, linear
from distrl.config import GRPOConfig
from distrl.data.groups import GroupSamples
from distrl.nets.group_policy import GroupPolicy
from distrl.protocols import Sync

ADVANTAGE_EPS = 1e-4


def group_advantages(rewards: torch.Tensor, scale: str = "group", batch_std: float | None = None) -> torch.Tensor:
    """``[B, G]`` rewards → advantages relative to each group's mean (a row).

    ``scale``: ``group`` divides by each group's standard deviation (Bessel-corrected, as TRL computes
    it), ``batch`` by ``batch_std`` (the whole global batch's), ``none`` not at all. A group whose
    rewards are all equal teaches nothing: its advantages are 0.
    """
    centred = rewards - rewards.mean(dim=1, keepdim=True)
    if scale == "none":
        return centred
    if scale == "batch":
        assert batch_std is not None
        return centred / (batch_std + ADVANTAGE_EPS)
    return centred / (rewards.std(dim=1, keepdim=True) + ADVANTAGE_EPS)


class TokenLoss(NamedTuple):
    """GRPO's per-token loss and its parts, each [n, T]."""

    loss: torch.Tensor
    """``policy_loss + beta * kl``."""
    policy_loss: torch.Tensor
    """The clipped surrogate."""
    kl: torch.Tensor
    """k3 estimate of KL(new || reference); zeros without a reference."""
    clipped: torch.Tensor
    """Where the clipped term was the larger (bool)."""


def token_loss(
    log_probs: torch.Tensor,
    behaviour_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    clip_low: float,
    clip_high: float,
    ref_log_probs: torch.Tensor | None = None,
    beta: float = 0.0,
) -> TokenLoss:
    """GRPO's per-token objective on the policy's token log-probabilities [n, T]::

        r           = exp(log_prob - behaviour_log_prob)
        policy_loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        kl          = exp(ref - log_prob) - (ref - log_prob) - 1
        loss        = policy_loss + beta * kl

    ``advantages`` broadcast (``[n, 1]`` for one per completion). :func:`token_weights` turns the
    per-token losses into the batch's loss.
    """
    ratio = torch.exp(log_probs - behaviour_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    policy_loss = torch.max(unclipped, clipped)
    if ref_log_probs is None or beta == 0.0:
        kl = torch.zeros_like(policy_loss)
        loss = policy_loss
    else:
        kl = torch.exp(ref_log_probs - log_probs) - (ref_log_probs - log_probs) - 1.0
        loss = policy_loss + beta * kl
    return TokenLoss(loss, policy_loss, kl, (clipped > unclipped).detach())


def token_weights(mask: torch.Tensor, loss_type: str, max_new_tokens: int) -> tuple[torch.Tensor, float]:
    """Per-token weights ``[n, T]`` and the count the weighted sum is divided by, for ``loss_type``.

    The count is this batch's share: counts add up over microbatches and workers, so the global
    division is the one a single process holding the whole batch makes.
    """
    mask = mask.float()
    if loss_type == "grpo":
        return mask / mask.sum(1, keepdim=True).clamp(min=1.0), float(mask.shape[0])
    if loss_type == "dr_grpo":
        return mask, float(mask.shape[0] * max_new_tokens)
    return mask, float(mask.sum())


STATS = (
    "count",
    "loss",
    "policy_loss",
    "kl",
    "clipped_tokens",
    "tokens",
    "completions",
    "reward",
    "reward_sq",
    "flat_groups",
    "groups",
    "lag",
)
"""Sums that travel with the gradient (then per-reward-function sums follow)."""


class GRPOAlgo:
    """The GRPO learning rule over a group policy; ``update`` is one optimizer step on one global batch."""

    def __init__(self, cfg: GRPOConfig, policy: GroupPolicy, reference: GroupPolicy | None = None):
        if cfg.beta > 0 and reference is None:
            raise ValueError("beta > 0 needs a reference policy")
        self.cfg = cfg
        self.policy = policy
        self.reference = reference if cfg.beta > 0 else None
        # Adam as transformers and TRL set it up for language models (eps 1e-8, no weight decay)
        self.optimizer = ClippedAdam(policy.params, cfg.learning_rate, eps=1e-8, max_grad_norm=cfg.max_grad_norm)

    def advantages(self, batch: GroupSamples, sync: Sync) -> torch.Tensor:
        """``[n]`` advantages of a scored batch (whole groups); ``batch`` scaling uses every worker's rewards."""
        assert batch.reward is not None
        rewards = torch.from_numpy(batch.reward).double().reshape(-1, batch.group_size)
        batch_std = None
        if self.cfg.scale_rewards == "batch":
            n, total, total_sq = sync.all_sum(
                np.array([rewards.numel(), float(rewards.sum()), float(rewards.square().sum())])
            )
            mean = total / max(n, 1.0)
            batch_std = float(np.sqrt(max(total_sq / max(n, 1.0) - mean * mean, 0.0) * n / max(n - 1.0, 1.0)))
        return group_advantages(rewards, self.cfg.scale_rewards, batch_std).reshape(-1).float()

    def update(
        self, batch: GroupSamples, sync: Sync, policy_version: int = 0, progress_remaining: float = 1.0
    ) -> dict[str, float]:
        """Gradient of the batch's loss (in microbatches) → ``sync.gradients`` → divide by the global count →
        clip → Adam step. ``policy_version`` is the learner's, for the staleness statistics."""
        cfg = self.cfg
        policy, device = self.policy, self.policy.device
        advantages = self.advantages(batch, sync).to(device)
        assert batch.rewards is not None and batch.reward is not None
        grad = policy.params.grad
        grad.zero_()
        sums = dict.fromkeys(STATS, 0.0)
        per = cfg.microbatch_size or batch.size
        for start in range(0, batch.size, per):
            rows = slice(start, min(start + per, batch.size))
            part = batch.rows(rows)
            tensors = part.to_torch(device)
            log_probs = policy.token_log_probs(
                tensors["prompt"], tensors["prompt_mask"], tensors["tokens"], tensors["attention"]
            )
            ref = None
            if self.reference is not None:
                with torch.no_grad():
                    ref = self.reference.token_log_probs(
                        tensors["prompt"], tensors["prompt_mask"], tensors["tokens"], tensors["attention"]
                    )
            behaviour = torch.from_numpy(part.log_probs).to(device)
            losses = token_loss(
                log_probs, behaviour, advantages[rows].unsqueeze(1), cfg.clip_range, cfg.clip_high, ref, cfg.beta
            )
            weights, count = token_weights(tensors["mask"], cfg.loss_type, cfg.max_new_tokens)
            loss = (losses.loss * weights).sum()
            loss.backward()  # accumulates into the flat gradient
            valid = tensors["mask"].float()
            with torch.no_grad():
                sums["count"] += count
                sums["loss"] += float(loss)
                sums["policy_loss"] += float((losses.policy_loss * weights).sum())
                sums["kl"] += float((losses.kl * weights).sum())
                sums["clipped_tokens"] += float((losses.clipped.float() * valid).sum())
                sums["tokens"] += float(valid.sum())
        groups = batch.reward.reshape(-1, batch.group_size)
        sums.update(
            completions=batch.size,
            reward=float(batch.reward.sum()),
            reward_sq=float(np.square(batch.reward).sum()),
            flat_groups=float((groups.std(axis=1) == 0).sum()),
            groups=groups.shape[0],
            lag=float((policy_version - batch.version).sum()),
        )
        stats = torch.tensor([sums[name] for name in STATS] + batch.rewards.sum(axis=0).tolist(), dtype=torch.float64)
        sync.gradients(grad, stats)
        count = float(stats[0])
        grad.div_(max(count, 1e-12))
        lr = linear(cfg.learning_rate, progress_remaining, cfg.lr_schedule)
        grad_norm = self.optimizer.step(lr)
        return self.metrics(stats, grad_norm, lr)

    def metrics(self, stats: torch.Tensor, grad_norm: float, lr: float) -> dict[str, float]:
        s = dict(zip(STATS, stats.tolist()))
        n = max(s["completions"], 1.0)
        mean = s["reward"] / n
        out = {
            "losses/loss": s["loss"] / max(s["count"], 1e-12),
            "losses/policy_loss": s["policy_loss"] / max(s["count"], 1e-12),
            "losses/kl": s["kl"] / max(s["count"], 1e-12),
            "losses/clip_fraction": s["clipped_tokens"] / max(s["tokens"], 1.0),
            "losses/grad_norm": grad_norm,
            "charts/learning_rate": lr,
            "rewards/mean": mean,
            "rewards/std": float(np.sqrt(max(s["reward_sq"] / n - mean * mean, 0.0))),
            "rewards/flat_group_fraction": s["flat_groups"] / max(s["groups"], 1.0),
            "completions/mean_length": s["tokens"] / n,
            "completions/count": s["completions"],
            "completions/tokens": s["tokens"],
            "pipeline/policy_lag_mean": s["lag"] / n,
        }
        for k, total in enumerate(stats[len(STATS) :].tolist()):
            out[f"rewards/{k}"] = total / n
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.optimizer.state_dict()

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(tensors)
