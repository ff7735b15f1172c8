"""distrl: distributed reinforcement learning on PyTorch and Gymnasium.

>>> from distrl import PPO
>>> model = PPO("CartPole-v1", seed=0, n_envs=8).learn(100_000)  # doctest: +SKIP
>>> model.evaluate(10)  # doctest: +SKIP
"""

__version__ = "0.1.0"

from distrl.api import APPO, DQN, IMPALA, PPO, REINFORCE, SAC  # noqa: E402

__all__ = ["APPO", "DQN", "IMPALA", "PPO", "REINFORCE", "SAC", "__version__"]
