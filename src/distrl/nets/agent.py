"""The agent contract: what algorithms, collectors and strategies may ask of an actor-critic.

Three implementations keep it: the closed-form :class:`~distrl.nets.actor_critic.ActorCritic` (flat
vectors, fast), :class:`~distrl.nets.module.ModuleAgent` (any ``nn.Module``) and
:class:`~distrl.nets.recurrent.RecurrentAgent` (a module with a state). ``nets.make_agent`` chooses;
nothing else needs to know which one it holds.
"""

from __future__ import annotations

from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from distrl.envs.spaces import ActionSpec
from distrl.nets.core import ParamBuffer
from distrl.nets.distributions import CategoricalTerms, GaussianTerms

State = tuple[torch.Tensor, ...]
"""A recurrent core's state: tensors [layers, B, hidden] (one for a GRU, hidden and cell for an LSTM)."""


class ActStep(NamedTuple):
    """One acting step for a batch of B environments."""

    actions: np.ndarray
    """[B, *action_shape], before ``env_action``."""
    log_probs: np.ndarray | None
    """[B] behaviour log-probs, where the forward pass gave them (module agents); None otherwise."""
    values: np.ndarray | None
    """[B] the critic's values of the observations, likewise."""
    state: State | None
    """The next state of a recurrent agent; None for a feed-forward one."""


class Agent(Protocol):
    """An actor-critic whose parameters live in one flat buffer."""

    params: ParamBuffer
    device: torch.device
    spec: ActionSpec
    discrete: bool
    recurrent: bool
    """Whether the agent carries a state: it acts through :meth:`act_step` with one, and trains on whole
    sequences (``forward_sequences``/``forward_episodes`` of :class:`~distrl.nets.recurrent.RecurrentAgent`)."""
    records_while_acting: bool
    """Whether :meth:`act_step` gives log-probs and values with the actions (else the rollout's are computed
    afterwards, in one batched pass)."""

    def act_step(
        self, obs: np.ndarray, noise: np.ndarray | None, state: State | None = None, starts: np.ndarray | None = None
    ) -> ActStep:
        """Act on a batch of observations with the caller's noise (None: deterministically). A recurrent agent
        takes its state and ``starts`` [B] (observations that begin an episode restart the state first)."""
        ...

    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """Actions of a feed-forward agent (:meth:`act_step` without the extras)."""
        ...

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """The action the environment takes (Gaussian samples clipped to the bounds)."""
        ...

    def noise_shape(self) -> tuple[int, ...]:
        """Shape of one environment's sampling noise per step."""
        ...

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """Critic values of a batch of observations, without gradients."""
        ...

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of ``actions``, without gradients."""
        ...

    def forward_train(self, obs: torch.Tensor) -> Any:
        """A training forward pass (head outputs and values, with what :meth:`backward` needs)."""
        ...

    def dist_terms(self, fwd: Any, actions: torch.Tensor) -> CategoricalTerms | GaussianTerms:
        """Log-probs and entropies of ``actions`` under a training forward pass."""
        ...

    def backward(
        self,
        fwd: Any,
        terms: CategoricalTerms | GaussianTerms,
        actions: torch.Tensor,
        d_log_prob: torch.Tensor,
        d_entropy: torch.Tensor | None,
        d_values: torch.Tensor | None,
    ) -> None:
        """Write the parameter gradients, given d(loss)/d(log_prob, entropy, value) per sample (None where the
        loss does not use that output: its part of the buffer's gradient is zero)."""
        ...

    def refresh_acting_copy(self) -> None:
        """Make acting see the weights an update just wrote."""
        ...
