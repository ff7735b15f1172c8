"""The statistics PPO's update sums over valid samples and workers, for the whole batch and for each policy of a
multi-agent run.

A multi-agent env reaches the algorithm as rows of one vector env: env row ``n = copy * A + agent`` (``A``
agents), and a rollout batch's flat row ``r = t * N + n`` (``N`` a multiple of ``A``), so the agent of flat row
``r`` is ``r % A``. The statistics of every minibatch are a ``[1 + P, S]`` matrix, flattened to travel with the
gradient: row 0 sums :data:`STATS` over all valid samples, row ``1 + p`` over those of policy ``p``'s agents.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from distrl.nets.multiagent import AgentSetup

STATS = ("count", "approx_kl", "clip_fraction", "policy_loss", "value_loss", "entropy")
"""Per-sample statistics summed over valid samples and workers with every minibatch gradient."""

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
            count = row[STATS.index("count")]
            out.update({f"losses/{name}/{stat}": row[STATS.index(stat)] / max(count, 1.0) for stat in POLICY_METRICS})
            out[f"losses/{name}/trained_samples"] = count
        return out
