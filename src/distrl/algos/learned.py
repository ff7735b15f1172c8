"""What the offline algorithms' steps are built of: a module that learns on a flat buffer, with its Adam, and the
step every offline update takes with it; its Polyak copy; an algorithm's networks as checkpoints carry them; noise
drawn for a whole global batch; the statistics that travel with a gradient.

:class:`Learned` binds a ``torch.nn.Module``'s parameters to one :class:`~distrl.nets.core.ParamBuffer` (its
gradients accumulate into the buffer's gradient in place), and :meth:`Learned.step` is DESIGN's contract in one
place: the loss summed over this worker's samples goes backward, ``Sync.gradients`` sums the gradient and the
statistics over workers, and Adam steps on the mean over the global count. :class:`Target` is a slowly following
copy (Polyak averaging) of a learned module.
"""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import torch
from torch import nn

from distrl.algos.optim import ClippedAdam
from distrl.algos.protocols import Sync
from distrl.data.replay import Transitions
from distrl.nets.core import ParamBuffer, bind_module
from distrl.nets.offline import set_low_precision


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


def _count(batch: Transitions) -> torch.Tensor:
    return torch.tensor(float(batch.obs.shape[0]), dtype=torch.float64, device=batch.obs.device)


def batch_stats(batch: Transitions, *values: torch.Tensor) -> torch.Tensor:
    """The sample count, then ``values`` (sums over this worker's samples), as one float64 tensor for the sync."""
    return torch.stack([_count(batch), *(v.detach().double() for v in values)])


class BatchNoise:
    """Standard normal (or uniform) draws for a whole global batch from a generator every worker seeds alike; each
    worker keeps the rows of its samples (``batch.rows``, their positions in the global batch), so that the same
    noise meets the same sample wherever it is."""

    def __init__(self, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device=device)

    def reseed(self, seed: int, segment: int, salt: int) -> None:
        self.generator.manual_seed(int(np.random.SeedSequence([seed, segment, salt]).generate_state(1)[0]))

    def normal(self, batch: Transitions, batch_size: int, *shape: int) -> torch.Tensor:
        return self._mine(batch, torch.randn((batch_size, *shape), generator=self.generator, device=self.device))

    def uniform(self, batch: Transitions, batch_size: int, *shape: int) -> torch.Tensor:
        """Uniform in [-1, 1]."""
        drawn = torch.rand((batch_size, *shape), generator=self.generator, device=self.device)
        return self._mine(batch, drawn.mul_(2.0).sub_(1.0))

    def _mine(self, batch: Transitions, drawn: torch.Tensor) -> torch.Tensor:
        return drawn if batch.rows is None else drawn[torch.as_tensor(batch.rows, device=self.device)]


def seeded(seed: int, make: Any) -> Any:
    """``make()``, with torch's global generator (which ``nn.Linear`` initialises from) seeded and restored."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return make()


class Networks:
    """An algorithm's learned modules (``learned``), their targets and the steps it counts, as checkpoints and the
    start-up broadcast carry them."""

    learned: dict[str, Learned]
    gradient_steps: int

    def _counters(self) -> torch.Tensor:
        steps = [learned.optimizer.steps for learned in self.learned.values()]
        return torch.tensor([self.gradient_steps, *steps], dtype=torch.float64)

    def after_broadcast(self, counters: torch.Tensor) -> None:
        values = counters.tolist()
        self.gradient_steps = int(values[0])
        for learned, steps in zip(self.learned.values(), values[1:]):
            learned.optimizer.steps = int(steps)

    def broadcast_tensors(self) -> list[torch.Tensor]:
        tensors = [t for learned in self.learned.values() for t in learned.broadcast_tensors()]
        return [*tensors, *(t.params.data for t in self._targets().values()), self._counters()]

    def _targets(self) -> dict[str, Target]:
        return {}

    def set_precision(self, precision: str) -> None:
        """``'bf16'`` runs every network's products (the targets' too) under bfloat16 autocast; ``'fp32'`` none."""
        dtype = torch.bfloat16 if precision == "bf16" else None
        for module in [
            *(learned.module for learned in self.learned.values()),
            *(t.module for t in self._targets().values()),
        ]:
            set_low_precision(module, dtype)

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors: dict[str, torch.Tensor] = {}
        for name, learned in self.learned.items():
            tensors.update(learned.state_tensors(name))
        for name, target in self._targets().items():
            tensors.update(target.state_tensors(name))
        tensors["gradient_steps"] = torch.tensor([self.gradient_steps], dtype=torch.int64)
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        for name, learned in self.learned.items():
            learned.load_state_tensors(tensors, name)
        for name, target in self._targets().items():
            target.load_state_tensors(tensors, name)
        self.gradient_steps = int(tensors["gradient_steps"][0])

    def reseed(self, seed: int, segment: int) -> None:
        return None

    @property
    def policy(self) -> Learned:
        """The module that acts (the actor; a Q network for discrete CQL)."""
        return self.learned["actor"]


def _part(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + "/")}
