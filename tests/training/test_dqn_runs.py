"""DQN runs end to end: it learns, resumes bit for bit, takes pixels, Dict observations and user networks, exports
and refuses what it cannot do in one line."""

import json

import numpy as np
import pytest
import torch

from distrl import DQN
from distrl.cli import main
from distrl.config import DQNConfig, RunConfig
from distrl.data.prioritized import PrioritizedReplay
from distrl.data.replay import CompactReplayBuffer
from distrl.run import checkpoint
from distrl.training import DQNTrainer
from settings import FAST_CARTPOLE


def test_dqn_learns_cartpole():
    # seeds 0-2 reached a 10-episode evaluation of 500 at 20-25k steps (6.5-8.2 s here)
    model = DQN("CartPole-v1", seed=0, eval_every=5000, target_return=475, **FAST_CARTPOLE).learn(30_000)
    mean, _ = model._trainer.last_eval
    model.close()
    assert mean >= 475


def _run(run_dir, **kw):
    values = dict(env="CartPole-v1", total_steps=640, seed=3, vec="sync", quiet=True, run_dir=str(run_dir))
    values.update(kw)
    return RunConfig(**values)


def _episodes(run_dir):
    return [tuple(line.split(",")[:2]) for line in (run_dir / "monitor.csv").read_text().splitlines()[2:]]


RESUMED = {
    # n-step transitions under way at the checkpoint, priorities, double and dueling Q, two envs
    "vector": (
        dict(env="CartPole-v1"),
        dict(n_envs=2, n_steps=3, prioritized_replay=True, double_q=True, dueling=True, net_arch=(16,)),
    ),
    # the module path on uint8 images kept once (the compact buffer), with priorities
    "pixels": (
        dict(env="distrl_spaceenvs:QuadrantEnv", env_kwargs=("size=6",)),
        dict(n_envs=2, optimize_memory_usage=True, prioritized_replay=True, net_arch=(), encoder="small"),
    ),
}


@pytest.mark.parametrize("case", list(RESUMED))
def test_an_interrupted_dqn_run_resumed_with_its_replay_is_bit_identical(tmp_path, case):
    env, extra = RESUMED[case]
    cfg = DQNConfig(
        learning_starts=64,
        batch_size=16,
        buffer_size=500,
        train_freq=4,
        target_update_interval=48,
        save_replay=True,
        **extra,
    )
    run = dict(checkpoint_every=256, total_steps=512, **env)
    full = DQNTrainer(_run(tmp_path / "full", **run), cfg, run_dir=tmp_path / "full")
    full.train()
    first = DQNTrainer(_run(tmp_path / "cut", **run), cfg, run_dir=tmp_path / "cut")
    first.train(stop_at=384)  # interrupted after its checkpoint at 256
    first.close()
    resumed = DQNTrainer(_run(tmp_path / "cut", **run), cfg, run_dir=tmp_path / "cut")
    resumed.load_checkpoint(checkpoint.find_latest(tmp_path / "cut"))
    assert resumed.steps == 256 and resumed.replay.size > 0  # the replay came back with the checkpoint
    resumed.train()
    assert resumed.steps == full.steps == 512
    assert torch.equal(resumed.algo.q.params.data, full.algo.q.params.data)
    assert torch.equal(resumed.algo.q_target.params.data, full.algo.q_target.params.data)
    assert isinstance(full.replay, PrioritizedReplay)
    np.testing.assert_array_equal(
        resumed.replay.sampler.state()["priorities"], full.replay.sampler.state()["priorities"]
    )
    assert _episodes(tmp_path / "cut") == _episodes(tmp_path / "full")
    if case == "pixels":  # frames stay uint8, each kept once
        buffer = full.replay.buffer
        assert isinstance(buffer, CompactReplayBuffer) and buffer.obs.dtype == np.uint8
    for t in (full, resumed):
        t.close()


def test_dqn_learns_from_pixels():
    # a contextual bandit over 10x10 images: naming the marker's quadrant earns 1 of 8 steps' 8; guessing earns 2
    run = RunConfig(env="distrl_spaceenvs:QuadrantEnv", total_steps=4000, seed=0, vec="sync", quiet=True)
    cfg = DQNConfig(
        n_envs=4,
        learning_starts=200,
        batch_size=32,
        buffer_size=4000,
        train_freq=2,
        gradient_steps=1,
        gamma=0.5,
        learning_rate=1e-3,
        target_update_interval=200,
        exploration_fraction=0.3,
        net_arch=(32,),
        encoder="small",
        optimize_memory_usage=True,
    )
    trainer = DQNTrainer(run, cfg)
    trainer.train()
    mean, _ = trainer.evaluate_now()
    trainer.close()
    assert mean >= 6.0


def test_dict_observations_and_a_users_encoder_act_and_export(tmp_path):
    model = DQN(
        "distrl_spaceenvs:DictSignEnv",
        n_envs=2,
        learning_starts=32,
        batch_size=16,
        buffer_size=200,
        net_arch=(8,),
        dueling=True,
    ).learn(128)
    obs, _ = model._trainer.env.env.reset(seed=0)
    actions, _ = model.predict(obs)
    assert actions.shape == (2,) and set(actions.tolist()) <= {0, 1, 2, 3}
    exported = model.export(tmp_path / "q.onnx")
    assert exported.check.mismatched == 0 and exported.check.observations > 0
    model.close()
    user = DQN("distrl_spaceenvs:QuadrantEnv", policy="distrl_spaceenvs:TinyEncoder", learning_starts=16, batch_size=8)
    user.learn(64)
    assert user._trainer.algo.q.module.encoder.features_dim == 16  # distrl's Q head on the user's encoder
    user.close()


def test_cli_trains_evaluates_and_exports_a_dqn_run(tmp_path, capsys):
    run_dir = tmp_path / "run"
    args = [
        "train",
        "dqn",
        "CartPole-v1",
        "--preset",
        "none",
        "--learning-starts",
        "100",
        "--batch-size",
        "16",
        "--net-arch",
        "16",
    ]
    assert (
        main([*args, "--total-steps", "400", "--double-q", "--n-steps", "3", "--quiet", "--run-dir", str(run_dir)]) == 0
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (
        summary["algo"] == "dqn" and summary["total_steps"] == 400 and summary["gradient_steps"] == 76
    )  # phases ending at steps 100, 104, ..., 400
    config = json.loads((run_dir / "config.json").read_text())
    assert config["dqn"]["double_q"] is True and config["dqn"]["n_steps"] == 3
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["episodes"] == 2
    assert main(["export", str(run_dir), "--format", "torchscript"]) == 0
    assert (run_dir / "export" / "policy.pt").exists()
    assert main(["export", str(run_dir), "--stochastic"]) == 2
    assert "stochastic" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["Pendulum-v1"], "has a Box action space; dqn needs Discrete"),
        (["CartPole-v1", "--gradient-steps", "0"], "gradient_steps=0 is not allowed"),
        (["CartPole-v1", "--n-steps", "3", "--optimize-memory-usage"], "optimize_memory_usage=True is not allowed"),
        (["CartPole-v1", "--buffer-size", str(10**12)], "buffer_size=1000000000000 is not allowed: must be at most"),
        (["CartPole-v1", "--strategy", "pipeline", "--workers", "2"], "strategy='pipeline' is not available for dqn"),
    ],
)
def test_bad_dqn_runs_are_one_line_errors(tmp_path, capsys, args, message):
    run_dir = tmp_path / "run"
    assert main(["train", "dqn", *args, "--run-dir", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert not run_dir.exists()
