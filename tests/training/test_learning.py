"""Learning tests: slow, fixed seeds, run with ``pytest -m slow``."""

import pytest

from distrl import PPO, SAC


@pytest.mark.slow
@pytest.mark.parametrize("seed", [0, 1])
def test_ppo_solves_cartpole_and_stays_solved(seed):
    # seed 1 solved CartPole at 40k steps and collapsed to 175 by 100k before the preset's target-KL stop
    model = PPO("CartPole-v1", seed=seed, preset="auto").learn(100_000)
    mean, _ = model.evaluate(10)
    model.close()
    assert mean >= 475


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sac_reaches_minus_200_on_pendulum_within_20k_steps(precision):
    model = SAC(
        "Pendulum-v1", seed=0, preset="auto", eval_every=2000, target_return=-200.0, threads=2, precision=precision
    )
    model.learn(20_000)
    mean, _ = model._trainer.last_eval
    model.close()
    assert mean >= -200
