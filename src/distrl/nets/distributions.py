"""Log-probabilities and entropies of policy heads, and their gradients in closed form.

The gradients a head receives are d(loss)/d(log_prob) and d(loss)/d(entropy) per sample, which autograd
computes over the algorithm's plain loss (:func:`distrl.algos.autodiff.output_grads`; the loss itself is in
``algos/``); the ``*_grad`` functions turn them into d(loss)/d(head outputs) (logits, or mean and log-std)
for the closed-form MLPs below. Each is checked against torch.distributions and autograd in
``tests/nets/test_nets.py``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)


@dataclass
class CategoricalTerms:
    log_prob: torch.Tensor  # [B]
    entropy: torch.Tensor  # [B]
    log_p: torch.Tensor  # [B, K] log-softmax of the logits
    p: torch.Tensor  # [B, K]


def categorical_terms(logits: torch.Tensor, actions: torch.Tensor) -> CategoricalTerms:
    """Log-probability of integer ``actions`` [B] under ``logits`` [B, K], and the entropy."""
    log_p = torch.log_softmax(logits, dim=-1)
    p = log_p.exp()
    log_prob = log_p.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    entropy = -(p * log_p).sum(-1)
    return CategoricalTerms(log_prob, entropy, log_p, p)


def categorical_grad(
    terms: CategoricalTerms, actions: torch.Tensor, d_log_prob: torch.Tensor, d_entropy: torch.Tensor | None
) -> torch.Tensor:
    """d(loss)/d(logits) [B, K] from d(loss)/d(log_prob) [B] and d(loss)/d(entropy) [B].

    d log p_a / d z_j = [a = j] - p_j, and d H / d z_j = -p_j (log p_j + H).
    """
    grad = terms.p * (-d_log_prob).unsqueeze(1)
    grad.scatter_add_(1, actions.long().unsqueeze(1), d_log_prob.unsqueeze(1))
    if d_entropy is not None:
        grad -= terms.p * (terms.log_p + terms.entropy.unsqueeze(1)) * d_entropy.unsqueeze(1)
    return grad


@dataclass
class GaussianTerms:
    log_prob: torch.Tensor  # [B]
    entropy: torch.Tensor  # [B]
    z: torch.Tensor  # [B, A] standardised actions (a - mean) / std
    std: torch.Tensor  # [A]
    z_sq: torch.Tensor  # [B, A] z squared (the log-density's, which the gradient uses again)


def gaussian_terms(mean: torch.Tensor, log_std: torch.Tensor, actions: torch.Tensor) -> GaussianTerms:
    """Diagonal Gaussian log-density of ``actions`` [B, A] and entropy [B]; log_std is [A].

    log N = -z^2 / 2 - log std - log sqrt(2 pi) and H = 1/2 + log sqrt(2 pi) + log std, each summed over the A
    dimensions."""
    std = log_std.exp()
    z = (actions - mean) / std
    z_sq = z.square()
    log_std_sum = log_std.sum()
    dims = mean.shape[1]
    log_prob = z_sq.sum(-1).mul_(-0.5).sub_(log_std_sum + LOG_SQRT_2PI * dims)
    entropy = (log_std_sum + (0.5 + LOG_SQRT_2PI) * dims).expand(mean.shape[0])
    return GaussianTerms(log_prob, entropy, z, std, z_sq)


def gaussian_grad(
    terms: GaussianTerms, d_log_prob: torch.Tensor, d_entropy: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """d(loss)/d(mean) [B, A] and d(loss)/d(log_std) [A].

    d log N / d mean = z / std, d log N / d log_std = z^2 - 1, d H / d log_std = 1.
    """
    d = d_log_prob.unsqueeze(1)
    d_mean = d * terms.z / terms.std
    d_log_std = (d * (terms.z_sq - 1.0)).sum(0)
    if d_entropy is not None:
        d_log_std += d_entropy.sum()
    return d_mean, d_log_std


def multi_categorical_terms(logits: torch.Tensor, actions: torch.Tensor, nvec: tuple[int, ...]) -> CategoricalTerms:
    """Independent choices: ``logits`` [B, sum(nvec)], ``actions`` [B, len(nvec)]; log-prob and entropy
    are sums over the parts. ``log_p`` and ``p`` hold every part's log-softmax side by side."""
    log_p = torch.cat([torch.log_softmax(part, -1) for part in logits.split(nvec, dim=-1)], -1)
    p = log_p.exp()
    offsets = torch.tensor([0, *nvec[:-1]], device=logits.device).cumsum(0)
    log_prob = log_p.gather(1, actions.long() + offsets).sum(1)
    entropy = -(p * log_p).sum(-1)
    return CategoricalTerms(log_prob, entropy, log_p, p)


