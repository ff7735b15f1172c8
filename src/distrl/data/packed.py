"""PPO's training batch as two tensors, and its minibatches: what the update gathers from and what decoupled's
player sends its trainers."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
import torch

from distrl.data.rollout import RolloutBatch, Sequences
from distrl.nets.recurrent import sequence_minibatch_rows


class Minibatch(NamedTuple):
    """A minibatch's rows of a :class:`PackedBatch`, each [B, ...]."""

    obs: torch.Tensor
    actions: torch.Tensor
    old_log_prob: torch.Tensor
    old_values: torch.Tensor
    advantages: torch.Tensor
    returns: torch.Tensor
    valid: torch.Tensor
    rows: torch.Tensor
    """[B] int64: each sample's row in the batch (``t * N + n``: a multi-agent env's agent is ``n % agents``)."""


class PackedBatch:
    """A batch as two tensors: observations [B, *obs_shape] in their stored dtype (uint8 images stay
    uint8), and one float row per sample of actions | log_prob, value, advantage, return, valid.

    A minibatch is one gather from each, and a batch travels between processes as the two tensors.
    """

    def __init__(
        self,
        obs: torch.Tensor,
        data: torch.Tensor,
        action_shape: tuple[int, ...],
        discrete: bool,
        sequences: Sequences | None = None,
    ):
        self.obs, self.data = obs, data
        self.sequences = sequences
        """Recurrent policies: the rows are whole environment sequences (row t * N + n); see ``Sequences``."""
        self.action_shape, self.discrete = tuple(action_shape), discrete
        self.action_columns = math.prod(self.action_shape)
        self.device = data.device
        self._all: Minibatch | None = None

    @staticmethod
    def columns(action_shape: tuple[int, ...]) -> int:
        """Float columns per sample: the action's, then log_prob, value, advantage, return, valid."""
        return math.prod(action_shape) + 5

    @classmethod
    def pack(cls, batch: RolloutBatch, advantages: torch.Tensor) -> PackedBatch:
        actions = batch.actions.float().reshape(batch.size, -1)
        columns = [batch.log_probs, batch.values, advantages, batch.returns, batch.valid]
        data = torch.cat([actions, torch.stack(columns, 1)], 1)
        return cls(
            batch.obs, data, tuple(batch.actions.shape[1:]), not batch.actions.is_floating_point(), batch.sequences
        )

    @property
    def size(self) -> int:
        return int(self.data.shape[0])

    def rows(self, idx: torch.Tensor) -> Minibatch:
        """The rows ``idx`` [B] (int64, on the batch's device)."""
        return self._split(self.obs.index_select(0, idx), self.data.index_select(0, idx), idx)

    def minibatches(
        self, batch_size: int, rng: np.random.Generator, part: tuple[int, int] | None = None, agents_per_env: int = 1
    ) -> Iterable[tuple[Minibatch, Sequences | None]]:
        """One epoch's minibatches in a fresh shuffle drawn from ``rng``, each with its ``Sequences`` (recurrent) or
        None.

        Feed-forward: ``batch_size`` rows at a time. Recurrent: ``batch_size / T`` whole environment sequences at a
        time, never shuffled within, each replayed from its recorded initial state. Either way times
        ``agents_per_env``, the rows a multi-agent env's step holds. ``part=(j, k)``: the j-th of k chunks of every
        minibatch (every worker that holds the whole batch must then draw the same shuffles).
        """
        sequences = self.sequences
        units = self.size if sequences is None else sequences.count
        per = batch_size if sequences is None else max(1, batch_size // sequences.length)
        per *= agents_per_env
        if per >= units and part is None:  # one minibatch: the whole batch, order irrelevant
            return [(self.all_rows(), sequences)]
        order = torch.from_numpy(rng.permutation(units)).to(self.device)
        chunks = (order[i : i + per] for i in range(0, units, per))
        if part is not None:
            chunks = (torch.tensor_split(idx, part[1])[part[0]] for idx in chunks)
        if sequences is None:
            return ((self.rows(idx), None) for idx in chunks)
        T, N = sequences.length, sequences.count
        return ((self.rows(sequence_minibatch_rows(T, N, envs)), sequences.select(envs)) for envs in chunks)

    def all_rows(self) -> Minibatch:
        if self._all is None:
            self._all = self._split(self.obs, self.data, torch.arange(self.size, device=self.device))
        return self._all

    def _split(self, obs: torch.Tensor, data: torch.Tensor, idx: torch.Tensor) -> Minibatch:
        a = self.action_columns
        actions = data[:, :a].reshape(len(data), *self.action_shape)
        if self.discrete:
            actions = actions.long()
        log_prob, values, advantages, returns, valid = data[:, a:].unbind(1)
        return Minibatch(obs, actions, log_prob, values, advantages, returns, valid, idx)

    def explained_variance(self, values: torch.Tensor | None = None) -> float:
        """1 - Var[returns - values] / Var[returns] over valid steps (1 is perfect, <= 0 is useless).

        ``values`` [B]: the critic's values in the returns' units, where the batch's are not (default: its own).
        """
        r = self.all_rows()
        mask = r.valid > 0
        returns, values = r.returns[mask], (r.old_values if values is None else values)[mask]
        var = float(returns.var()) if returns.numel() > 1 else 0.0
        return float("nan") if var == 0 else 1.0 - float((returns - values).var()) / var
