"""The short names distrl resolves (``cartpole`` for ``CartPole-v1``), in a module of their own: the command line lists
them in its help without loading Gymnasium (see :mod:`distrl.envs.names` for resolving them)."""

SHORT_NAMES = {
    "cartpole": "CartPole-v1",
    "pendulum": "Pendulum-v1",
    "acrobot": "Acrobot-v1",
    "mountaincar": "MountainCar-v0",
    "mountaincarcontinuous": "MountainCarContinuous-v0",
    "hopper": "Hopper-v5",
    "halfcheetah": "HalfCheetah-v5",
    "walker2d": "Walker2d-v5",
    "ant": "Ant-v5",
    "humanoid": "Humanoid-v5",
    "lunarlander": "LunarLander-v3",
    "bipedalwalker": "BipedalWalker-v3",
    "breakout": "ALE/Breakout-v5",
    "pong": "ALE/Pong-v5",
}

_GYMNASIUM_IDS = frozenset(env_id for env_id in SHORT_NAMES.values() if not env_id.startswith("ALE/"))
"""The ids the short names stand for that are in Gymnasium's own registry (ale-py registers the ``ALE/`` ones)."""


def known_id(name: str) -> str | None:
    """The Gymnasium id of a short name, or of an id a short name stands for, when Gymnasium itself need not be
    asked: these ids are in Gymnasium's own registry. None for anything else (an ``ALE/`` id, which needs ale-py's
    registration, or any other name), which :func:`distrl.envs.names.resolve_env_id` resolves."""
    env_id = SHORT_NAMES.get(name.lower(), name)
    if env_id in _GYMNASIUM_IDS:
        return env_id
    return None
