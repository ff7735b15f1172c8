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

Off-policy correction. The behaviour log-probabilities ``mu`` come from a generator that may be versions
behind, or run other kernels and precisions; ``offpolicy/*`` measures the gap on every step from the
log-probabilities the loss computes anyway (:mod:`distrl.algos.importance`). GRPO takes one optimizer
step per batch, so the learner's policy before the step (the *proximal* policy of decoupled PPO, Hilton
et al. 2021, arXiv:2110.00641; AReaL, Fu et al. 2025, arXiv:2505.24298) is the current one, detached.

- ``tis_cap``: token-level truncated importance sampling. The clipped ratio is taken to the proximal
  policy and each token's loss is weighted by ``min(pi / mu, tis_cap)``, detached: IMPALA's truncated
  rho-bar (Espeholt et al. 2018, arXiv:1802.01561) as Yao et al. 2025 apply it to the generator/learner
  mismatch ("Your efficient RL framework secretly brings you off-policy RL training",
  https://fengyao.notion.site/off-policy-rl). With one step per batch the proximal ratio is 1 and its clip
  never binds: the gradient is ``-min(rho, tis_cap) A grad log pi``.
- ``is_mask_low`` / ``is_mask_high``: completions whose ratio (over their tokens: the product, or its
  geometric mean, ``is_mask_level``) leaves the band carry no loss (rejection sampling, as verl's rollout
  correction does).

DAPO's overlong handling (Yu et al. 2025, arXiv:2503.14476, sec. 3.4), lengths counted in model tokens:

- ``overlong_filter``: completions cut at ``max_new_tokens`` carry no loss. The learner does not know the
  EOS ids, so a completion whose model tokens reach ``max_new_tokens`` counts as cut, even one whose last
  token ends it.
- ``overlong_buffer``: the soft overlong punishment (:func:`overlong_penalty`) is subtracted from the
  reward before the group advantages.

A completion that carries no loss leaves the loss mask as padding does: its tokens leave the ``dapo``
token count, while ``grpo`` and ``dr_grpo`` still count it among the completions they divide by (TRL's
``mask_truncated_completions`` does the same; verl's rejection likewise leaves its token-mean's
denominator). The decision is each completion's own and the counts remain sums, so the division is
still the global one.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from distrl.algos.importance import MISMATCH_STATS, mismatch_metrics, mismatch_sums, outside_band, sequence_log_ratio
from distrl.algos.optim import ClippedAdam, linear
from distrl.algos.protocols import Sync
from distrl.config import GRPOConfig
from distrl.data.groups import GroupSamples
from distrl.nets.group_policy import GroupPolicy

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


def overlong_penalty(lengths: np.ndarray, max_new_tokens: int, buffer: int, penalty: float) -> np.ndarray:
    """``[n]`` DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), as a penalty >= 0.

    With ``L_max = max_new_tokens`` and ``L_cache = buffer``: 0 up to ``L_max - L_cache`` tokens, then
    rising linearly to ``penalty`` at ``L_max``. No completion is longer than ``L_max``, so eq. 13's third
    case (-1 past ``L_max``) never arises. ``lengths [n]``: model tokens per completion.
    """
    if buffer <= 0:
        return np.zeros(len(lengths))
    over = np.clip(np.asarray(lengths, dtype=np.float64) - (max_new_tokens - buffer), 0.0, buffer)
    return penalty * over / buffer


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
    tis_cap: float = 0.0,
) -> TokenLoss:
    """GRPO's per-token objective on the policy's token log-probabilities [n, T]::

        r           = exp(log_prob - behaviour_log_prob)
        policy_loss = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))
        kl          = exp(ref - log_prob) - (ref - log_prob) - 1
        loss        = policy_loss + beta * kl

    With ``tis_cap > 0`` (truncated importance sampling) the ratio is taken to the proximal policy, the
    learner's own before this step, and the ratio to the behaviour policy becomes a truncated weight::

        w           = min(exp(log_prob.detach() - behaviour_log_prob), tis_cap)     (no gradient)
        r           = exp(log_prob - log_prob.detach())                   (1, gradient of log_prob)
        policy_loss = w * max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))

    ``advantages`` broadcast (``[n, 1]`` for one per completion). :func:`token_weights` turns the
    per-token losses into the batch's loss.
    """
    proximal, weight = behaviour_log_probs, None
    if tis_cap > 0:
        proximal = log_probs.detach()
        weight = torch.exp(proximal - behaviour_log_probs).clamp(max=tis_cap)
    ratio = torch.exp(log_probs - proximal)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    policy_loss = torch.max(unclipped, clipped)
    if weight is not None:
        policy_loss = weight * policy_loss
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
    "truncated",
    "overlong_penalty",
    "overlong_penalised",
    *MISMATCH_STATS,
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

    def penalty(self, batch: GroupSamples) -> np.ndarray:
        """``[n]`` the soft overlong penalty of each completion (zeros with ``overlong_buffer=0``)."""
        cfg = self.cfg
        return overlong_penalty(batch.mask.sum(1), cfg.max_new_tokens, cfg.overlong_buffer, cfg.overlong_penalty)

    def rewards(self, batch: GroupSamples) -> np.ndarray:
        """``[n]`` the rewards the advantages are taken from: the task's, less the soft overlong penalty."""
        assert batch.reward is not None
        return batch.reward - self.penalty(batch) if self.cfg.overlong_buffer > 0 else batch.reward

    def advantages(self, batch: GroupSamples, sync: Sync) -> torch.Tensor:
        """``[n]`` advantages of a scored batch (whole groups); ``batch`` scaling uses every worker's rewards."""
        rewards = torch.from_numpy(self.rewards(batch)).double().reshape(-1, batch.group_size)
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
            mask = tensors["mask"]
            log_ratio = log_probs.detach() - behaviour  # log(pi / mu) per token: measured, never differentiated
            # completions that carry no loss: their importance ratio outside the band, or cut (DAPO)
            masked = outside_band(
                sequence_log_ratio(log_ratio, mask, cfg.is_mask_level), cfg.is_mask_low, cfg.is_mask_high
            )
            dropped = masked | ((mask.sum(1) >= cfg.max_new_tokens) & cfg.overlong_filter)
            adv = advantages[rows].unsqueeze(1)
            losses = token_loss(log_probs, behaviour, adv, cfg.clip_range, cfg.clip_high, ref, cfg.beta, cfg.tis_cap)
            weights, count = token_weights(mask & ~dropped.unsqueeze(1), cfg.loss_type, cfg.max_new_tokens)
            loss = (losses.loss * weights).sum()
            loss.backward()  # accumulates into the flat gradient
            valid = mask.float()
            for name, value in mismatch_sums(log_ratio, mask, cfg.tis_cap, masked).items():
                sums[name] += value
            with torch.no_grad():
                sums["count"] += count
                sums["loss"] += float(loss)
                sums["policy_loss"] += float((losses.policy_loss * weights).sum())
                sums["kl"] += float((losses.kl * weights).sum())
                sums["clipped_tokens"] += float((losses.clipped.float() * valid).sum())
                sums["tokens"] += float(valid.sum())
        groups = self.rewards(batch).reshape(-1, batch.group_size)  # as the advantages see them
        penalty = self.penalty(batch)
        sums.update(
            completions=batch.size,
            reward=float(batch.reward.sum()),
            reward_sq=float(np.square(batch.reward).sum()),
            flat_groups=float((groups.std(axis=1) == 0).sum()),
            groups=groups.shape[0],
            lag=float((policy_version - batch.version).sum()),
            truncated=float((batch.mask.sum(1) >= cfg.max_new_tokens).sum()),
            overlong_penalty=float(penalty.sum()),
            overlong_penalised=float((penalty > 0).sum()),
        )
        stats = torch.tensor([sums[name] for name in STATS] + batch.rewards.sum(axis=0).tolist(), dtype=torch.float64)
        sync.gradients(grad, stats)
        count = float(stats[STATS.index("count")])
        lr = linear(cfg.learning_rate, progress_remaining, cfg.lr_schedule)
        grad_norm = self.optimizer.step(lr, samples=max(count, 1e-12))
        return self.metrics(stats, grad_norm, lr)

    def metrics(self, stats: torch.Tensor, grad_norm: float, lr: float) -> dict[str, float]:
        """Means of the global sums. ``rewards/*`` are the task's rewards, the overlong penalty apart; the
        ``offpolicy/*`` ratios are over every model token and completion, those that carried no loss included."""
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
            "completions/truncated_fraction": s["truncated"] / n,
            "rewards/overlong_penalty": s["overlong_penalty"] / n,
            "rewards/overlong_penalised_fraction": s["overlong_penalised"] / n,
            **mismatch_metrics(s, s["tokens"], s["completions"], self.cfg.tis_cap),
        }
        for k, total in enumerate(stats[len(STATS) :].tolist()):
            out[f"rewards/{k}"] = total / n
        return out

    def state_dict(self) -> dict[str, torch.Tensor]:
        return self.optimizer.state_dict()

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.optimizer.load_state_dict(tensors)
