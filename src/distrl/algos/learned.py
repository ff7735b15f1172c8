"""A module that learns on a flat buffer, with its Adam, and the step every offline update takes with it.

:class:`Learned` binds a ``torch.nn.Module``'s parameters to one :class:`~distrl.nets.core.ParamBuffer` (its
gradients accumulate into the buffer's gradient in place), and :meth:`Learned.step` is DESIGN's contract in one
place: the loss summed over this worker's samples goes backward, ``Sync.gradients`` sums the gradient and the
statistics over workers, and Adam steps on the mean over the global count. :class:`Target` is a slowly following
copy (Polyak averaging) of a learned module.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from distrl.algos.optim import ClippedAdam
from distrl.algos.protocols import Sync
from distrl.nets.core import ParamBuffer, bind_module


class Learned:
    """``module``'s parameters in one flat buffer, and Adam (torch's defaults: eps 1e-8, no clipping) on it."""

    def __init__(self, module: nn.Module, lr: float, device: torch.device, max_grad_norm: float | None = None):
        self.module = module
        self.params: ParamBuffer = bind_module(module, device)
        self.optimizer = ClippedAdam(self.params, lr, eps=1e-8, max_grad_norm=max_grad_norm)
        self._leaves = [p for p in module.parameters() if p.requires_grad]

    def step(self, loss: torch.Tensor, stats: torch.Tensor, sync: Sync, lr: float | None = None) -> list[float]:
        """Backward ``loss`` (summed over this worker's samples), sum the gradient and ``stats`` (float64, the
        sample count first) over workers and step on the mean; the summed statistics."""
        self.params.grad.zero_()
        # this module's gradient alone: a loss through another learned module (an actor's, through the critic) does
        # not pay for that module's weight gradients
        loss.backward(inputs=self._leaves)
        sync.gradients(self.params.grad, stats)
        sums = stats.tolist()
        if sums[0] > 0:
            self.optimizer.step(lr, samples=sums[0])
        return sums

    def state_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        tensors = {f"{prefix}/{k}": v for k, v in self.params.state_dict().items()}
        tensors.update({f"{prefix}_optim/{k}": v for k, v in self.optimizer.state_dict().items()})
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], prefix: str) -> None:
        self.params.load_state_dict(_part(tensors, prefix))
        self.optimizer.load_state_dict(_part(tensors, f"{prefix}_optim"))

    def broadcast_tensors(self) -> list[torch.Tensor]:
        """What must be equal on every worker: the weights and Adam's moments (its step count travels apart)."""
        return [self.params.data, self.optimizer.exp_avg, self.optimizer.exp_avg_sq]


class Target:
    """A copy of a learned module that follows it by Polyak averaging: ``theta' <- tau theta + (1 - tau) theta'``."""

    def __init__(self, learned: Learned, device: torch.device):
        self.module = copy.deepcopy(learned.module)
        self.params = bind_module(self.module, device, with_grad=False)
        self.source = learned.params
        self.params.data.copy_(self.source.data)

    def follow(self, tau: float) -> None:
        self.params.data.lerp_(self.source.data, tau)

    def state_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        return {f"{prefix}/{k}": v for k, v in self.params.state_dict().items()}

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], prefix: str) -> None:
        self.params.load_state_dict(_part(tensors, prefix))


def _part(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + "/")}
