"""Training loops on one run lifecycle (``RunState``): on-policy (PPO), off-policy (SAC), value-based (DQN) and episodic (REINFORCE)
over environments (``TrainerBase``), and GRPO's over group tasks; and the tuned settings per environment
(``presets``, ``preset_files``).

Imports: :mod:`distrl.algos` and everything below it; never a strategy (a strategy builds a trainer and
hands it its sources) nor the command line.
"""

from __future__ import annotations

from typing import Any

from distrl.training.common import EVAL_SEED_OFFSET, TrainerBase, default_run_dir
from distrl.training.episodic import EpisodicTrainer
from distrl.training.group import GroupTrainer
from distrl.training.off_policy import OffPolicyTrainer
from distrl.training.on_policy import OnPolicyTrainer
from distrl.training.recorded import configs_from_checkpoint
from distrl.training.state import RunState, resolve_device
from distrl.training.value_based import DQNTrainer

TRAINERS: dict[str, Any] = {
    "ppo": OnPolicyTrainer,
    "appo": OnPolicyTrainer,
    "impala": OnPolicyTrainer,
    "sac": OffPolicyTrainer,
    "dqn": DQNTrainer,
    "reinforce": EpisodicTrainer,
    "grpo": GroupTrainer,
}


def make_trainer(algo: str, *args: Any, **kwargs: Any) -> Any:
    """The trainer of ``algo``: a :class:`RunState` (every strategy drives it through that lifecycle), and for the
    environment algorithms a :class:`TrainerBase`."""
    return TRAINERS[algo](*args, **kwargs)


__all__ = [
    "EVAL_SEED_OFFSET",
    "DQNTrainer",
    "EpisodicTrainer",
    "GroupTrainer",
    "OffPolicyTrainer",
    "OnPolicyTrainer",
    "RunState",
    "TRAINERS",
    "TrainerBase",
    "configs_from_checkpoint",
    "default_run_dir",
    "make_trainer",
    "resolve_device",
]
