"""Any ``torch.nn.Module`` as an agent on distrl's flat parameter buffer.

The module keeps its structure; its parameters live in one :class:`ParamBuffer` and are bound
to views of it at call time (``torch.func.functional_call``). The algorithms state
d(loss)/d(log-prob, entropy, value) per sample exactly as they do for the closed-form
networks, and one autograd vector-Jacobian product turns that into the gradient of every
parameter, written into the buffer's gradient. Sync, Adam, start-up broadcast, checksums,
checkpoints and resume see only the flat buffers, so they need no change.

The module's contract: ``forward(obs) -> (head, value)``, with ``head`` [B, head_size] (logits,
or Gaussian means for a Box action; see :class:`~distrl.envs.spaces.ActionSpec`) and ``value`` [B]
or [B, 1]. Observations arrive as tensors in their space's dtype and shape with a batch axis
in front: uint8 images unscaled, Dict observations as packed rows (use
:class:`~distrl.envs.spaces.DictLayout` to read them, or build on the built-in encoders). A Box
action's log-std is a parameter of the agent, not of the module.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.func import functional_call

from distrl.config import ConfigError
from distrl.envs.masks import MaskReader, mask_logits
from distrl.envs.spaces import action_spec
from distrl.nets.agent import ActStep, State
from distrl.nets.core import ParamBuffer, write_grad
from distrl.nets.distributions import (
    CategoricalTerms,
    GaussianTerms,
    categorical_terms,
    gaussian_terms,
    multi_categorical_terms,
    sample_actions,
)

LOG_STD = "log_std"
EVAL_CHUNK = 256
"""Observations per forward pass when values or log-probs are computed without gradients. The Nature
CNN's float input and activations for 1,024 Atari frames took 250 MB at once; 256 take a quarter."""


@dataclass
class ModuleForward:
    """A training forward pass of the module path: outputs still attached to the autograd graph."""

    head: torch.Tensor
    values: torch.Tensor
    log_std: torch.Tensor | None


