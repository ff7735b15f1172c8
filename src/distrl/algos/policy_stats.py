"""The statistics PPO's update sums over valid samples and workers, for the whole batch and for each policy of a
multi-agent run, and the metrics it reports from them.

A multi-agent env reaches the algorithm as rows of one vector env: env row ``n = copy * A + agent`` (``A``
agents), and a rollout batch's flat row ``r = t * N + n`` (``N`` a multiple of ``A``), so the agent of flat row
``r`` is ``r % A``. The statistics of every minibatch are a ``[1 + P, S]`` matrix, flattened to travel with the
gradient: row 0 sums :data:`STATS` over all valid samples, row ``1 + p`` over those of policy ``p``'s agents.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from distrl.nets.multiagent import AgentSetup

STATS = ("count", "approx_kl", "clip_fraction", "policy_loss", "value_loss", "entropy")
"""Per-sample statistics summed over valid samples and workers with every minibatch gradient."""
COUNT, APPROX_KL = STATS.index("count"), STATS.index("approx_kl")

UPDATE_METRICS = (
    "losses/policy_loss",
    "losses/value_loss",
    "losses/entropy",
    "losses/approx_kl",
    "losses/clip_fraction",
    "losses/grad_norm",
    "losses/explained_variance",
    "losses/gradient_steps",
    "losses/trained_samples",
    "losses/stopped_early",
    "charts/learning_rate",
    "charts/clip_range",
)
"""What ``update`` returns, in this order (decoupled's trainers send them to the player as one tensor); a
multi-agent run with several policies adds each one's ``losses/<policy>/...`` (:data:`POLICY_METRICS`)."""

POLICY_METRICS = ("policy_loss", "value_loss", "entropy", "approx_kl", "clip_fraction")
"""What ``update`` reports for each policy as ``losses/<policy>/<name>``: means over the update's valid samples
(``approx_kl`` too), with ``losses/<policy>/trained_samples``, their count."""


@dataclass(frozen=True)
class AgentPolicies:
    """Which policy each agent of a multi-agent run acts with (``nets.multiagent.AgentSetup``'s groups)."""

    names: tuple[str, ...]
    """The policies, in the order of the statistics' rows."""
    of_agent: tuple[int, ...]
    """The index in ``names`` of each agent's policy, in the env's agent order."""

    @classmethod
    def of_setup(cls, setup: AgentSetup) -> AgentPolicies:
        """The policies of ``setup``'s groups, in their order."""
        group_of = {agent: g for g, (_, agents) in enumerate(setup.groups) for agent in agents}
        return cls(tuple(name for name, _ in setup.groups), tuple(group_of[agent] for agent in setup.names))

    def of_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """[B] the policy of each flat batch row (``rows``: indices ``t * N + n`` into the rollout batch)."""
        of_agent = torch.tensor(self.of_agent, dtype=torch.int64, device=rows.device)
        return of_agent[rows % len(self.of_agent)]

    def sums(self, per_sample: torch.Tensor, valid: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """[P, S] each policy's sums of ``per_sample`` [S, B] over its valid samples."""
        membership = torch.nn.functional.one_hot(self.of_rows(rows), len(self.names)).to(per_sample.dtype)  # [B, P]
        return membership.T @ (per_sample * valid).T

    def metrics(self, totals: list[float]) -> dict[str, float]:
        """``losses/<policy>/<name>`` from the update's summed statistics of every policy (P rows of S, flat)."""
        out: dict[str, float] = {}
        width = len(STATS)
        for p, name in enumerate(self.names):
            row = totals[p * width : (p + 1) * width]
            count = row[COUNT]
            out.update({f"losses/{name}/{stat}": row[STATS.index(stat)] / max(count, 1.0) for stat in POLICY_METRICS})
            out[f"losses/{name}/trained_samples"] = count
        return out


class UpdateReport:
    """What one update has summed so far, for its :data:`UPDATE_METRICS`: the statistics of the minibatches that
    stepped (all samples' first, then each policy's), their gradient norms, the last approximate KL."""

    def __init__(self, policies: AgentPolicies | None):
        self.policies = policies
        groups = 1 + (len(policies.names) if policies is not None else 0)
        self.totals = [0.0] * (groups * len(STATS))
        """Summed in float64 as Python floats: a tensor's += costs more than the arithmetic at this size."""
        self.grad_norms: list[float] = []
        self.approx_kl = 0.0
        """The last minibatch's mean approximate KL (what early stopping compares with ``target_kl``)."""
        self.stopped_early = False

    def add(self, summed: list[float], grad_norm: float) -> None:
        """A minibatch that stepped: its summed statistics (every group's, flat) and its gradient's norm."""
        self.totals = [total + part for total, part in zip(self.totals, summed)]
        self.grad_norms.append(grad_norm)

    def metrics(self, explained_variance: float, lr: float, clip_range: float) -> dict[str, float]:
        """:data:`UPDATE_METRICS` (means over the update's valid samples), then each policy's."""
        samples = self.totals[COUNT]
        means = {name: self.totals[i] / max(samples, 1.0) for i, name in enumerate(STATS)}
        values = (
            means["policy_loss"],
            means["value_loss"],
            means["entropy"],
            self.approx_kl,
            means["clip_fraction"],
            float(np.mean(self.grad_norms)) if self.grad_norms else 0.0,
            explained_variance,
            float(len(self.grad_norms)),
            samples,
            float(self.stopped_early),
            lr,
            clip_range,
        )
        metrics = dict(zip(UPDATE_METRICS, values))
        if self.policies is not None:
            metrics.update(self.policies.metrics(self.totals[len(STATS) :]))
        return metrics
