import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from distrl import DQN, PPO, SAC
from distrl.api import Model
from distrl.config import ConfigError


def test_learn_save_load_predict(tmp_path):
    model = PPO("CartPole-v1", seed=0, n_envs=4, n_steps=32, batch_size=64, n_epochs=2).learn(1024)
    assert model.num_steps == 1024
    obs = np.array([0.01, -0.02, 0.03, 0.0], dtype=np.float32)
    action, state = model.predict(obs)
    assert action.shape == () and action in (0, 1) and state is None
    model.save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m")
    batch = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32) * 0.05
    np.testing.assert_array_equal(loaded.predict(batch)[0], model.predict(batch)[0])
    assert loaded.evaluate(3) == model.evaluate(3)
    model.close()
    loaded.close()


def test_continuous_predict_is_clipped_to_bounds():
    model = PPO("Pendulum-v1", seed=0, n_envs=2, n_steps=16, batch_size=32, n_epochs=1, log_std_init=2.0).learn(64)
    actions, _ = model.predict(np.zeros((50, 3), np.float32), deterministic=False, rng=np.random.default_rng(0))
    assert actions.shape == (50, 1) and np.abs(actions).max() <= 2.0
    model.close()


def test_unknown_hyperparameter_is_named():
    with pytest.raises(ConfigError, match="^colour=5 is not a PPOConfig field: must be one of activation, "):
        PPO("CartPole-v1", colour=5)


def test_a_discrete_observation_is_one_hot_encoded_and_a_tuple_names_a_wrapper():
    model = PPO("FrozenLake-v1", n_steps=16, batch_size=16)
    assert type(model._trainer.agent.module.encoder).__name__ == "OneHot"
    model.close()
    with pytest.raises(ConfigError, match="observation space Tuple .*FlattenObservation"):
        PPO("Blackjack-v1")


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


TINY = dict(n_envs=2, n_steps=16, batch_size=32, n_epochs=1)


def test_a_gymnasium_env_instance_is_accepted_and_recorded_by_its_spec(tmp_path):
    import json

    import gymnasium as gym

    model = PPO(gym.make("CartPole-v1", sutton_barto_reward=True), run_dir=tmp_path / "run", **TINY).learn(64)
    run = json.loads((tmp_path / "run" / "config.json").read_text())["run"]
    assert run["env"] == "CartPole-v1" and run["env_kwargs"] == ["sutton_barto_reward=true"]
    assert model._trainer.env.n_envs == 2
    model.close()


def test_a_factory_and_wrappers_from_the_api(tmp_path):
    from distrl_testenvs import GoRight, double_reward

    model = PPO(lambda: GoRight(size=2), wrappers=[double_reward], env_kwargs=None, **TINY).learn(64)
    run = model._trainer.run
    assert run.env.startswith("memory:") and run.wrappers == ("distrl_testenvs:double_reward",)
    model.save(tmp_path / "m")
    model.close()
    from distrl.envs import names as env_names

    name = run.env
    factory = env_names._OBJECTS.pop(name)  # as in a fresh process: the lambda is gone
    shutil.copytree(tmp_path / "m", tmp_path / "copied")  # as if it came from another machine
    with pytest.raises(ConfigError, match="names code .* wrapper='distrl_testenvs:double_reward'"):
        PPO.load(tmp_path / "copied", env=GoRight)  # the wrapper the run names is not passed again
    PPO.load(tmp_path / "m", env=GoRight).close()  # saved by this user here: its wrapper loads unasked
    with pytest.raises(ConfigError, match="was a Python object given to the API .* PPO.load\\(path, env=...\\)"):
        PPO.load(tmp_path / "m", trust_code=True)
    env_names._OBJECTS[name] = factory
    loaded = PPO.load(tmp_path / "m", env=GoRight, trust_code=True)
    assert loaded._trainer.run.env == "distrl_testenvs:GoRight"
    assert loaded.evaluate(2)[0] != 0.0
    loaded.close()


def test_an_env_instance_without_spec_trains_alone(tmp_path):
    from distrl_testenvs import GoRight

    instance = GoRight(size=2)
    with pytest.raises(ConfigError, match="n_envs=2 is not allowed with an env instance that has no spec"):
        PPO(instance, **TINY)
    model = PPO(GoRight(size=2), n_envs=1, n_steps=32, batch_size=32, n_epochs=1).learn(64)
    assert model.num_steps == 64 and len(model.evaluate(3)) == 2
    model.close()


