"""The Python API, in the spirit of stable-baselines3.

>>> model = PPO("CartPole-v1", seed=0, n_envs=8).learn(100_000)   # doctest: +SKIP
>>> model.save("cartpole-ppo"); model = PPO.load("cartpole-ppo")    # doctest: +SKIP
>>> action = model.predict(obs, deterministic=True)                # doctest: +SKIP
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np

from distrl import checkpoint
from distrl.config import RunConfig
from distrl.evaluation import evaluate
from distrl.envs import make_env
from distrl.presets import ppo_configs
from distrl.train import EVAL_SEED_OFFSET, OnPolicyTrainer, configs_from_checkpoint

_RUN_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


class PPO:
    """PPO on a Gymnasium environment, trained in this process (``--strategy single``).

    Args:
        env: Gymnasium id, short name or 'package.module:ClassName'.
        seed: seed for networks, sampling and environments.
        preset: 'none' (library defaults, as stable-baselines3), 'auto' or a preset name.
        run_dir: where to write logs (Monitor CSV, TensorBoard); None writes nothing.
        **hyperparameters: any :class:`~distrl.config.PPOConfig` field (n_envs, n_steps,
            batch_size, learning_rate, ...) or run field (device, vec, quiet, ...).
    """

    def __init__(self, env: str, *, seed: int = 0, preset: str = "none", run_dir: str | Path | None = None,
                 **hyperparameters: Any):
        run = {k: v for k, v in hyperparameters.items() if k in _RUN_FIELDS}
        ppo = {k: v for k, v in hyperparameters.items() if k not in _RUN_FIELDS}
        run.setdefault("quiet", True)
        run_cfg, cfg, _ = ppo_configs(env, preset, {"seed": seed, **run}, ppo)
        self._trainer = OnPolicyTrainer(run_cfg, cfg, run_dir=Path(run_dir) if run_dir else None)

    @property
    def num_steps(self) -> int:
        """Environment steps trained so far."""
        return self._trainer.steps

    def learn(self, total_steps: int) -> PPO:
        """Train for ``total_steps`` more environment steps; schedules anneal over the run's total."""
        self._trainer.train(total_steps=self._trainer.steps + total_steps)
        return self

    def predict(self, obs: np.ndarray, deterministic: bool = True, rng: np.random.Generator | None = None) -> np.ndarray:
        """Action(s) for one observation [obs_dim] or a batch [B, obs_dim], clipped to the env's bounds."""
        trainer = self._trainer
        obs = np.asarray(obs, dtype=np.float32)
        single = obs.ndim == 1
        batch = obs[None] if single else obs
        noise = None
        if not deterministic:
            rng = rng if rng is not None else np.random.default_rng()
            shape = (len(batch), *trainer.agent.noise_shape())
            noise = rng.random(shape, dtype=np.float32) if trainer.agent.discrete else rng.standard_normal(shape, dtype=np.float32)
        actions = trainer.agent.env_action(trainer.agent.act(trainer.obs_normalizer(batch), noise))
        return actions[0] if single else actions

    def evaluate(self, n_episodes: int = 10, deterministic: bool = True, seed: int | None = None) -> tuple[float, float]:
        """Mean and std of the return over ``n_episodes`` episodes."""
        trainer = self._trainer
        env = make_env(trainer.env_id, n_episodes, trainer.run.vec)
        try:
            seed = trainer.run.seed + EVAL_SEED_OFFSET if seed is None else seed
            returns = evaluate(trainer.agent, trainer.obs_normalizer, env, seed, deterministic)
        finally:
            env.close()
        return float(returns.mean()), float(returns.std())

    def save(self, path: str | Path) -> Path:
        """Write the model (weights, optimizer, normalisation statistics, config) as a checkpoint directory."""
        tensors, state = self._trainer.checkpoint_contents()
        return checkpoint.save(Path(path), tensors, state)

    @classmethod
    def load(cls, path: str | Path, device: str = "auto") -> PPO:
        """Load a model saved by :meth:`save`, a checkpoint directory, or a run directory's newest checkpoint."""
        path = checkpoint.find_latest(Path(path))
        run_cfg, _, cfg, _ = configs_from_checkpoint(path)
        model = cls.__new__(cls)
        model._trainer = OnPolicyTrainer(run_cfg.replace(device=device, quiet=True), cfg, run_dir=None)
        model._trainer.load_checkpoint(path)
        return model

    def close(self) -> None:
        self._trainer.close()
