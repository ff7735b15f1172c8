"""A user's networks for multi-agent runs (importable as ``--policy distrl_manets:name``): they read the packed Dict
rows every multi-agent row arrives as."""

from __future__ import annotations

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from distrl.envs.spaces import DictLayout


class RowFeatures(nn.Module):
    """One hidden layer over every part of a packed Dict row, side by side. ``seen`` keeps the observation space it
    was built for."""

    def __init__(self, observation_space: spaces.Dict, width: int = 16):
        super().__init__()
        self.seen = observation_space
        self.layout = DictLayout(observation_space)
        inputs = sum(int(np.prod(part.shape)) for part in self.layout.parts)
        self.body = nn.Sequential(nn.Linear(inputs, width), nn.Tanh())

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        parts = self.layout.unpack(obs)
        return self.body(torch.cat([parts[p.key].float().reshape(len(obs), -1) for p in self.layout.parts], -1))


class CueEncoder(RowFeatures):
    """An encoder (it has ``features_dim``): distrl puts its heads, and a core if asked, on it."""

    def __init__(self, observation_space: spaces.Dict, action_space: spaces.Space, config: object):
        super().__init__(observation_space)
        self.features_dim = 16


class CueNet(nn.Module):
    """A whole network: ``forward(obs) -> (head, value)``."""

    def __init__(self, observation_space: spaces.Dict, action_space: spaces.Discrete, config: object):
        super().__init__()
        self.features = RowFeatures(observation_space)
        self.head = nn.Linear(16, int(action_space.n))
        self.value = nn.Linear(16, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.features(obs)
        return self.head(x), self.value(x)
