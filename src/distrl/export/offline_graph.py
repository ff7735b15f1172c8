"""An offline algorithm's acting policy (BC, TD3, TD3+BC, IQL, CQL) as an export graph: the dataset's observation
statistics, the policy module, and its mode's action or greedy choice, or with ``stochastic`` a draw of the policy
from a ``noise`` input (see :mod:`distrl.export.graph`)."""

from __future__ import annotations

import torch
from gymnasium import spaces
from torch import nn

from distrl.envs.spaces import action_spec
from distrl.export.graph import ActingGraph, ActionHead, action_port, noise_port, observation_ports, weighted_copy
from distrl.nets.core import ParamBuffer
from distrl.nets.offline import LOG_STD_MAX, LOG_STD_MIN, GaussianActor, SquashedGaussianActor, set_low_precision


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
    stochastic: bool = False,
) -> ActingGraph:
    """The graph of an offline algorithm's policy (BC, TD3, TD3+BC, IQL, CQL): its mode's action scaled to the
    bounds, or the most likely (greedy) choice. With ``stochastic`` (a policy that draws: the caller checks) it
    takes a ``noise`` input as distrl's acting does: IQL's mean + std x noise clipped to [-1, 1], CQL's tanh(mean +
    std x noise), behaviour cloning's inverse-CDF choice."""
    spec = action_spec(action_space)
    obs_ports = observation_ports(observation_space)
    made = weighted_copy(policy, params)
    set_low_precision(made, None)  # the graph is float32, whatever precision the run trained in
    kind = "categorical" if isinstance(action_space, spaces.Discrete) else "bounded"
    log_std = None
    if stochastic and isinstance(made, SquashedGaussianActor):
        made, kind = made.net, "squashed"  # its mean and log-std, which the head draws from
    elif stochastic and isinstance(made, GaussianActor):
        log_std = made.log_std.clamp(LOG_STD_MIN, LOG_STD_MAX)
    body = StandardisedBody(made, mean, std)
    inputs = obs_ports + ([noise_port(spec, sac=False)] if stochastic else [])
    head = ActionHead(spec, kind, log_std)
    return ActingGraph(inputs, [action_port(spec)], body, head, None, len(obs_ports), 0, stochastic)
