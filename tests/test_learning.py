"""Learning tests: slow, fixed seeds, run with ``pytest -m slow``."""

import pytest

from distrl import PPO


@pytest.mark.slow
def test_ppo_solves_cartpole():
    model = PPO("CartPole-v1", seed=0, preset="auto").learn(100_000)
    mean, _ = model.evaluate(10)
    model.close()
    assert mean >= 475
