"""Presets that cite rl-baselines3-zoo hold the zoo's values, so a results table that compares them with the
zoo's benchmark figures compares like with like."""

import pytest

from distrl.config import PPOConfig
from distrl.training.presets import PRESETS

# rl-baselines3-zoo hyperparams/ppo.yml, MuJoCo v3 entries, in PPOConfig's names. Every entry also normalises
# observations and rewards and trains 1M steps on 1 env; the tuned ones use 256x256 ReLU networks without
# orthogonal initialisation and log_std_init -2. Ant-v3's entry is the library defaults (its tuned values are
# commented out in the file), and the library's defaults are PPOConfig's.
TUNED_NETWORK = dict(net_arch=(256, 256), activation="relu", ortho_init=False, log_std_init=-2.0, n_steps=512)
ZOO = {
    "ant-zoo": dict(
        n_steps=2048,
        batch_size=64,
        n_epochs=10,
        learning_rate=3e-4,
        gamma=0.99,
        gae_lambda=0.95,
        clip_range=0.2,
        ent_coef=0.0,
        vf_coef=0.5,
        max_grad_norm=0.5,
        net_arch=(64, 64),
        activation="tanh",
        ortho_init=True,
        log_std_init=0.0,
    ),
    "halfcheetah-zoo": dict(
        TUNED_NETWORK,
        batch_size=64,
        gamma=0.98,
        learning_rate=2.0633e-05,
        ent_coef=0.000401762,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.92,
        max_grad_norm=0.8,
        vf_coef=0.58096,
    ),
    "hopper-zoo": dict(
        TUNED_NETWORK,
        batch_size=32,
        gamma=0.999,
        learning_rate=9.80828e-05,
        ent_coef=0.00229519,
        clip_range=0.2,
        n_epochs=5,
        gae_lambda=0.99,
        max_grad_norm=0.7,
        vf_coef=0.835671,
    ),
    "walker2d-zoo": dict(
        TUNED_NETWORK,
        batch_size=32,
        gamma=0.99,
        learning_rate=5.05041e-05,
        ent_coef=0.000585045,
        clip_range=0.1,
        n_epochs=20,
        gae_lambda=0.95,
        max_grad_norm=1.0,
        vf_coef=0.871923,
    ),
}


@pytest.mark.parametrize("name", sorted(ZOO))
def test_a_preset_citing_the_zoo_holds_its_values(name):
    values = dict(PRESETS["ppo"][name])
    assert values.pop("total_steps") == 1_000_000
    cfg = PPOConfig(**values)
    expected = dict(
        ZOO[name],
        n_envs=1,
        normalize_obs=True,
        normalize_reward=True,
        lr_schedule="constant",
        clip_schedule="constant",
        clip_range_vf=None,
        target_kl=None,
    )
    assert {k: getattr(cfg, k) for k in expected} == expected


# Tianshou's MuJoCo PPO benchmark (thu-ml/tianshou, examples/mujoco/mujoco_ppo.py as of its PPO benchmark, #330):
# 64 training envs, 2,048 steps per collect, 10 repeats of 64-sample batches, lr 3e-4 decayed linearly, vf 0.25,
# no value clipping, no advantage normalisation, advantages recomputed, 64x64 tanh, sigma initialised to e^-0.5.
TIANSHOU = dict(
    n_envs=64,
    n_steps=32,
    batch_size=64,
    n_epochs=10,
    learning_rate=3e-4,
    lr_schedule="linear",
    gamma=0.99,
    gae_lambda=0.95,
    clip_range=0.2,
    clip_range_vf=None,
    ent_coef=0.0,
    vf_coef=0.25,
    max_grad_norm=0.5,
    normalize_advantage=False,
    recompute_advantage=True,
    net_arch=(64, 64),
    activation="tanh",
    log_std_init=-0.5,
    normalize_obs=True,
)


@pytest.mark.parametrize("name", ["ant-tianshou", "halfcheetah-tianshou", "walker2d-tianshou"])
def test_a_preset_citing_tianshou_holds_its_values(name):
    values = dict(PRESETS["ppo"][name])
    assert values.pop("total_steps") == 1_000_000
    cfg = PPOConfig(**values)
    assert {k: getattr(cfg, k) for k in TIANSHOU} == TIANSHOU
