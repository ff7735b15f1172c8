"""Which trainer trains which algorithm: the one table every strategy and the command line build trainers from."""

from __future__ import annotations

from typing import Any

from distrl.training.episodic import EpisodicTrainer
from distrl.training.group import GroupTrainer
from distrl.training.off_policy import OffPolicyTrainer
from distrl.training.offline import OfflineTrainer
from distrl.training.on_policy import OnPolicyTrainer
from distrl.training.value_based import DQNTrainer

TRAINERS: dict[str, Any] = {
    "ppo": OnPolicyTrainer,
    "appo": OnPolicyTrainer,
    "impala": OnPolicyTrainer,
    "sac": OffPolicyTrainer,
    "dqn": DQNTrainer,
    "reinforce": EpisodicTrainer,
    "grpo": GroupTrainer,
    "bc": OfflineTrainer,
    "td3bc": OfflineTrainer,
    "iql": OfflineTrainer,
    "cql": OfflineTrainer,
    "td3": OfflineTrainer,
}


def make_trainer(algo: str, *args: Any, **kwargs: Any) -> Any:
    """The trainer of ``algo``: a :class:`RunState` (every strategy drives it through that lifecycle), and for the
    environment algorithms a :class:`TrainerBase`."""
    return TRAINERS[algo](*args, **kwargs)
