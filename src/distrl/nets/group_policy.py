"""The policies of group-relative training, and what GRPO asks of them.

A group policy answers prompts with completions and tells the learner how likely each completion
token is. Two exist: :class:`CategoricalPolicy` (a state in, one token out: the numeric group tasks)
and :class:`~distrl.nets.causal_lm.CausalLMPolicy` (a ``transformers`` causal language model). Both
keep their parameters in one :class:`~distrl.nets.core.ParamBuffer` (:func:`~distrl.nets.core.bind_module`),
so Adam, the gradient sum over workers, weight transfer and checkpoints are the ones every
algorithm uses.
"""

from __future__ import annotations

import math
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from distrl.nets.core import ParamBuffer, bind_module
from distrl.nets.distributions import sample_tokens


class GroupPolicy(Protocol):
    params: ParamBuffer
    device: torch.device
    max_new_tokens: int
    """The longest completion: the number of uniforms a completion's draw takes."""

    def encode(self, prompts: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The policy's input for a list of prompts: token ids ``[B, P]`` left-padded with their mask, or states."""
        ...

    def sample(
        self, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, group_size: int, uniforms: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``group_size`` completions per prompt, rows grouped by prompt: tokens ``[B * G, T]``, their mask
        (generated tokens, the ending EOS included) and behaviour log-probabilities. ``uniforms [B * G, T_max]``
        draw every token; None answers greedily."""
        ...

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[str, ...]:
        """The completions as text (empty for numeric tasks)."""
        ...

    def token_log_probs(
        self, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, tokens: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        """``[n, T]`` log-probabilities of the completion tokens (``attention``: the real ones, the environment's
        answers between model turns included), attached to the autograd graph when
        gradients are enabled (its backward pass accumulates into ``params.grad``)."""
        ...


class CategoricalPolicy:
    """A categorical policy over ``n_actions`` for a flat state: an MLP to logits, answering with one token."""

    max_new_tokens = 1

    def __init__(
        self, obs_dim: int, n_actions: int, hidden: tuple[int, ...], seed: int, device: torch.device | str = "cpu"
    ):
        generator = torch.Generator().manual_seed(seed)
        layers: list[nn.Module] = []
        sizes = (obs_dim, *hidden)
        for fan_in, fan_out in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(fan_in, fan_out), nn.Tanh()]
        layers.append(nn.Linear(sizes[-1], n_actions))
        self.module = nn.Sequential(*layers)
        with torch.no_grad():  # torch.nn.Linear's initialisation, drawn from this policy's own generator
            for layer in self.module:
                if isinstance(layer, nn.Linear):
                    bound = 1.0 / math.sqrt(layer.in_features)
                    layer.weight.uniform_(-bound, bound, generator=generator)
                    layer.bias.uniform_(-bound, bound, generator=generator)
        self.device = torch.device(device)
        self.params = bind_module(self.module, self.device)

    def encode(self, prompts: np.ndarray) -> tuple[torch.Tensor, None]:
        return torch.as_tensor(prompts, dtype=torch.float32, device=self.device), None

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        return self.module(states)

    @torch.no_grad()
    def sample(
        self, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, group_size: int, uniforms: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.module(prompt).repeat_interleave(group_size, 0)
        tokens, log_probs = sample_tokens(logits, None if uniforms is None else uniforms[:, 0])
        mask = torch.ones(len(tokens), 1, dtype=torch.bool, device=self.device)
        return tokens.unsqueeze(1), mask, log_probs.unsqueeze(1)

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[str, ...]:
        return ()

    def token_log_probs(
        self, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, tokens: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        return torch.log_softmax(self.module(prompt), -1).gather(1, tokens[:, :1])
