"""Networks over flat parameter buffers, with hand-written backward passes (see core.py)."""

from distrl.nets.actor_critic import ActorCritic, TrainForward
from distrl.nets.core import MLP, NumpyMLP, ParamBuffer, mlp_shapes
from distrl.nets.distributions import (CategoricalTerms, GaussianTerms, categorical_grad, categorical_terms,
                                       gaussian_grad, gaussian_terms)

__all__ = ["ActorCritic", "CategoricalTerms", "GaussianTerms", "MLP", "NumpyMLP", "ParamBuffer", "TrainForward",
           "categorical_grad", "categorical_terms", "gaussian_grad", "gaussian_terms", "mlp_shapes"]
