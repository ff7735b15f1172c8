"""The configs of the V-trace actor-critics, IMPALA and APPO: PPO's network, rollout and loss fields with
V-trace's truncation levels, and defaults from the implementations they follow."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distrl.config.algos import PPOConfig
from distrl.config.base import require, require_positive

Optimizer = Literal["adam", "rmsprop"]


def _check_vtrace(cfg: APPOConfig | IMPALAConfig) -> None:
    require(cfg.vtrace_rho_bar > 0, "vtrace_rho_bar", cfg.vtrace_rho_bar, "> 0 (inf: no truncation)")
    require(cfg.vtrace_c_bar >= 0, "vtrace_c_bar", cfg.vtrace_c_bar, ">= 0 (0 cuts every trace; inf: none)")
    require(
        cfg.core == "none" or not cfg.recompute_advantage,
        "recompute_advantage",
        cfg.recompute_advantage,
        "False with a recurrent core",
    )


@dataclass(frozen=True)
class APPOConfig(PPOConfig):
    """Asynchronous PPO: PPO's clipped surrogate on V-trace advantages and value targets (Espeholt et al.
    2018, arXiv:1802.01561), as Sample Factory's APPO (Petrenko et al. 2020, arXiv:2006.11751) does.

    The surrogate's ratio is against the behaviour policy that collected the data; V-trace's targets
    are computed with the learner's current network when a batch is prepared (no target network, no KL
    term). Defaults are Sample Factory's (``sample_factory/cfg/cfg.py``): lr 1e-4, clip 0.1, one epoch,
    entropy 0.003, gradient norm 4. Data more than ``--max-policy-lag`` versions old is dropped.
    """

    n_envs: int = 8
    n_steps: int = 32
    batch_size: int = 256
    n_epochs: int = 1
    learning_rate: float = 1e-4
    gae_lambda: float = 1.0
    """V-trace's lambda: the traces are ``lam * min(c_bar, pi/mu)`` (1 in the paper)."""
    clip_range: float = 0.1
    ent_coef: float = 0.003
    max_grad_norm: float = 4.0
    vtrace_rho_bar: float = 1.0
    """V-trace's rho-bar: the truncation of the importance weights in the targets and the policy gradient's
    advantage (the paper's default, 1)."""
    vtrace_c_bar: float = 1.0
    """V-trace's c-bar: the truncation of the trace coefficients (the paper's default, 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_vtrace(self)


@dataclass(frozen=True)
class IMPALAConfig(PPOConfig):
    """IMPALA's V-trace actor-critic (Espeholt et al. 2018, arXiv:1802.01561): the policy gradient
    ``-rho_s A_s log pi`` on V-trace advantages, a value loss toward ``v_s`` and an entropy bonus, one
    gradient step per batch.

    Losses are means over the batch (as RLlib's IMPALA, whose defaults these are: lr 5e-4, value
    coefficient 0.5 on ``0.5 (V - v_s)^2``, entropy 0.01, gradient norm 40, fragments of 50 steps). The
    clipped-surrogate fields of PPO (clip_range, clip_range_vf, target_kl) take no part.
    ``--optimizer rmsprop`` gives the paper's RMSProp (decay 0.99, no momentum, epsilon 0.01).
    """

    n_envs: int = 8
    n_steps: int = 50
    batch_size: int = 400
    n_epochs: int = 1
    learning_rate: float = 5e-4
    gae_lambda: float = 1.0
    """V-trace's lambda: the traces are ``lam * min(c_bar, pi/mu)`` (1 in the paper)."""
    ent_coef: float = 0.01
    max_grad_norm: float = 40.0
    normalize_advantage: bool = False
    vtrace_rho_bar: float = 1.0
    """V-trace's rho-bar: the truncation of the importance weights in the targets and the policy gradient's
    advantage (the paper's default, 1)."""
    vtrace_c_bar: float = 1.0
    """V-trace's c-bar: the truncation of the trace coefficients (the paper's default, 1)."""
    optimizer: Optimizer = "adam"
    """adam, or rmsprop as in the paper."""
    rmsprop_alpha: float = 0.99
    """RMSProp's decay of the squared-gradient average."""
    rmsprop_eps: float = 0.01
    """RMSProp's epsilon (the paper's 0.01)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_vtrace(self)
        require(self.clip_range_vf is None, "clip_range_vf", self.clip_range_vf, "None for impala (no clipping)")
        require(self.target_kl is None, "target_kl", self.target_kl, "None for impala (one step per batch)")
        require_positive(self, "rmsprop_eps")
        require(0 < self.rmsprop_alpha < 1, "rmsprop_alpha", self.rmsprop_alpha, "in (0, 1)")
