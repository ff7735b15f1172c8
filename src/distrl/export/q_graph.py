"""A DQN policy as an export graph: the Q network (closed-form streams, or a Q module with its Dict encoder and its
action masks) and the greedy action, ties to the lowest index (see :mod:`distrl.export.graph`)."""

from __future__ import annotations

import torch
from gymnasium import spaces
from torch import nn

from distrl.export.graph import (
    BATCH,
    ActingGraph,
    FlatBody,
    Port,
    dict_keys,
    masked,
    mlp_copy,
    observation_ports,
    weighted_copy,
)
from distrl.nets.q import QMLP, ModuleQ, QHeadModule, dueling_q


class QStreams(nn.Module):
    """The closed-form Q network's streams as ``nn.Linear`` layers: Q, or V + A - mean(A) with dueling heads."""

    def __init__(self, q: QMLP):
        super().__init__()
        self.nets = nn.ModuleList(mlp_copy(q.params, prefix, net.sizes, net.activation) for prefix, net in q.streams())
        self.dueling = q.dueling

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.dueling:
            return dueling_q(self.nets[0](x), self.nets[1](x))
        return self.nets[0](x)


class QModuleBody(nn.Module):
    """A Q module's values; a Dict observation goes to distrl's Dict encoder as its parts."""

    def __init__(self, module: nn.Module, keys: list[str] | None):
        super().__init__()
        self.module, self.keys = module, keys

    def forward(self, obs: list[torch.Tensor]) -> torch.Tensor:
        if self.keys is not None:
            return self.module.from_features(self.module.encoder.encode(dict(zip(self.keys, obs))))
        return self.module(obs[0])


class GreedyHead(nn.Module):
    """Q values to the env action: the argmax (ties to the lowest index), offset by the space's start."""

    kind = "greedy"

    def __init__(self, start: int):
        super().__init__()
        self.start = start

    def forward(self, q: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        return q.argmax(-1) + self.start


def q_graph(q: QMLP | ModuleQ, observation_space: spaces.Space, action_space: spaces.Discrete) -> ActingGraph:
    """The graph of a DQN policy: the Q network's greedy action."""
    obs_ports = observation_ports(observation_space)
    body: nn.Module
    if isinstance(q, QMLP):
        body = FlatBody(QStreams(q))
    else:
        module = weighted_copy(q.module, q.params)
        body = masked(
            QModuleBody(module, dict_keys(observation_space, module, QHeadModule)), observation_space, q.masks
        )
    outputs = [Port("action", (BATCH,), "int64")]
    return ActingGraph(obs_ports, outputs, body, GreedyHead(int(action_space.start)), None, len(obs_ports), 0, False)
