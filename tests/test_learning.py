"""Learning tests: slow, fixed seeds, run with ``pytest -m slow``."""

import pytest

from distrl import PPO, SAC


@pytest.mark.slow
def test_ppo_solves_cartpole():
    model = PPO("CartPole-v1", seed=0, preset="auto").learn(100_000)
    mean, _ = model.evaluate(10)
    model.close()
    assert mean >= 475


@pytest.mark.slow
def test_sac_reaches_minus_200_on_pendulum_within_20k_steps():
    model = SAC("Pendulum-v1", seed=0, preset="auto", eval_every=2000, target_return=-200.0, threads=2)
    model.learn(20_000)
    mean, _ = model._trainer.last_eval
    model.close()
    assert mean >= -200
