"""An offline algorithm's acting policy (BC, TD3, TD3+BC, IQL, CQL) as an export graph: the dataset's observation
statistics, the policy module, and its mode's action or greedy choice (see :mod:`distrl.export.graph`)."""

from __future__ import annotations

import torch
from gymnasium import spaces
from torch import nn

from distrl.envs.spaces import action_spec
from distrl.export.graph import ActingGraph, ActionHead, action_port, observation_ports, weighted_copy
from distrl.nets.core import ParamBuffer
from distrl.nets.offline import set_low_precision


class StandardisedBody(nn.Module):
    """An offline algorithm's policy module on the flat observation, standardised by the dataset's statistics where
    the run standardised it: its mode's action in [-1, 1], or logits (Q-values) to take the argmax of."""

    def __init__(self, policy: nn.Module, mean: torch.Tensor | None, std: torch.Tensor | None):
        super().__init__()
        self.policy = policy
        self.standardise = mean is not None
        if mean is not None and std is not None:
            self.register_buffer("mean", mean.detach().cpu().float())
            self.register_buffer("std", std.detach().cpu().float())

    def forward(self, obs: list[torch.Tensor]) -> torch.Tensor:
        x = obs[0]
        x = x.reshape(x.shape[0], -1).float()
        if self.standardise:
            x = (x - self.mean) / self.std
        return self.policy(x)


def offline_graph(
    policy: nn.Module,
    params: ParamBuffer,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    mean: torch.Tensor | None,
    std: torch.Tensor | None,
) -> ActingGraph:
    """The graph of an offline algorithm's policy (BC, TD3, TD3+BC, IQL, CQL): its mode's action scaled to the
    bounds, or the most likely (greedy) choice."""
    spec = action_spec(action_space)
    obs_ports = observation_ports(observation_space)
    made = weighted_copy(policy, params)
    set_low_precision(made, None)  # the graph is float32, whatever precision the run trained in
    body = StandardisedBody(made, mean, std)
    head = ActionHead(spec, "categorical" if isinstance(action_space, spaces.Discrete) else "bounded")
    return ActingGraph(obs_ports, [action_port(spec)], body, head, None, len(obs_ports), 0, False)
