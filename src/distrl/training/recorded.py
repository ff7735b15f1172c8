"""What a run records of its configuration, and reading it back: the configs a checkpoint's JSON state holds,
and action spaces as JSON (config.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from distrl.config import ALGO_CONFIGS, ConfigError, RunConfig, StrategyConfig, from_dict
from distrl.run import checkpoint


def space_to_json(space: spaces.Space) -> dict[str, Any]:
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    assert isinstance(space, spaces.Box)
    return {"type": "Box", "low": space.low.tolist(), "high": space.high.tolist(), "shape": list(space.shape)}


def configs_from_checkpoint(path: Path) -> tuple[RunConfig, StrategyConfig, Any, dict[str, Any]]:
    """The run, strategy and (requested) algorithm configs stored in a checkpoint, and its JSON state."""
    _, state = checkpoint.load(path)
    return (*configs_from_state(path, state), state)


def configs_from_state(path: Path, state: dict[str, Any]) -> tuple[RunConfig, StrategyConfig, Any]:
    """The run, strategy and (requested) algorithm configs a checkpoint's JSON state records."""
    config = state["config"]
    algo = state.get("algo", "ppo")
    if algo not in ALGO_CONFIGS:
        raise ConfigError(f"checkpoint={str(path)!r} holds an unknown algorithm {algo!r}")
    run = dict(config["run"])
    run.setdefault("mask_input", True)  # saved before masks from info or action_masks() stopped being an input
    return (
        from_dict(RunConfig, run),
        from_dict(StrategyConfig, config["strategy"]),
        from_dict(ALGO_CONFIGS[algo], config[algo]),
    )
