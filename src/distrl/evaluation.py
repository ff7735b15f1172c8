"""Policy evaluation: one episode per environment of a vector env, run to its end."""

from __future__ import annotations

import numpy as np

from distrl.data.normalize import ObsNormalizer
from distrl.envs import VecEnv
from distrl.nets import ActorCritic


def evaluate(agent: ActorCritic, obs_normalizer: ObsNormalizer, env: VecEnv, seed: int,
             deterministic: bool = True, rng: np.random.Generator | None = None,
             max_steps: int = 1_000_000) -> np.ndarray:
    """Undiscounted returns of one episode in each of ``env``'s environments.

    Deterministic evaluation takes the argmax (discrete) or the mean (Gaussian);
    stochastic evaluation samples with noise from ``rng``.
    """
    rng = rng if rng is not None else np.random.default_rng(seed)
    obs = env.reset(seed=seed)
    returns = np.full(env.n_envs, np.nan)
    for _ in range(max_steps):
        if deterministic:
            noise = None
        elif agent.discrete:
            noise = rng.random(env.n_envs, dtype=np.float32)
        else:
            noise = rng.standard_normal((env.n_envs, agent.action_dim), dtype=np.float32)
        action = agent.act(obs_normalizer(obs), noise)
        step = env.step(agent.env_action(action))
        obs = step.obs
        ended = step.terminated | step.truncated
        if ended.any():
            first = ended & np.isnan(returns)
            # VecEnv reports returns only for the envs that ended, in env order.
            returns[np.flatnonzero(ended)[first[ended]]] = step.episode_returns[first[ended]]
        if not np.isnan(returns).any():
            return returns
    raise RuntimeError(f"evaluation did not finish {env.n_envs} episodes within {max_steps} steps")
