"""The offline algorithms, one module each with its plain losses and its step: :mod:`~distrl.algos.bc` (behaviour
cloning), :mod:`~distrl.algos.td3` (TD3+BC, and TD3 online), :mod:`~distrl.algos.iql`, :mod:`~distrl.algos.cql`.
This module holds what the offline loop asks of each (:class:`OfflineUpdate`) and makes the one a run names.

What the four have in common. Every loss is summed over the samples of a batch, as every loss in
``distrl.algos``: ``Sync.gradients`` sums the gradients and sample counts over workers and the sum is divided by
the global count, which gives the references' batch means; workers that each hold a part of a batch take the step
one process would take on the whole of it (:class:`~distrl.data.offline.GlobalSampler` hands each its part). Where
a reference takes a statistic of the whole batch (TD3+BC's Q scale, CQL's mean penalty for its Lagrangian weight)
the loss takes what makes the sum over workers exact. Targets and weights that a method treats as constants are
detached in its loss; the targets built from target networks are the caller's to compute under
``torch.no_grad``, as in :mod:`distrl.algos.sac`.

The networks are :mod:`distrl.nets.offline`'s modules, each on a flat buffer (:class:`~distrl.algos.learned.Learned`).
Actions are in [-1, 1] (Box) or indices (Discrete). Anything drawn at random within a step (TD3's target
smoothing noise, CQL's sampled actions) is drawn for the whole batch from a generator every worker seeds alike,
and each takes the rows of its samples (``batch.rows``: their positions in the global batch): the same noise
meets the same sample wherever it is.
"""

from __future__ import annotations

from typing import Protocol

import torch

from distrl.algos.bc import BCAlgo
from distrl.algos.cql import CQLAlgo, DiscreteCQLAlgo
from distrl.algos.iql import IQLAlgo
from distrl.algos.learned import Learned
from distrl.algos.protocols import Sync
from distrl.algos.td3 import TD3BCAlgo
from distrl.config import BCConfig, CQLConfig, IQLConfig, OfflineConfig, TD3BCConfig
from distrl.data.replay import Transitions


class OfflineUpdate(Protocol):
    """What the offline loop asks of an algorithm."""

    def update(self, batch: Transitions, sync: Sync, batch_size: int) -> dict[str, float]:
        """One gradient step on this worker's part of a global batch of ``batch_size`` transitions."""
        ...

    def act(self, obs: torch.Tensor) -> torch.Tensor:
        """The policy's deterministic actions ([-1, 1], or indices) for observations [B, obs_dim]."""
        ...

    sampling: str | None
    """The noise a draw of the policy takes: ``"normal"``, standard normals [B, A] (IQL's Gaussian, CQL's squashed
    Gaussian); ``"uniform"``, uniforms [B] (behaviour cloning's categorical, Discrete actions); None where the
    policy is deterministic (a tanh action, a greedy choice) and acts with :meth:`act` alone."""

    def sample(self, obs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """A draw of the policy for ``noise`` (see :attr:`sampling`): actions in [-1, 1], or indices."""
        ...

    @property
    def policy(self) -> Learned:
        """The module that acts: its mode's action in [-1, 1] (Box), or values to take the argmax of (Discrete)."""
        ...

    def after_broadcast(self, counters: torch.Tensor) -> None: ...

    def reseed(self, seed: int, segment: int) -> None: ...

    def state_tensors(self) -> dict[str, torch.Tensor]: ...

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None: ...

    def broadcast_tensors(self) -> list[torch.Tensor]: ...


def make_offline_algo(
    algo: str,
    cfg: OfflineConfig,
    obs_dim: int,
    actions: int,
    discrete: bool,
    device: torch.device,
    seed: int,
    precision: str = "fp32",
) -> BCAlgo | TD3BCAlgo | IQLAlgo | CQLAlgo | DiscreteCQLAlgo:
    """The update of ``algo`` for observations of ``obs_dim`` and ``actions`` action dimensions (or choices), its
    networks' products in ``precision`` (fp32, or bf16 under autocast)."""
    made = _make(algo, cfg, obs_dim, actions, discrete, device, seed)
    made.set_precision(precision)
    return made


def _make(
    algo: str, cfg: OfflineConfig, obs_dim: int, actions: int, discrete: bool, device: torch.device, seed: int
) -> BCAlgo | TD3BCAlgo | IQLAlgo | CQLAlgo | DiscreteCQLAlgo:
    if algo == "bc":
        assert isinstance(cfg, BCConfig)
        return BCAlgo(cfg, obs_dim, actions, discrete, device, seed)
    if algo in ("td3bc", "td3"):
        assert isinstance(cfg, TD3BCConfig)
        return TD3BCAlgo(cfg, obs_dim, actions, device, seed, bc=algo == "td3bc")
    if algo == "iql":
        assert isinstance(cfg, IQLConfig)
        return IQLAlgo(cfg, obs_dim, actions, device, seed)
    assert algo == "cql" and isinstance(cfg, CQLConfig)
    if discrete:
        return DiscreteCQLAlgo(cfg, obs_dim, actions, device, seed)
    return CQLAlgo(cfg, obs_dim, actions, device, seed)
