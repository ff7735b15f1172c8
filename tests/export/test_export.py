"""``distrl export``: the exported graph acts as the policy does, for every kind of network distrl trains.

Each test checks the written file itself, outside the export's own check: observations from the env as a user
would get them, the file run with onnxruntime or ``torch.jit.load``, its actions compared with ``predict``.
"""

import json

import gymnasium as gym
import numpy as np
import onnxruntime
import pytest
import torch
from torch import nn

from distrl import PPO, REINFORCE, SAC
from distrl.cli import main
from distrl.config import ConfigError
from distrl.envs.spaces import DictLayout
from distrl.export import ExportFailed
from distrl.export.writer import TOLERANCE
from distrl.export.writer import write as write_export

pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.load` is deprecated:DeprecationWarning")


def observations(env_id: str, n: int, seed: int = 3, **kwargs) -> list:
    """``n`` observations of the env as it gives them, under random actions."""
    env = gym.make(env_id, **kwargs) if ":" not in env_id else _custom(env_id, **kwargs)
    env.action_space.seed(seed)
    obs, _ = env.reset(seed=seed)
    seen = []
    while len(seen) < n:
        seen.append(obs)
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()
    return seen


def _custom(name: str, **kwargs) -> gym.Env:
    import importlib

    module, _, cls = name.partition(":")
    return getattr(importlib.import_module(module), cls)(**kwargs)


def batch(seen: list):
    if isinstance(seen[0], dict):
        return {k: np.stack([np.asarray(o[k]) for o in seen]) for k in seen[0]}
    return np.stack(seen).astype(np.float32) if np.asarray(seen[0]).dtype == np.float64 else np.stack(seen)


def run_file(path, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The exported file run as a deployment runs it."""
    if str(path).endswith(".onnx"):
        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        assert [i.name for i in session.get_inputs()] == list(inputs)
        return session.run(None, inputs)
    out = torch.jit.load(str(path))(*(torch.from_numpy(v) for v in inputs.values()))
    return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]


def graph_inputs(obs) -> dict[str, np.ndarray]:
    if isinstance(obs, dict):
        return {f"obs.{k}": np.ascontiguousarray(v) for k, v in sorted(obs.items())}
    return {"obs": obs}


def assert_acts_as_predict(model, path, seen, stochastic=False):
    obs = batch(seen)
    if isinstance(obs, dict):  # the graph's inputs as distrl stores them: a Discrete key as int64
        obs = {k: v.astype(np.int64) if v.dtype.kind in "iu" and v.ndim == 1 else v for k, v in obs.items()}
    inputs = graph_inputs(obs)
    n = len(seen)
    if stochastic:
        inputs["noise"] = model._noise(np.random.default_rng(7), n)
        expected, _ = model.predict(obs, deterministic=False, rng=np.random.default_rng(7))
    else:
        expected, _ = model.predict(obs)
    (actions,) = run_file(path, inputs)
    assert actions.shape == np.asarray(expected).shape
    if actions.dtype == np.int64:
        np.testing.assert_array_equal(actions, expected)
    else:
        np.testing.assert_allclose(actions, expected, rtol=0, atol=TOLERANCE)
    return actions


@pytest.mark.parametrize("fmt", ["onnx", "torchscript"])
def test_a_discrete_mlp_exports_to_the_same_actions_with_its_metadata(tmp_path, fmt):
    model = PPO("CartPole-v1", seed=0, n_envs=4, n_steps=64, batch_size=128, n_epochs=2).learn(512)
    path = tmp_path / f"policy.{'onnx' if fmt == 'onnx' else 'pt'}"
    written = model.export(path, format=fmt)
    seen = observations("CartPole-v1", 300)
    actions = assert_acts_as_predict(model, path, seen)
    assert len(set(actions.tolist())) == 2  # both choices occur: a graph that always says 0 would fail
    meta = json.loads(written.metadata.read_text())
    assert written.metadata == tmp_path / f"{path.name}.json"
    assert meta["inputs"] == [{"name": "obs", "shape": ["batch", 4], "dtype": "float32"}]
    assert meta["outputs"] == [{"name": "action", "shape": ["batch"], "dtype": "int64"}]
    assert meta["action_space"] == {"type": "Discrete", "n": 2, "start": 0}
    assert meta["observation_space"]["high"][1] == "inf"  # strict JSON
    assert meta["algo"] == "ppo" and meta["steps"] == 512 and meta["format"] == fmt and meta["distrl_version"]
    assert meta["check"]["observations"] == 256 and meta["check"]["mismatched"] == 0
    assert written.check.mismatched == 0 and written.check.discrete
    assert not list(tmp_path.glob(".*tmp"))


def test_a_continuous_mlp_carries_its_normalisation_and_samples_from_the_noise_input(tmp_path):
    model = PPO("Pendulum-v1", seed=0, n_envs=4, n_steps=64, batch_size=128, normalize_obs=True).learn(1024)
    stats = model._trainer.obs_normalizer.stats
    assert np.abs(stats.mean).max() > 0.05  # statistics that change the actions when left out
    seen = observations("Pendulum-v1", 200)
    deterministic = model.export(tmp_path / "policy.onnx")
    assert_acts_as_predict(model, tmp_path / "policy.onnx", seen)
    assert "final statistics" in json.loads(deterministic.metadata.read_text())["normalisation"]
    assert deterministic.check.max_abs_diff < TOLERANCE and not deterministic.check.discrete

    stochastic = model.export(tmp_path / "sampled.onnx", stochastic=True)
    sampled = assert_acts_as_predict(model, tmp_path / "sampled.onnx", seen, stochastic=True)
    means, _ = model.predict(batch(seen))
    assert np.abs(sampled - means).max() > 0.1  # the noise input moves the actions
    assert [p["name"] for p in json.loads(stochastic.metadata.read_text())["inputs"]] == ["obs", "noise"]

    # without the statistics in the graph the actions would differ: the check sees it and keeps nothing
    graph = model._graph(False)
    graph.normalise = None
    with pytest.raises(ExportFailed, match=r"differs from the policy on \d+ of 64 observations"):
        write_export(graph, tmp_path / "bad.onnx", "onnx", model._trainer.env, model._actions, model._noise, 64, 1, {})
    assert not (tmp_path / "bad.onnx").exists() and not list(tmp_path.glob(".bad*"))


def test_sac_exports_its_squashed_mean_and_samples(tmp_path):
    model = SAC("Pendulum-v1", seed=0, learning_starts=64, batch_size=32, net_arch=(32, 32)).learn(128)
    seen = observations("Pendulum-v1", 100)
    model.export(tmp_path / "policy.pt", format="torchscript")
    actions = assert_acts_as_predict(model, tmp_path / "policy.pt", seen)
    assert np.abs(actions).max() <= 2.0 and actions.shape == (100, 1)
    model.export(tmp_path / "sampled.onnx", stochastic=True)
    assert_acts_as_predict(model, tmp_path / "sampled.onnx", seen, stochastic=True)


@pytest.mark.parametrize("env_kwargs", [{}, {"size": 36, "channels_first": True}], ids=["small-cnn", "nature-cnn"])
def test_a_cnn_exports_with_uint8_images_in(tmp_path, env_kwargs):
    encoder = "nature" if env_kwargs else "auto"
    model = PPO(
        "distrl_spaceenvs:QuadrantEnv",
        seed=0,
        n_envs=2,
        n_steps=16,
        batch_size=32,
        encoder=encoder,
        env_kwargs=env_kwargs,
    ).learn(32)
    written = model.export(tmp_path / "policy.onnx")
    assert json.loads(written.metadata.read_text())["inputs"][0]["dtype"] == "uint8"
    assert_acts_as_predict(
        model, tmp_path / "policy.onnx", observations("distrl_spaceenvs:QuadrantEnv", 64, **env_kwargs)
    )


def test_a_dict_observation_is_one_input_per_key_with_its_parts_normalised(tmp_path):
    model = PPO("distrl_spaceenvs:DictSignEnv", seed=0, n_envs=2, n_steps=16, batch_size=32, normalize_obs=True)
    model.learn(64)
    written = model.export(tmp_path / "policy.onnx")
    meta = json.loads(written.metadata.read_text())
    assert [(p["name"], p["dtype"]) for p in meta["inputs"]] == [("obs.image", "uint8"), ("obs.sign", "float32")]
    assert set(meta["observation_space"]["spaces"]) == {"image", "sign"}
    assert_acts_as_predict(model, tmp_path / "policy.onnx", observations("distrl_spaceenvs:DictSignEnv", 64))

    sac = SAC("distrl_spaceenvs:DictTargetEnv", seed=0, learning_starts=32, batch_size=16).learn(48)
    written = sac.export(tmp_path / "sac.pt", format="torchscript")
    assert [p["name"] for p in json.loads(written.metadata.read_text())["inputs"]] == ["obs.flip", "obs.x"]
    assert_acts_as_predict(sac, tmp_path / "sac.pt", observations("distrl_spaceenvs:DictTargetEnv", 64))


def test_a_user_module_is_traced_and_one_that_fixes_the_batch_size_fails_the_check(tmp_path):
    model = PPO("CartPole-v1", seed=0, n_envs=2, n_steps=16, batch_size=32, policy="distrl_spaceenvs:TinyEncoder")
    model.export(tmp_path / "encoder.onnx")
    assert_acts_as_predict(model, tmp_path / "encoder.onnx", observations("CartPole-v1", 50))
    # TinyNet reshapes with len(obs): traced, the batch size becomes a constant of the graph
    model = PPO("CartPole-v1", seed=0, n_envs=2, n_steps=16, batch_size=32, policy="distrl_spaceenvs:tiny_net")
    for fmt in ("onnx", "torchscript"):
        with pytest.raises(
            ExportFailed, match=r"fails on a batch of \d+ after being traced with a batch of 2 .*len\(obs\)"
        ):
            model.export(tmp_path / f"net.{fmt}", format=fmt)
        assert not list(tmp_path.glob("net.*")) and not list(tmp_path.glob(".net*"))


def test_a_multidiscrete_action_is_one_choice_per_part(tmp_path):
    model = PPO("distrl_spaceenvs:SignsEnv", seed=0, n_envs=2, n_steps=16, batch_size=32).learn(64)
    model.export(tmp_path / "policy.onnx")
    actions = assert_acts_as_predict(model, tmp_path / "policy.onnx", observations("distrl_spaceenvs:SignsEnv", 64))
    assert actions.shape == (64, 3)


def test_reinforce_exports_and_float64_observations_are_taken_as_float32(tmp_path):
    model = REINFORCE("Hopper-v5", seed=0, n_envs=2, episodes_per_iter=2).learn(200)
    written = model.export(tmp_path / "policy.onnx")
    assert json.loads(written.metadata.read_text())["inputs"][0] == {
        "name": "obs",
        "shape": ["batch", 11],
        "dtype": "float32",
    }
    assert_acts_as_predict(model, tmp_path / "policy.onnx", observations("Hopper-v5", 64))


@pytest.mark.parametrize(("env_id", "core", "fmt"), [("CartPole-v1", "lstm", "onnx"), ("Pendulum-v1", "gru", "pt")])
def test_a_recurrent_policy_takes_and_returns_its_state(tmp_path, env_id, core, fmt):
    model = PPO(env_id, seed=0, n_envs=2, n_steps=32, batch_size=32, core=core, core_size=16).learn(128)
    path = tmp_path / f"policy.{fmt}"
    written = model.export(path, format="onnx" if fmt == "onnx" else "torchscript")
    meta = json.loads(written.metadata.read_text())
    layers = 2 if core == "lstm" else 1
    assert [p["name"] for p in meta["inputs"]] == ["obs", *(f"state.{i}" for i in range(layers)), "episode_start"]
    assert [p["name"] for p in meta["outputs"]] == ["action", *(f"next_state.{i}" for i in range(layers))]
    # two environments stepped together, one starting a new episode half-way: the state carries and restarts
    seen = observations(env_id, 40)
    obs = np.stack([np.stack(seen[:20]), np.stack(seen[20:])], 1).astype(np.float32)  # [20, 2, ...]
    state, graph_state = None, [np.zeros((1, 2, 16), np.float32) for _ in range(layers)]
    differs = False
    for t in range(20):
        starts = np.array([t == 0, t in (0, 10)])
        expected, state = model.predict(obs[t], state, episode_start=starts)
        feeds = {"obs": obs[t], **{f"state.{i}": s for i, s in enumerate(graph_state)}}
        actions, *graph_state = run_file(path, {**feeds, "episode_start": starts.astype(np.float32)})
        if actions.dtype == np.int64:
            np.testing.assert_array_equal(actions, expected)
        else:
            np.testing.assert_allclose(actions, expected, rtol=0, atol=TOLERANCE)
        for mine, theirs in zip(graph_state, state):
            np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5)
        differs |= bool(np.abs(graph_state[0]).max() > 1e-3)
    assert differs  # a state that stayed zero would pass the comparisons without carrying anything


class PackedRowsEncoder(nn.Module):
    """A user's encoder that reads a Dict observation's packed rows itself."""

    def __init__(self, observation_space, action_space, config):
        super().__init__()
        self.layout = DictLayout(observation_space)
        self.features_dim = 8
        self.linear = nn.Linear(1, 8)

    def forward(self, obs):
        return self.linear(self.layout.unpack(obs)["sign"])


class CumulativeEncoder(nn.Module):
    """A user's encoder with an operation ONNX's opset 17 has no export for (cummax); TorchScript traces it."""

    def __init__(self, observation_space, action_space, config):
        super().__init__()
        self.features_dim = 8
        self.linear = nn.Linear(4, 8)

    def forward(self, obs):
        return torch.tanh(self.linear(obs.float().cummax(-1).values))


def test_a_module_onnx_cannot_take_fails_in_one_line_and_torchscript_takes_it(tmp_path, capsys):
    model = PPO("CartPole-v1", seed=0, n_envs=2, n_steps=16, batch_size=32, policy=CumulativeEncoder)
    with pytest.raises(
        ExportFailed, match=r"could not be traced to onnx \(UnsupportedOperatorError: .*cummax.*--format torchscript"
    ):
        model.export(tmp_path / "policy.onnx")
    assert not list(tmp_path.iterdir())
    model.export(tmp_path / "policy.pt", format="torchscript")
    assert_acts_as_predict(model, tmp_path / "policy.pt", observations("CartPole-v1", 50))


def test_a_module_that_reads_packed_rows_is_refused_in_one_line(tmp_path):
    model = PPO("distrl_spaceenvs:DictSignEnv", seed=0, n_envs=2, n_steps=16, batch_size=32, policy=PackedRowsEncoder)
    with pytest.raises(ConfigError, match="reads packed rows.*one input per key"):
        model.export(tmp_path / "policy.onnx")
    assert not (tmp_path / "policy.onnx").exists()


def test_the_command_writes_beside_the_run_and_refuses_bad_flags(tmp_path, capsys):
    run = tmp_path / "run"
    flags = ["--total-steps", "256", "--n-envs", "2", "--n-steps", "64", "--batch-size", "64", "--quiet"]
    assert main(["train", "ppo", "CartPole-v1", "--run-dir", str(run), *flags]) == 0
    capsys.readouterr()
    assert main(["export", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"wrote {run / 'export' / 'policy.onnx'} (onnx" in out
    assert "check: identical actions on 256 of 256 observations" in out
    assert main(["export", str(run), "--format", "torchscript", "--stochastic", "--observations", "32"]) == 0
    assert "on 32 of 32 observations" in capsys.readouterr().out
    assert (run / "export" / "policy-stochastic.pt").exists()
    assert main(["export", str(run), "--observations", "0"]) == 2
    assert "observations=0 is not allowed: must be > 0" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "nothing")]) == 2
    # a graph that does not act as the policy: status 1, one line, nothing written
    net = tmp_path / "net"
    assert (
        main(["train", "ppo", "CartPole-v1", "--run-dir", str(net), "--policy", "distrl_spaceenvs:tiny_net", *flags])
        == 0
    )
    capsys.readouterr()
    assert main(["export", str(net)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("distrl: error: the exported graph fails on a batch of")
    assert not (net / "export" / "policy.onnx").exists()
