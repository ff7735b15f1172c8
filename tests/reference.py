"""Autograd references for the hand-written gradients (tests only)."""

from __future__ import annotations

import torch

from distrl.nets import ActorCritic


def functional_params(agent: ActorCritic) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """A leaf copy of the agent's flat buffer and named views into it that track gradients."""
    flat = agent.params.data.detach().clone().requires_grad_(True)
    views = {}
    for name, (start, end) in agent.params.offsets.items():
        views[name] = flat[start:end].view(agent.params.shapes[name])
    return flat, views


def mlp(views: dict[str, torch.Tensor], prefix: str, x: torch.Tensor, n_layers: int, activation: str) -> torch.Tensor:
    act = torch.tanh if activation == "tanh" else torch.relu
    for i in range(n_layers):
        x = x @ views[f"{prefix}.{i}.weight"] + views[f"{prefix}.{i}.bias"]
        if i < n_layers - 1:
            x = act(x)
    return x


def distribution(
    agent: ActorCritic, views: dict[str, torch.Tensor], obs: torch.Tensor
) -> torch.distributions.Distribution:
    n_layers = len(agent.policy.weights)
    head = mlp(views, "policy", obs, n_layers, agent.policy.activation)
    if agent.discrete:
        return torch.distributions.Categorical(logits=head)
    return torch.distributions.Independent(torch.distributions.Normal(head, views["policy.log_std"].exp()), 1)


def values(agent: ActorCritic, views: dict[str, torch.Tensor], obs: torch.Tensor) -> torch.Tensor:
    return mlp(views, "critic", obs, len(agent.critic.weights), agent.critic.activation).squeeze(-1)


def sac_algo(cfg, seed=0, obs_dim=3, action_dim=2):
    """SACAlgo on flat observations of ``obs_dim`` and actions of ``action_dim`` (closed-form networks)."""
    import numpy as np
    import torch
    from gymnasium import spaces

    from distrl.algos.sac import SACAlgo
    from distrl.nets.factory import make_sac_networks

    networks = make_sac_networks(
        spaces.Box(-1, 1, (obs_dim,), np.float32), spaces.Box(-1, 1, (action_dim,), np.float32), cfg, "cpu", seed
    )
    return SACAlgo(cfg, networks, torch.device("cpu"), seed)