def sample_actions(
    kind: str, out: np.ndarray, std: np.ndarray | None, noise: np.ndarray | None, nvec: tuple[int, ...] = ()
) -> np.ndarray:
    """Actions from head outputs ``out`` [B, head] (numpy), with the caller's noise.

    Choices are drawn by inverse-CDF sampling from uniforms (one per choice), Gaussian actions
    as ``mean + std * normal``; ``noise=None`` acts deterministically (argmax, mean). The noise
    is drawn by the caller from per-environment streams, so that the same environments take
    the same actions however they are split over workers.
    """
    if kind == "gaussian":
        return out if noise is None else out + std * noise
    if kind == "categorical":
        return inverse_cdf_sample(out, None if noise is None else noise)
    parts = np.split(out, np.cumsum(nvec)[:-1], axis=-1)
    return np.stack(
        [inverse_cdf_sample(part, None if noise is None else noise[:, j]) for j, part in enumerate(parts)], 1
    )


def inverse_cdf_sample(logits: np.ndarray, uniform: np.ndarray | None) -> np.ndarray:
    """A choice per row of ``logits`` [B, K] from uniforms [B] (argmax for None)."""
    if uniform is None:
        return logits.argmax(-1)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    cdf = np.cumsum(probs, -1)  # >=: a choice of probability 0 (a masked one) is passed over even at uniform 0
    return np.minimum((uniform[:, None] * cdf[:, -1:] >= cdf).sum(-1), logits.shape[-1] - 1)


def sample_tokens(
    logits: torch.Tensor, uniforms: torch.Tensor | None, temperature: float = 1.0, top_p: float = 1.0
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits [n, V]`` and its log-probability under ``softmax(logits / temperature)``.

    Drawn by inverse CDF with ``uniforms [n]`` (the caller's randomness, so that a draw does not depend
    on which process makes it); ``None`` or ``temperature == 0`` takes the most likely token. With
    ``top_p < 1`` only the smallest set of most likely tokens whose probability reaches ``top_p`` can be
    drawn (nucleus sampling, Holtzman et al. 2019, arXiv:1904.09751); the log-probability is still the
    one of the whole tempered distribution, which is the policy a learner recomputes.
    """
    logits = logits.float()
    if uniforms is None or temperature == 0:
        tokens = logits.argmax(-1)
        log_probs = torch.log_softmax(logits, -1).gather(1, tokens.unsqueeze(1)).squeeze(1)
        return tokens, log_probs
    log_p = torch.log_softmax(logits / temperature, -1)
    probs = log_p.exp()
    if top_p < 1.0:
        sorted_p, order = probs.sort(dim=-1, descending=True)
        sorted_p = sorted_p * ((sorted_p.cumsum(-1) - sorted_p) < top_p)  # the most likely token always stays
        cdf = sorted_p.cumsum(-1)
        chosen = (cdf < uniforms.unsqueeze(1) * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[1] - 1)
        tokens = order.gather(1, chosen.unsqueeze(1)).squeeze(1)
    else:
        cdf = probs.cumsum(-1)
        tokens = (cdf < uniforms.unsqueeze(1) * cdf[:, -1:]).sum(-1).clamp(max=probs.shape[1] - 1)
    return tokens, log_p.gather(1, tokens.unsqueeze(1)).squeeze(1)
