"""Training loops on one run lifecycle (``RunState``): on-policy (PPO), off-policy (SAC), value-based (DQN) and episodic (REINFORCE)
over environments, offline (BC, TD3+BC, IQL) over datasets (``TrainerBase``), and GRPO's over group tasks; and the tuned settings per environment
(``presets``, ``preset_files``).

The names below load on first use (PEP 562), so that the command line can read presets and parse flags without
importing torch: ``from distrl.training import OnPolicyTrainer`` works as ever.

Imports: :mod:`distrl.algos` and everything below it; never a strategy (a strategy builds a trainer and
hands it its sources) nor the command line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from distrl.run.rundir import default_run_dir
    from distrl.training.common import EVAL_SEED_OFFSET, TrainerBase
    from distrl.training.episodic import EpisodicTrainer
    from distrl.training.group import GroupTrainer
    from distrl.training.off_policy import OffPolicyTrainer
    from distrl.training.offline import OfflineTrainer
    from distrl.training.on_policy import OnPolicyTrainer
    from distrl.training.recorded import configs_from_checkpoint
    from distrl.training.state import RunState, resolve_device
    from distrl.training.trainers import TRAINERS, make_trainer
    from distrl.training.value_based import DQNTrainer

_HOMES = {
    "EVAL_SEED_OFFSET": "distrl.training.common",
    "TrainerBase": "distrl.training.common",
    "default_run_dir": "distrl.run.rundir",
    "EpisodicTrainer": "distrl.training.episodic",
    "GroupTrainer": "distrl.training.group",
    "OffPolicyTrainer": "distrl.training.off_policy",
    "OfflineTrainer": "distrl.training.offline",
    "OnPolicyTrainer": "distrl.training.on_policy",
    "configs_from_checkpoint": "distrl.training.recorded",
    "RunState": "distrl.training.state",
    "resolve_device": "distrl.training.state",
    "TRAINERS": "distrl.training.trainers",
    "make_trainer": "distrl.training.trainers",
    "DQNTrainer": "distrl.training.value_based",
}
__all__ = [
    "EVAL_SEED_OFFSET",
    "TRAINERS",
    "DQNTrainer",
    "EpisodicTrainer",
    "GroupTrainer",
    "OffPolicyTrainer",
    "OfflineTrainer",
    "OnPolicyTrainer",
    "RunState",
    "TrainerBase",
    "configs_from_checkpoint",
    "default_run_dir",
    "make_trainer",
    "resolve_device",
]


def __getattr__(name: str) -> Any:
    if name not in _HOMES:
        raise AttributeError(f"module 'distrl.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value
    return value
