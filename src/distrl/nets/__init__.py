"""Networks over flat parameter buffers: closed-form MLPs (``core``) and any ``torch.nn.Module``
(``module``), encoders, recurrent cores, heads, Q and SAC networks, multi-agent and language-model policies,
and the one agent factory (``factory``).

Imports: :mod:`distrl.envs` (spaces, masks), :mod:`distrl.tasks` (text environments), :mod:`distrl.config`;
never data, algos or above.
"""

from distrl.nets.actor_critic import ActorCritic, TrainForward
from distrl.nets.core import MLP, NumpyMLP, ParamBuffer, mlp_shapes
from distrl.nets.distributions import (
    CategoricalTerms,
    GaussianTerms,
    categorical_grad,
    categorical_terms,
    gaussian_grad,
    gaussian_terms,
    multi_categorical_terms,
    sample_actions,
)
from distrl.nets.factory import Agent, make_agent, make_q_network
from distrl.nets.module import ModuleAgent, ModuleForward
from distrl.nets.q import QMLP, ModuleQ, QForward

__all__ = [
    "ActorCritic",
    "Agent",
    "CategoricalTerms",
    "GaussianTerms",
    "MLP",
    "ModuleAgent",
    "ModuleForward",
    "ModuleQ",
    "NumpyMLP",
    "ParamBuffer",
    "QForward",
    "QMLP",
    "TrainForward",
    "categorical_grad",
    "categorical_terms",
    "gaussian_grad",
    "gaussian_terms",
    "make_agent",
    "make_q_network",
    "mlp_shapes",
    "multi_categorical_terms",
    "sample_actions",
]
