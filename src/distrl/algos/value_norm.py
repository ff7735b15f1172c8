"""Value normalisation (Yu et al. 2022, arXiv:2103.01955, "The Surprising Effectiveness of PPO in Cooperative
Multi-Agent Games", section 4 and appendix: "value normalization").

The critic's output ``z`` is a value in normalised units. A running normaliser keeps exponentially weighted
moments of the value targets (the returns), and the actor-critic works in the returns' units everywhere but at
the critic's output: the values that GAE or V-trace bootstrap from are ``z * std + mean``, and the value loss
compares ``z`` with ``(R - mean) / std``. The critic then never chases targets whose scale drifts over training.

After an update from a batch of returns with mean ``m`` and mean of squares ``q`` (decay ``beta``)::

    running_mean    <- beta * running_mean    + (1 - beta) * m
    running_mean_sq <- beta * running_mean_sq + (1 - beta) * q
    debiasing_term  <- beta * debiasing_term  + (1 - beta)

and the statistics are the debiased moments (as Adam's bias correction: ``debiasing_term = 1 - beta^k`` after
``k`` updates, so the first update's statistics are exactly the batch's)::

    mean = running_mean / debias,  var = max(running_mean_sq / debias - mean^2, 1e-2),  std = sqrt(var)

with ``debias = max(debiasing_term, 1e-5)``: before any update the statistics are mean 0 and var 1e-2 (the
floor). Every worker updates from the same moments summed over workers, so all keep identical statistics.
"""

from __future__ import annotations

import math

import numpy as np
import torch

VALUE_NORM_KEYS = ("running_mean", "running_mean_sq", "debiasing_term")
"""The normaliser's state, in the order of :attr:`ValueNormalizer.state` (checkpoint names, ``value_norm/<key>``)."""


class ValueNormalizer:
    """Running mean and variance of the value targets, to normalise and denormalise values (see the module)."""

    def __init__(self, beta: float = 0.99999, var_floor: float = 1e-2, debias_floor: float = 1e-5):
        self.beta = beta
        self.var_floor = var_floor
        self.debias_floor = debias_floor
        self.state = torch.zeros(len(VALUE_NORM_KEYS), dtype=torch.float64)
        """[running_mean, running_mean_sq, debiasing_term], float64 on the CPU: one tensor, so that the start-up
        broadcast and checkpoints carry it whole."""

    @staticmethod
    def moments(returns: torch.Tensor, valid: torch.Tensor) -> np.ndarray:
        """[count, sum, sum of squares] of ``returns`` over valid samples (float64; summable over workers)."""
        r, w = returns.double(), valid.double()
        return torch.stack([w.sum(), (r * w).sum(), (r.square() * w).sum()]).cpu().numpy()

    def update(self, moments: np.ndarray) -> None:
        """One step of the running moments from a batch's (every worker's) summed :meth:`moments`; a batch
        without valid samples leaves them as they are."""
        count, total, total_sq = (float(v) for v in moments)
        if count <= 0:
            return
        batch = torch.tensor([total / count, total_sq / count, 1.0], dtype=torch.float64)
        self.state.mul_(self.beta).add_(batch, alpha=1.0 - self.beta)

    def mean_std(self) -> tuple[float, float]:
        """The debiased mean and standard deviation of the value targets."""
        running_mean, running_mean_sq, debiasing_term = self.state.tolist()
        debias = max(debiasing_term, self.debias_floor)
        mean = running_mean / debias
        var = max(running_mean_sq / debias - mean * mean, self.var_floor)
        return mean, math.sqrt(var)

    def normalize(self, values: torch.Tensor) -> torch.Tensor:
        """Values in the returns' units to the critic's: ``(v - mean) / std``."""
        mean, std = self.mean_std()
        return (values - mean) / std

    def denormalize(self, values: torch.Tensor) -> torch.Tensor:
        """The critic's outputs to the returns' units: ``z * std + mean``."""
        mean, std = self.mean_std()
        return values * std + mean

    def denormalize_numpy(self, values: np.ndarray) -> np.ndarray:
        """:meth:`denormalize` of a float32 array (a rollout's values), kept float32."""
        mean, std = self.mean_std()
        return (values * np.float32(std) + np.float32(mean)).astype(np.float32)

    def state_dict(self) -> dict[str, torch.Tensor]:
        return {key: self.state[i : i + 1].clone() for i, key in enumerate(VALUE_NORM_KEYS)}

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        self.state.copy_(torch.cat([tensors[key].double().reshape(1) for key in VALUE_NORM_KEYS]))