def test_api_env_kwargs_reach_the_constructor():
    model = PPO("distrl_testenvs:GoRight", env_kwargs={"size": 7}, **TINY)
    assert model._trainer.run.env_kwargs == ("size=7",)
    assert model._trainer.env.env.envs[0].unwrapped.size == 7
    model.close()


def test_a_users_network_class_is_recorded_by_name_and_loads_trusted_without_being_passed_again(tmp_path):
    from distrl_spaceenvs import TinyEncoder

    model = PPO("distrl_spaceenvs:SignsEnv", policy=TinyEncoder, n_envs=2, n_steps=16, batch_size=32).learn(64)
    assert model._trainer.run.policy == "distrl_spaceenvs:TinyEncoder"
    obs = np.array([[1, -1, 1], [-1, -1, 1]], np.float32)
    expected, _ = model.predict(obs)
    model.save(tmp_path / "m")
    loaded = PPO.load(tmp_path / "m", trust_code=True)  # the run names distrl_spaceenvs: code
    np.testing.assert_array_equal(loaded.predict(obs)[0], expected)
    assert expected.shape == (2, 3)  # MultiDiscrete: one choice per part


def test_a_network_object_lives_in_this_process_only_and_load_says_how_to_pass_it_again(tmp_path):
    from distrl_spaceenvs import TinyNet

    model = PPO("CartPole-v1", policy=lambda o, a, c: TinyNet(4, 2), n_steps=32, batch_size=32).learn(32)
    assert model._trainer.run.policy.startswith("memory:")
    model.save(tmp_path / "m")
    code = f"import sys; sys.path.insert(0, 'tests'); from distrl import PPO\nPPO.load({str(tmp_path / 'm')!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode != 0 and "pass it again, e.g. PPO.load(path, policy=MyNet)" in out.stderr
    loaded = PPO.load(tmp_path / "m", policy=lambda o, a, c: TinyNet(4, 2))
    obs = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(loaded.predict(obs)[0], model.predict(obs)[0])


def test_predict_takes_images_and_dict_observations_as_the_env_gives_them():
    from distrl_spaceenvs import DictSignEnv, QuadrantEnv

    pixels = PPO("distrl_spaceenvs:QuadrantEnv", n_envs=2, n_steps=8, batch_size=16)
    image, _ = QuadrantEnv().reset(seed=0)
    assert np.ndim(pixels.predict(image)[0]) == 0 and pixels.predict(np.stack([image] * 3))[0].shape == (3,)
    keyed = PPO("distrl_spaceenvs:DictSignEnv", n_envs=2, n_steps=8, batch_size=16)
    obs, _ = DictSignEnv().reset(seed=0)
    one, _ = keyed.predict(obs)
    batch, _ = keyed.predict({k: np.stack([v] * 2) for k, v in obs.items()})
    assert np.ndim(one) == 0 and batch.shape == (2,) and batch[0] == one


CUE = "distrl_memoryenvs:CueEnv"


@pytest.mark.parametrize(
    "make, obs_dim",
    [
        (lambda: PPO("CartPole-v1", **TINY), 4),
        (lambda: PPO(CUE, core="lstm", core_size=8, n_envs=2, n_steps=8, batch_size=8), 3),
        (lambda: PPO(CUE, core="gru", core_size=8, n_envs=2, n_steps=8, batch_size=8), 3),
        (lambda: SAC("Pendulum-v1", n_envs=1), 3),
    ],
    ids=["ppo", "ppo-lstm", "ppo-gru", "sac"],
)
def test_predict_returns_the_action_and_the_state_for_every_policy(make, obs_dim):
    model = make()
    obs = np.random.default_rng(0).uniform(-0.05, 0.05, (3, obs_dim)).astype(np.float32)
    action, _ = model.predict(obs[0])
    actions, state = model.predict(obs, deterministic=True)
    one_by_one = np.stack([model.predict(o)[0] for o in obs])
    assert np.shape(action) == np.shape(actions)[1:] and len(actions) == 3
    np.testing.assert_allclose(actions, one_by_one, rtol=0, atol=1e-6)  # batched float sums may differ
    if model.recurrent:
        assert len(state) == (2 if model._trainer.cfg.core == "lstm" else 1)
        assert all(s.shape == (1, 3, 8) for s in state)  # [layers, B, hidden], as given back with the next call
        again, _ = model.predict(obs, state, episode_start=np.zeros(3, dtype=bool))
        assert again.shape == actions.shape
    else:
        assert state is None and model.predict(obs, state=None, episode_start=[True] * 3)[1] is None
    model.close()


