"""How far the learner's policy has drifted from the policy that drew the tokens, and which completions to drop.

A token drawn by the behaviour policy ``mu`` (a generator a few versions behind, or the same weights in
another numeric precision or kernel) is trained on by the learner ``pi``. Its importance ratio is
``rho = pi / mu``, from the per-token log-ratio ``log_ratio = log pi - log mu`` (``[n, T]``, taken with the
learner's log-probabilities detached: these are measurements, not part of any gradient).

The functions here are pure: per-token tensors ``[n, T]`` with a mask ``[n, T]`` of the tokens that count
(the model's tokens, ``GroupSamples.mask``), per-completion tensors ``[n]``. The statistics come back as
sums (named once, in :data:`MISMATCH_STATS`) so they add up over microbatches and workers like the
gradient; :func:`mismatch_metrics` turns the global sums into means.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch

MISMATCH_STATS = ("ratio", "ratio_sq", "ratio_k3", "tis_clipped", "ess_weight", "ess_weight_sq", "masked")
"""Sums over model tokens (``ratio``, ``ratio_sq``, ``ratio_k3``, ``tis_clipped``) and over completions (the
rest) that :func:`mismatch_sums` returns and :func:`mismatch_metrics` reads."""


def sequence_log_ratio(log_ratio: torch.Tensor, mask: torch.Tensor, level: str) -> torch.Tensor:
    """``[n]`` log of each completion's importance ratio over its masked tokens.

    ``sequence``: the log of the product of the token ratios (the likelihood ratio of the whole completion);
    ``geometric``: the log of their geometric mean (the product's ``1 / length`` power), which does not grow
    with the length, so one band fits short and long completions (Liu, Li et al. 2025, "When speed kills
    stability", https://richardli.xyz/rl-collapse-3). A completion with no masked token has ratio 1.
    """
    mask = mask.to(log_ratio.dtype)
    total = (log_ratio * mask).sum(1)
    if level == "sequence":
        return total
    return total / mask.sum(1).clamp(min=1.0)


def outside_band(log_rho: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """``[n]`` bool: where ``exp(log_rho)`` lies outside ``[low, high]``; a bound of 0 is open.

    Compared in log space, so a sequence-level ratio that overflows a float still compares correctly.
    """
    out = torch.zeros_like(log_rho, dtype=torch.bool)
    if low > 0:
        out |= log_rho < math.log(low)
    if high > 0:
        out |= log_rho > math.log(high)
    return out


def mismatch_sums(
    log_ratio: torch.Tensor, mask: torch.Tensor, tis_cap: float, masked: torch.Tensor
) -> dict[str, float]:
    """The sums of :data:`MISMATCH_STATS` for one microbatch (float64, no gradient).

    Per model token, with ``rho = exp(log_ratio)``: ``rho``, ``rho^2``, Schulman's k3 ``rho - 1 - log rho``
    (non-negative; its mean under ``mu`` estimates KL(mu || pi), http://joschu.net/blog/kl-approx.html),
    and whether ``rho > tis_cap`` (0 when ``tis_cap`` is 0). Per completion: its geometric-mean ratio ``w``
    (:func:`sequence_log_ratio` at ``geometric``; the product would overflow on long completions) and
    ``w^2``, for the effective sample size, and ``masked [n]`` (bool), the completions dropped by the band.
    """
    with torch.no_grad():
        log_ratio, valid = log_ratio.double(), mask.double()
        log_ratio = log_ratio * valid
        rho = torch.exp(log_ratio)
        w = torch.exp(sequence_log_ratio(log_ratio, mask, "geometric"))
        clipped = (rho > tis_cap).double() * valid if tis_cap > 0 else torch.zeros_like(valid)
        return {
            "ratio": float((rho * valid).sum()),
            "ratio_sq": float((rho.square() * valid).sum()),
            "ratio_k3": float(((rho - 1.0 - log_ratio) * valid).sum()),
            "tis_clipped": float(clipped.sum()),
            "ess_weight": float(w.sum()),
            "ess_weight_sq": float(w.square().sum()),
            "masked": float(masked.sum()),
        }


def mismatch_metrics(sums: Mapping[str, float], tokens: float, completions: float, tis_cap: float) -> dict[str, float]:
    """``offpolicy/*`` metrics from the global sums of :data:`MISMATCH_STATS`, ``tokens`` model tokens and
    ``completions`` completions.

    ``ess`` is the normalised effective sample size of the completions' geometric-mean ratios ``w``:
    ``(sum w)^2 / (n sum w^2)``, 1 when every ``w`` is equal (on-policy), ``1 / n`` when one dominates
    (Kong 1992, "A note on importance sampling using standardized weights"; Owen 2013, "Monte Carlo theory,
    methods and examples", ch. 9).
    """
    t, n = max(tokens, 1.0), max(completions, 1.0)
    mean = sums["ratio"] / t
    out = {
        "offpolicy/ratio_mean": mean,
        "offpolicy/ratio_std": math.sqrt(max(sums["ratio_sq"] / t - mean * mean, 0.0)),
        "offpolicy/kl_k3": sums["ratio_k3"] / t,
        "offpolicy/ess": sums["ess_weight"] ** 2 / (n * sums["ess_weight_sq"]) if sums["ess_weight_sq"] > 0 else 1.0,
        "offpolicy/masked_fraction": sums["masked"] / n,
    }
    if tis_cap > 0:
        out["offpolicy/tis_clipped_fraction"] = sums["tis_clipped"] / t
    return out
