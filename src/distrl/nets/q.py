"""DQN's Q networks: one Q-value per discrete action, on the two paths every distrl network has.

- :class:`QMLP`: closed-form MLPs on a flat buffer for flat vector observations (``nets/core.py``),
  acting on a numpy copy, as the SAC actor does.
- :class:`ModuleQ`: any ``torch.nn.Module`` mapping stored observations to Q-values (images,
  Dict observations, a user's network), run with ``functional_call`` on views of the flat buffer.

Both keep one contract (``QNetwork`` in ``algos/dqn.py``): the algorithm takes d(loss)/d(q) [B, n_actions]
from autograd over its own loss, and ``backward`` turns it into the parameter gradient.

Dueling heads (Wang et al. 2016, arXiv:1511.06581, eq. 9): ``Q(s, a) = V(s) + A(s, a) - mean_a' A(s, a')``.
Subtracting the mean makes V and A identifiable (any constant could move between them otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from distrl.config import ConfigError
from distrl.envs.masks import MaskReader, mask_logits
from distrl.nets.core import MLP, ParamBuffer, mlp_shapes, write_grad
from distrl.nets.encoders import MLPHead
from distrl.nets.sac_module import _autocast, _buffer


@dataclass
class QForward:
    """Q-values of a batch with what ``backward`` needs."""

    q: torch.Tensor  # [B, n_actions] float32; on the module path attached to ``params.param``'s graph
    inputs: tuple[list[torch.Tensor], ...] = field(default=())  # closed form: each stream's layer inputs


def dueling_q(value: torch.Tensor, advantage: torch.Tensor) -> torch.Tensor:
    """Q [B, n] from V [B, 1] and A [B, n]: ``V + A - mean(A)`` (Wang et al. 2016, eq. 9)."""
    return value + advantage - advantage.mean(1, keepdim=True)


def greedy(q: np.ndarray) -> np.ndarray:
    """The greedy action of each row of Q [B, n] as int64 [B]; ties go to the lowest index (np.argmax's rule)."""
    return q.argmax(1).astype(np.int64)


class QMLP:
    """Closed-form Q network: obs -> ``net_arch`` -> n_actions, or with ``dueling`` a value and an
    advantage stream of that shape (-> 1 and -> n_actions) in the same buffer."""

    def __init__(
        self,
        obs_dim: int,
        n_actions: int,
        net_arch: tuple[int, ...],
        activation: str,
        device: torch.device | str,
        seed: int,
        dueling: bool = False,
        matmul_dtype: torch.dtype | None = None,
    ):
        """``net_arch`` may be empty (a linear Q function); ``matmul_dtype``: see :class:`MLP` (acting,
        in numpy, stays float32). Weights are drawn as torch.nn.Linear draws them, from ``seed`` alone."""
        self.obs_dim, self.n_actions, self.dueling = obs_dim, n_actions, dueling
        self.device = torch.device(device)
        hidden = (obs_dim, *net_arch)
        streams = {"value": (*hidden, 1), "advantage": (*hidden, n_actions)} if dueling else {"q": (*hidden, n_actions)}
        shapes: dict[str, tuple[int, ...]] = {}
        for prefix, sizes in streams.items():
            shapes.update(mlp_shapes(prefix, sizes))
        self.params = ParamBuffer(shapes, self.device)
        self.prefixes = list(streams)
        self.nets = [MLP(self.params, p, sizes, activation, matmul_dtype) for p, sizes in streams.items()]
        with torch.no_grad():
            generator = torch.Generator().manual_seed(seed)
            for net in self.nets:
                net.init_uniform(generator)
        # Acting reads numpy views of a CPU buffer: the buffer itself on the CPU, else a copy
        # that refresh_acting_copy() updates after the weights change.
        self._acting = self.params if self.device.type == "cpu" else ParamBuffer(self.params.shapes, "cpu")
        self._numpy = [MLP(self._acting, p, sizes, activation).numpy_forward() for p, sizes in streams.items()]
        self.refresh_acting_copy()

    def refresh_acting_copy(self) -> None:
        if self._acting is not self.params:
            self._acting.data.copy_(self.params.data)

    def streams(self) -> list[tuple[str, MLP]]:
        """(parameter prefix, MLP) of each stream: q, or value then advantage."""
        return list(zip(self.prefixes, self.nets))

    def _flat(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.reshape(obs.shape[0], -1).to(self.device, torch.float32)

    def forward(self, obs: torch.Tensor) -> QForward:
        """Q-values [B, n_actions] of observations [B, *obs_shape], keeping each layer's input."""
        x = self._flat(obs)
        outputs, inputs = zip(*(net.forward_cached(x) for net in self.nets))
        q = dueling_q(*outputs) if self.dueling else outputs[0]
        return QForward(q, tuple(inputs))

    def backward(self, fwd: QForward, d_q: torch.Tensor) -> None:
        """Overwrite ``params.grad`` with d(loss)/d(params) from d(loss)/d(q) [B, n_actions].

        Dueling: Q is linear in (V, A), so dV = sum_a dQ_a and dA_a = dQ_a - mean_a' dQ_a'.
        """
        if self.dueling:
            grads = (d_q.sum(1, keepdim=True), d_q - d_q.mean(1, keepdim=True))
        else:
            grads = (d_q,)
        for net, inputs, grad in zip(self.nets, fwd.inputs, grads):
            net.backward(inputs, grad, accumulate=False)

    @torch.no_grad()
    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [B, n_actions] from the current weights, without autograd."""
        x = self._flat(obs)
        outputs = [net(x) for net in self.nets]
        return dueling_q(*outputs) if self.dueling else outputs[0]

    def q_numpy(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [B, n_actions] float32 of a numpy batch [B, *obs_shape], on the acting copy."""
        x = np.asarray(obs, np.float32).reshape(len(obs), -1)
        outputs = [net(x) for net in self._numpy]
        if not self.dueling:
            return outputs[0]
        value, advantage = outputs
        return value + advantage - advantage.mean(1, keepdims=True)

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions [B] int64 (indices 0..n_actions-1, ties to the lowest)."""
        return greedy(self.q_numpy(obs))

    def legal(self, obs: np.ndarray) -> None:
        """Flat vector observations carry no masks: every action is legal."""
        return None


class ModuleQ:
    """A Q network over any module mapping stored observations [B, ...] to Q-values [B, n_actions].

    The module is only structure: its parameters are copied into ``params`` and every call runs on
    views of that buffer, so a target network is a second instance over the same module.
    """

    def __init__(
        self,
        module: nn.Module,
        n_actions: int,
        device: torch.device | str,
        autocast: torch.dtype | None = None,
        masks: MaskReader | None = None,
    ):
        """``autocast=torch.bfloat16`` runs the module under bfloat16 autocast (Q-values come back float32;
        the parameters and their gradients stay float32). ``masks``: an illegal action's Q-value is
        ``MASKED_LOGIT``, so that neither acting nor a target's max or argmax picks it."""
        self.masks = masks
        self.device = torch.device(device)
        self.module = module.to(self.device)
        self.n_actions = n_actions
        self.autocast = autocast
        self.params = _buffer(module, self.device)

    def refresh_acting_copy(self) -> None:
        """Acting reads the buffer itself."""

    def _q(self, obs: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        with _autocast(self.device, self.autocast):
            q = functional_call(self.module, self.params.views(source), (obs.to(self.device),))
        if tuple(q.shape) != (obs.shape[0], self.n_actions):
            raise ConfigError(
                f"the Q module returned {tuple(q.shape)} for {obs.shape[0]} observations; it must return "
                f"[batch, n_actions] = [{obs.shape[0]}, {self.n_actions}] (one Q-value per action)"
            )
        return q.float() if self.masks is None else mask_logits(q.float(), self.masks(obs.to(self.device)))

    def forward(self, obs: torch.Tensor) -> QForward:
        """Q-values [B, n_actions] attached to the graph of ``params.param``."""
        return QForward(self._q(obs, self.params.param))

    def backward(self, fwd: QForward, d_q: torch.Tensor) -> None:
        """Overwrite ``params.grad`` with d(loss)/d(params) from d(loss)/d(q) [B, n_actions]."""
        (grad,) = torch.autograd.grad([fwd.q], [self.params.param], [d_q.detach()], allow_unused=True)
        write_grad(self.params, grad)

    @torch.no_grad()
    def values(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values [B, n_actions] from the current weights, without autograd."""
        return self._q(obs, self.params.data)

    def q_numpy(self, obs: np.ndarray) -> np.ndarray:
        """Q-values [B, n_actions] float32 of a stored-dtype numpy batch."""
        return self.values(torch.as_tensor(obs)).cpu().numpy()

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Greedy actions [B] int64 (indices 0..n_actions-1, ties to the lowest)."""
        return greedy(self.q_numpy(obs))

    def legal(self, obs: np.ndarray) -> np.ndarray | None:
        """The legal actions [B, n_actions] of a stored batch (None: every action is legal)."""
        return None if self.masks is None else self.masks.numpy(obs)


class QHeadModule(nn.Module):
    """encoder -> MLP -> Q [B, n_actions]; with ``dueling``, a value (-> 1) and an advantage
    (-> n_actions) MLP on the shared encoder's features, combined by :func:`dueling_q`."""

    def __init__(
        self, encoder: nn.Module, n_actions: int, net_arch: tuple[int, ...], activation: str, dueling: bool = False
    ):
        super().__init__()
        hidden = (int(encoder.features_dim), *net_arch)  # type: ignore[arg-type]
        self.encoder = encoder
        self.dueling = dueling
        if dueling:
            self.value = MLPHead((*hidden, 1), activation)
            self.advantage = MLPHead((*hidden, n_actions), activation)
        else:
            self.q = MLPHead((*hidden, n_actions), activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.from_features(self.encoder(obs))

    def from_features(self, features: torch.Tensor) -> torch.Tensor:
        """Q values [B, n_actions] from the encoder's features (an exported graph encodes a Dict's parts itself)."""
        if self.dueling:
            return dueling_q(self.value(features), self.advantage(features))
        return self.q(features)