class ModuleAgent:
    """An actor-critic over a user's or a built-in module, with the interface of ``ActorCritic``."""

    recurrent = False
    records_while_acting = True
    """Collectors keep the value and log-prob that :meth:`act_step` gives (see ``RolloutCollector``)."""

    def __init__(
        self,
        module: nn.Module,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        log_std_init: float = 0.0,
        device: torch.device | str = "cpu",
        autocast: torch.dtype | None = None,
        masked: bool = False,
    ):
        """``autocast``: run the module under autocast to this dtype (bfloat16); its outputs, the losses and
        every parameter and gradient stay float32. ``masked``: the observation's ``action_mask`` part masks
        the head's logits (see :mod:`distrl.envs.masks`), in acting and in training alike."""
        self.spec = action_spec(action_space)
        self.discrete = self.spec.discrete
        self.action_dim = self.spec.action_dim
        self.observation_space = observation_space
        self.device = torch.device(device)
        self.module = module.to(self.device)
        named = dict(module.named_parameters())
        if LOG_STD in named and not self.discrete:
            raise ConfigError(
                f"the policy module has a parameter named {LOG_STD!r}, which distrl adds for Box actions: rename it"
            )
        shapes = {name: tuple(p.shape) for name, p in named.items()}
        if not self.discrete:
            shapes[LOG_STD] = (self.action_dim,)
        self.params = ParamBuffer(shapes, self.device)
        with torch.no_grad():
            for name, p in named.items():
                self.params.view(name).copy_(p)
            if not self.discrete:
                self.params.view(LOG_STD).fill_(log_std_init)
        self.names = list(named)
        self.autocast = autocast
        self._checked = False
        self.masks = MaskReader(observation_space, action_space) if masked else None

    def _views(self, tensor: torch.Tensor) -> dict[str, torch.Tensor]:
        """The module's parameters as views of ``tensor`` (the buffer's data, or the parameter itself
        when the forward pass must reach it through autograd)."""
        return self.params.views(tensor)

    def _call(self, views: dict[str, torch.Tensor], obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            head, values = functional_call(self.module, {n: views[n] for n in self.names}, (obs,))
        head, values = head.float(), values.reshape(-1).float()
        if self.masks is not None:
            head = mask_logits(head, self.masks(obs))
        if not self._checked:
            expected = (obs.shape[0], self.spec.head_size)
            if tuple(head.shape) != expected or values.shape[0] != obs.shape[0]:
                raise ConfigError(
                    f"the policy module returned head {tuple(head.shape)} and value {tuple(values.shape)}; "
                    f"this action space needs head {expected} and value ({obs.shape[0]},)"
                )
            self._checked = True
        return head, values

    def _obs(self, obs: np.ndarray | torch.Tensor) -> torch.Tensor:
        return torch.as_tensor(obs).to(self.device, non_blocking=True)

    def refresh_acting_copy(self) -> None:
        """Acting reads the parameter buffer itself: nothing to refresh."""

    def act_step(
        self, obs: np.ndarray, noise: np.ndarray | None, state: State | None = None, starts: np.ndarray | None = None
    ) -> ActStep:
        return ActStep(*self.act_recording(obs, noise), None)

    @torch.no_grad()
    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """Actions for a batch of observations; see ``ActorCritic.act`` for the noise."""
        return self.act_recording(obs, noise)[0]

    @torch.no_grad()
    def act_recording(self, obs: np.ndarray, noise: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Actions, their log-probabilities and the values of ``obs``, from one forward pass."""
        views = self._views(self.params.data)
        head, values = self._call(views, self._obs(obs))
        std = None if self.discrete else views[LOG_STD].exp().cpu().numpy()
        actions = sample_actions(self.spec.kind, head.cpu().numpy(), std, noise, self.spec.nvec)
        terms = self.dist_terms(
            ModuleForward(head, values, views.get(LOG_STD)), torch.from_numpy(actions).to(self.device)
        )
        return actions, terms.log_prob.cpu().numpy(), values.cpu().numpy()

    def env_action(self, action: np.ndarray) -> np.ndarray:
        return self.spec.env_action(action)

    def noise_shape(self) -> tuple[int, ...]:
        return self.spec.noise_shape

    @torch.no_grad()
    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """Values of a whole rollout, in chunks of :data:`EVAL_CHUNK` observations."""
        views = self._views(self.params.data)
        return torch.cat([self._call(views, self._obs(chunk))[1] for chunk in obs.split(EVAL_CHUNK)])

    @torch.no_grad()
    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        views = self._views(self.params.data)
        out = []
        for chunk, chunk_actions in zip(obs.split(EVAL_CHUNK), actions.split(EVAL_CHUNK)):
            head, _ = self._call(views, self._obs(chunk))
            out.append(self.dist_terms(ModuleForward(head, head, views.get(LOG_STD)), chunk_actions).log_prob)
        return torch.cat(out)

    def forward_train(self, obs: torch.Tensor) -> ModuleForward:
        views = self._views(self.params.param)
        head, values = self._call(views, self._obs(obs))
        return ModuleForward(head, values, views.get(LOG_STD))

    def dist_terms(self, fwd: ModuleForward, actions: torch.Tensor) -> CategoricalTerms | GaussianTerms:
        kind = self.spec.kind
        if kind == "categorical":
            return categorical_terms(fwd.head, actions)
        if kind == "multi_categorical":
            return multi_categorical_terms(fwd.head, actions, self.spec.nvec)
        assert fwd.log_std is not None
        return gaussian_terms(fwd.head, fwd.log_std, actions)

    def backward(
        self,
        fwd: ModuleForward,
        terms: CategoricalTerms | GaussianTerms,
        actions: torch.Tensor,
        d_log_prob: torch.Tensor,
        d_entropy: torch.Tensor | None,
        d_values: torch.Tensor | None,
    ) -> None:
        """Write the parameter gradients given d(loss)/d(log_prob, entropy, value) per sample (None: the loss
        does not use that output): one vector-Jacobian product through the module, overwriting the buffer's
        gradient."""
        outputs, grads = [terms.log_prob], [d_log_prob.detach()]
        if d_values is not None:
            outputs.append(fwd.values)
            grads.append(d_values.detach())
        if d_entropy is not None:
            outputs.append(terms.entropy)
            grads.append(d_entropy.detach())
        (grad,) = torch.autograd.grad(outputs, [self.params.param], grads, allow_unused=True)
        write_grad(self.params, grad)
