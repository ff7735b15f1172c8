"""The offline algorithms' models (BC, TD3+BC, IQL, CQL) and TD3: policies learned from a dataset, or online from
one learned so."""

from __future__ import annotations

from typing import Any

import numpy as np

from distrl.api.model import MODELS, Model
from distrl.config import ConfigError
from distrl.export import graph, offline_graph
from distrl.training import OfflineTrainer


class OfflineModel(Model):
    """A policy learned from a dataset, not from the env (``--dataset``: a Minari dataset's id or path): :meth:`learn`
    takes gradient steps, and the env only evaluates (online, ``init_from`` an offline run or TD3: environment steps,
    each with a gradient step). It acts with its mode (a deterministic policy's action, a Gaussian's mean, a
    categorical's most likely action); ``deterministic=False`` (and ``export(stochastic=True)``) draws from IQL's
    Gaussian, CQL's squashed Gaussian (Box actions) and behaviour cloning's categorical (Discrete actions)."""

    _trainer: OfflineTrainer

    def _sampling(self, asked: str) -> str:
        """The noise a draw of this policy takes (``algo.sampling``); one line naming ``asked`` where it has none."""
        trainer = self._trainer
        kind: str | None = trainer.algo.sampling
        if kind is None:
            actions = "Discrete" if trainer.discrete else "Box"
            raise ConfigError(
                f"{asked} is not available for {self.algo} on {actions} actions: its policy is deterministic "
                "(draws: iql, cql on Box actions, bc on Discrete actions)"
            )
        return kind

    def _noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        if self._sampling("deterministic=False") == "uniform":
            return rng.random(n, dtype=np.float32)
        return rng.standard_normal((n, *self._trainer.low.shape), dtype=np.float32)

    def _graph(self, stochastic: bool) -> graph.ActingGraph:
        if stochastic:
            self._sampling("stochastic=True")
        trainer = self._trainer
        policy = trainer.algo.policy
        standardised = trainer.cfg.normalize_obs
        return offline_graph.offline_graph(
            policy.module,
            policy.params,
            trainer.env.single_observation_space,
            trainer.env.single_action_space,
            trainer.obs_mean if standardised else None,
            trainer.obs_std if standardised else None,
            stochastic,
        )

    def _actions(
        self, obs: np.ndarray, noise: np.ndarray | None, state: Any = None, starts: np.ndarray | None = None
    ) -> tuple[np.ndarray, Any]:
        return self._trainer.actions(obs, noise), None


class BC(OfflineModel):
    """Behaviour cloning from a dataset; hyperparameters as :class:`~distrl.config.BCConfig`:
    ``BC("Pendulum-v1", dataset="pendulum/expert-v0").learn(20_000)``."""

    algo = "bc"


class TD3BC(OfflineModel):
    """TD3+BC from a dataset; hyperparameters as :class:`~distrl.config.TD3BCConfig`."""

    algo = "td3bc"


class IQL(OfflineModel):
    """Implicit Q-learning from a dataset; hyperparameters as :class:`~distrl.config.IQLConfig`."""

    algo = "iql"


class TD3(OfflineModel):
    """TD3, online (``learn`` counts environment steps); ``init_from`` a TD3+BC run goes on from its networks.
    Hyperparameters as :class:`~distrl.config.TD3Config`."""

    algo = "td3"


class CQL(OfflineModel):
    """Conservative Q-learning from a dataset (Box or Discrete actions); hyperparameters as
    :class:`~distrl.config.CQLConfig`."""

    algo = "cql"


MODELS.update({"bc": BC, "td3bc": TD3BC, "iql": IQL, "cql": CQL, "td3": TD3})
