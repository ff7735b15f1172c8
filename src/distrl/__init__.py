"""distrl: distributed reinforcement learning on PyTorch and Gymnasium.

>>> from distrl import PPO
>>> model = PPO("CartPole-v1", seed=0, n_envs=8).learn(100_000)  # doctest: +SKIP
>>> model.evaluate(10)  # doctest: +SKIP
"""

from typing import TYPE_CHECKING, Any

from distrl._version import __version__

__all__ = ["APPO", "BC", "CQL", "DQN", "IMPALA", "IQL", "PPO", "REINFORCE", "SAC", "TD3", "TD3BC", "__version__"]

if TYPE_CHECKING:
    from distrl.api import APPO, BC, CQL, DQN, IMPALA, IQL, PPO, REINFORCE, SAC, TD3, TD3BC


def __getattr__(name: str) -> Any:
    # The Python API imports torch; a process that needs only a corner of distrl (a reward worker, the CLI's
    # argument errors) should not pay for it, so the classes load on first use (PEP 562).
    if name in __all__ and name != "__version__":
        import distrl.api

        return getattr(distrl.api, name)
    raise AttributeError(f"module 'distrl' has no attribute {name!r}")