def test_predict_refuses_what_is_neither_one_observation_nor_a_batch():
    model = PPO("CartPole-v1", **TINY)
    with pytest.raises(ConfigError, match=r"^observation of shape \(3,\) is not allowed: \(4,\) .* or \(n, 4\)"):
        model.predict(np.zeros(3, np.float32))
    with pytest.raises(ConfigError, match=r"observation of shape \(2, 2, 4\) is not allowed"):
        model.predict(np.zeros((2, 2, 4), np.float32))
    with pytest.raises(ConfigError, match=r"observation=\(obs, info\) is not allowed: pass obs alone"):
        model.predict((np.zeros(4, np.float32), {}))
    with pytest.raises(ConfigError, match=r"episode_start of shape \(3,\) is not allowed for 2 observation\(s\)"):
        model.predict(np.zeros((2, 4), np.float32), episode_start=[True] * 3)
    model.close()
    keyed = PPO("distrl_spaceenvs:DictSignEnv", **TINY)
    obs = {"image": np.zeros((2, 8, 8, 1), np.uint8), "sign": np.zeros(1, np.float32)}
    with pytest.raises(ConfigError, match=r"every key one observation, or every key a batch of the same size"):
        keyed.predict(obs)
    with pytest.raises(ConfigError, match=r"observation with keys \['image'\] is not allowed"):
        keyed.predict({"image": obs["image"]})
    keyed.close()
    recurrent = PPO(CUE, core="lstm", core_size=8, n_envs=2, n_steps=8, batch_size=8)
    _, state = recurrent.predict(np.zeros((2, 3), np.float32))
    with pytest.raises(ConfigError, match=r"state of shapes \[\(1, 2, 8\), \(1, 2, 8\)\] is not allowed for 3 obs"):
        recurrent.predict(np.zeros((3, 3), np.float32), state)
    recurrent.close()


def test_predict_carries_the_state_as_evaluation_and_the_player_do():
    model = PPO("Pendulum-v1", core="lstm", core_size=8, n_envs=2, n_steps=8, batch_size=8, seed=0).learn(32)
    T, N = 6, 2
    obs = np.random.default_rng(1).uniform(-1, 1, (T, N, 3)).astype(np.float32)
    starts = np.zeros((T, N), dtype=bool)
    starts[0] = True
    starts[3, 1] = True  # environment 1 begins a new episode at step 3
    state, carried, evaluated = None, [], []
    for t in range(T):
        actions, state = model.predict(obs[t], state, episode_start=starts[t])
        carried.append(actions)
        evaluated.append(model._trainer.act_for_eval(obs[t], starts[t]))  # what `distrl eval` does
    np.testing.assert_allclose(np.array(carried), np.array(evaluated), rtol=0, atol=1e-6)
    player = model.player()
    for n in range(N):
        played = []
        for t in range(T):
            if starts[t, n]:
                player.reset()
            played.append(player(obs[t, n]))
        np.testing.assert_allclose(np.array(played), np.array(carried)[:, n], rtol=0, atol=1e-6)
    # the state matters: without it, every step would be an episode's first
    stateless = np.array([model.predict(o)[0] for o in obs])
    assert np.abs(stateless[1:] - np.array(carried)[1:]).max() > 1e-4
    # episode_start restarts the state of the environments it marks, and only theirs
    _, state = model.predict(obs[0])
    restarted, _ = model.predict(obs[1], state, episode_start=[True, False])
    fresh, _ = model.predict(obs[1])
    kept, _ = model.predict(obs[1], state, episode_start=[False, False])
    np.testing.assert_allclose(restarted[0], fresh[0], rtol=0, atol=1e-6)
    np.testing.assert_allclose(restarted[1], kept[1], rtol=0, atol=1e-6)
    assert np.abs(kept[0] - fresh[0]).max() > 1e-4
    model.close()


