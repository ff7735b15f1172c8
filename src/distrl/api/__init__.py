"""The Python API, in the spirit of stable-baselines3.

>>> model = PPO("CartPole-v1", seed=0, n_envs=8).learn(100_000)   # doctest: +SKIP
>>> model = PPO("MlpPolicy", "CartPole-v1").learn(total_timesteps=100_000)  # doctest: +SKIP
>>> model.save("cartpole-ppo"); model = PPO.load("cartpole-ppo")    # doctest: +SKIP
>>> action, _ = model.predict(obs, deterministic=True)             # doctest: +SKIP
>>> SAC("Pendulum-v1", learning_rate=1e-3).learn(20_000).evaluate(10)  # doctest: +SKIP

The models live in ``model`` (what every algorithm's shares), ``algorithms`` (PPO, APPO, IMPALA, SAC, DQN,
REINFORCE) and ``offline`` (BC, TD3+BC, IQL, CQL, TD3).

Imports: the training loops and what lies below them (export, algos, data, nets, envs, run, config); nothing imports
it but the command line and the package root (its classes load on first use there).
"""

from distrl.api.algorithms import APPO, DQN, IMPALA, PPO, REINFORCE, SAC
from distrl.api.model import MODELS, Model, Player
from distrl.api.offline import BC, CQL, IQL, TD3, TD3BC, OfflineModel

__all__ = [
    "APPO",
    "BC",
    "CQL",
    "DQN",
    "IMPALA",
    "IQL",
    "MODELS",
    "PPO",
    "REINFORCE",
    "SAC",
    "TD3",
    "TD3BC",
    "Model",
    "OfflineModel",
    "Player",
]
