import numpy as np
import pytest

from distrl import PPO
from distrl.config import ConfigError


def test_learn_save_load_predict(tmp_path):
    model = PPO("CartPole-v1", seed=0, n_envs=4, n_steps=32, batch_size=64, n_epochs=2).learn(1024)
    assert model.num_steps == 1024
    obs = np.array([0.01, -0.02, 0.03, 0.0], dtype=np.float32)
    action = model.predict(obs)
    assert action.shape == () and action in (0, 1)
    model.save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m")
    batch = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32) * 0.05
    np.testing.assert_array_equal(loaded.predict(batch), model.predict(batch))
    assert loaded.evaluate(3) == model.evaluate(3)
    model.close()
    loaded.close()


def test_continuous_predict_is_clipped_to_bounds():
    model = PPO("Pendulum-v1", seed=0, n_envs=2, n_steps=16, batch_size=32, n_epochs=1, log_std_init=2.0).learn(64)
    actions = model.predict(np.zeros((50, 3), np.float32), deterministic=False, rng=np.random.default_rng(0))
    assert actions.shape == (50, 1) and np.abs(actions).max() <= 2.0
    model.close()


def test_unknown_hyperparameter_is_named():
    with pytest.raises(ConfigError, match="n_step=.*is not a PPOConfig field"):
        PPO("CartPole-v1", n_step=5)


def test_discrete_only_env_rejects_nothing_but_box_obs_required():
    with pytest.raises(ConfigError, match="Discrete observation space"):
        PPO("FrozenLake-v1")


@pytest.mark.parametrize("flush", [True, False])
def test_a_cpu_run_flushes_subnormal_floats_to_zero_unless_told_not_to(flush):
    import torch

    torch.set_flush_denormal(not flush)
    try:
        PPO("CartPole-v1", n_envs=1, n_steps=8, batch_size=8, flush_denormal=flush).close()
        tiny = torch.tensor([1e-39])  # below float32's smallest normal number, about 1.18e-38
        assert ((tiny * 1.0).item() == 0.0) is flush
    finally:
        torch.set_flush_denormal(False)  # torch's default