def test_bf16_on_a_cpu_that_multiplies_slower_in_it_warns_from_the_constructor(monkeypatch):
    import warnings

    from distrl.training import precision

    monkeypatch.setattr(precision, "product_seconds", lambda: (250e-6, 776e-6))
    with pytest.warns(UserWarning, match="precision=bf16: on this CPU a 256x256 product took 776 us in bfloat16"):
        PPO("CartPole-v1", precision="bf16", n_envs=1, n_steps=32, batch_size=32)
    monkeypatch.setattr(precision, "product_seconds", lambda: (250e-6, 125e-6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        PPO("CartPole-v1", precision="bf16", n_envs=1, n_steps=32, batch_size=32)


def _layers(module) -> set[str]:
    return {type(m).__name__ for m in module.modules()}


def test_a_policy_name_before_the_env_chooses_the_network_for_its_observations():
    quadrant = "distrl_spaceenvs:QuadrantEnv"
    default = PPO(quadrant, **TINY)  # auto: a CNN for this 10x10 image
    flat = PPO("MlpPolicy", quadrant, **TINY)  # the MLPs flatten it, as named
    assert "SmallCNN" in _layers(default._trainer.agent.module.encoder)
    assert flat._trainer.cfg.encoder == "mlp" and _layers(flat._trainer.agent.module.encoder) == {"Flatten"}
    nature = PPO("CnnPolicy", quadrant, env_kwargs={"size": 36}, **TINY)
    assert type(nature._trainer.agent.module.encoder).__name__ == "NatureCNN"
    keyed = PPO("MultiInputPolicy", env="distrl_spaceenvs:DictSignEnv", **TINY)
    assert type(keyed._trainer.agent.module.encoder).__name__ == "DictEncoder"
    vector = PPO(policy="MlpPolicy", env="CartPole-v1", **TINY).learn(32)
    assert vector._trainer.cfg.encoder == "mlp" and vector.num_steps == 32
    dqn = DQN("CnnPolicy", quadrant, n_envs=1)
    assert "SmallCNN" in _layers(dqn._trainer.algo.q.module)
    sac = SAC("MlpPolicy", "Pendulum-v1")
    assert sac._trainer.cfg.encoder == "mlp"
    for model in (default, flat, nature, keyed, vector, dqn, sac):
        model.close()


@pytest.mark.parametrize(
    "args, kwargs, message",
    [
        (
            ("CnnPolicy", "CartPole-v1"),
            {},
            "policy='CnnPolicy' is not allowed for this env's Box observations (4,) float32: use 'MlpPolicy'",
        ),
        (
            ("MultiInputPolicy", "distrl_spaceenvs:QuadrantEnv"),
            {},
            "policy='MultiInputPolicy' is not allowed for this env's image observations (10, 10, 1) uint8: "
            "use 'CnnPolicy'",
        ),
        (
            ("MlpPolicy", "distrl_spaceenvs:DictSignEnv"),
            {},
            "policy='MlpPolicy' is not allowed for this env's Dict observations (keys image, sign): "
            "use 'MultiInputPolicy'",
        ),
        (
            ("MlpPolcy", "CartPole-v1"),
            {},
            "policy='MlpPolcy' is not allowed: must be one of MlpPolicy, CnnPolicy, MultiInputPolicy, "
            "followed by the env; did you mean MlpPolicy?",
        ),
        (
            ("CnnPolicy",),
            {},
            "env=None is not allowed: an env must follow policy='CnnPolicy', e.g. PPO('CnnPolicy', env)",
        ),
        (
            ("MlpPolicy", "distrl_spaceenvs:QuadrantEnv"),
            {"encoder": "nature"},
            "encoder='nature' is not allowed: must be mlp with 'MlpPolicy'; CnnPolicy takes the CNNs",
        ),
        (
            ("MlpPolicy", "CartPole-v1"),
            {"policy": "CnnPolicy"},
            "policy='CnnPolicy' is not allowed with 'MlpPolicy' before the env: name the policy once",
        ),
    ],
    ids=["cnn-on-vector", "multi-input-on-image", "mlp-on-dict", "misspelt", "no-env", "encoder", "twice"],
)
def test_a_policy_name_that_is_unknown_or_does_not_fit_is_refused_in_one_line(args, kwargs, message):
    with pytest.raises(ConfigError) as caught:
        PPO(*args, **kwargs, **TINY)
    assert str(caught.value) == message


def test_a_policy_name_refused_once_the_env_is_built_leaves_no_run_directory(tmp_path):
    with pytest.raises(ConfigError, match="policy='CnnPolicy' is not allowed for this env's Box observations"):
        PPO("CnnPolicy", "CartPole-v1", run_dir=str(tmp_path / "runs" / "a"), **TINY)
    assert not (tmp_path / "runs").exists()


def test_a_policy_name_fits_the_observation_of_an_env_whose_masks_distrl_adds():
    model = PPO("MlpPolicy", "distrl_maskenvs:MaskedChoiceEnv", **TINY)  # stored as Dict: observation + mask
    assert model._trainer.run.action_mask == "info"
    model.close()


def test_a_misspelt_string_alone_is_read_as_a_policy_name_only_when_it_is_no_env():
    with pytest.raises(ConfigError, match=r"^policy='CnnPolcy' is not allowed: .*; did you mean CnnPolicy\?$"):
        PPO("CnnPolcy")
    with pytest.raises(ConfigError, match=r"^env='CartPol-v1' is not a registered Gymnasium id"):
        PPO("CartPol-v1")


def test_learn_takes_total_timesteps_as_another_name_for_total_steps():
    model = PPO("CartPole-v1", **TINY)  # 32 steps per rollout
    assert model.learn(total_timesteps=64).num_steps == 64
    assert model.learn(total_steps=32).num_steps == 96
    with pytest.raises(ConfigError, match=r"^total_steps=32 is not allowed with total_timesteps=32: .* pass one$"):
        model.learn(32, total_timesteps=32)
    with pytest.raises(ConfigError, match=r"^total_steps is missing"):
        model.learn()
    assert model.num_steps == 96
    model.close()


def test_predict_takes_action_masks_as_another_name_for_action_mask():
    model = PPO("distrl_maskenvs:MaskedChoiceEnv", **TINY)
    obs = np.ones(6, np.float32)
    chosen, _ = model.predict(obs)
    mask = np.ones(6, np.int8)
    mask[chosen] = 0
    masked, _ = model.predict(obs, action_masks=mask)
    assert masked != chosen and mask[masked] == 1
    assert model.predict(obs, action_mask=mask)[0] == masked
    with pytest.raises(ConfigError, match=r"^action_masks= is not allowed with action_mask=: .* pass one$"):
        model.predict(obs, action_mask=mask, action_masks=mask)
    model.close()


@pytest.mark.parametrize(
    "make, message",
    [
        (
            lambda: PPO("CartPole-v1", n_step=64),
            "n_step=64 is not a PPOConfig or RunConfig field: did you mean n_steps?",
        ),
        (
            lambda: SAC("Pendulum-v1", learning_rat=1e-3),
            "learning_rat=0.001 is not a SACConfig or RunConfig field: did you mean learning_rate?",
        ),
        (
            lambda: DQN("CartPole-v1", devce="cpu"),
            "devce='cpu' is not a DQNConfig or RunConfig field: did you mean device?",
        ),
        (lambda: PPO("CartPole-v1", sed=1), "sed=1 is not a PPOConfig or RunConfig field: did you mean seed?"),
    ],
    ids=["algo-field", "sac", "run-field", "constructor"],
)
def test_a_misspelt_keyword_names_the_closest_one(make, message):
    with pytest.raises(ConfigError) as caught:
        make()
    assert str(caught.value) == message


def _readme_python_example() -> str:
    readme = (Path(__file__).parents[1] / "README.md").read_text()
    section = readme.split("\n## Python\n", 1)[1]
    return section.split("```python\n", 1)[1].split("\n```", 1)[0]


def test_the_readme_python_example_runs(monkeypatch, tmp_path):
    import distrl.api

    class ShortRolloutPPO(PPO):  # 64 steps a rollout over its 8 envs, not 16,384
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **{"n_steps": 8, **kwargs})

    learn = Model.learn
    monkeypatch.setattr(Model, "learn", lambda self, total_steps, progress_bar=False: learn(self, 64))
    monkeypatch.setattr(distrl.api, "PPO", ShortRolloutPPO)  # what `from distrl import PPO` gives
    monkeypatch.chdir(tmp_path)  # where it saves its model
    names: dict = {}
    exec(compile(_readme_python_example(), "README.md", "exec"), names)
    assert names["PPO"] is ShortRolloutPPO and names["model"].num_steps == 64
    assert names["action"] in (0, 1) and names["state"] is None
    assert (tmp_path / "cartpole-ppo").is_dir() and names["sac"].num_steps == 64
