import dataclasses
import json
import os

import numpy as np
import pytest
import torch

from distrl.config import ConfigError, PPOConfig, RunConfig
from distrl.run import checkpoint
from distrl.run.logs import RunLogger
from distrl.training import OnPolicyTrainer

SMALL = PPOConfig(
    n_envs=4,
    n_steps=16,
    batch_size=32,
    n_epochs=2,
    learning_rate=1e-3,
    lr_schedule="linear",
    normalize_obs=True,
    normalize_reward=True,
)


def small_run(run_dir, **kw):
    values = dict(env="CartPole-v1", total_steps=640, seed=3, vec="sync", quiet=True, run_dir=str(run_dir))
    values.update(kw)
    return RunConfig(**values)


def test_save_load_round_trip_and_no_temp_files(tmp_path):
    tensors = {"a": torch.arange(5.0), "b": torch.ones(2, 3)}
    path = checkpoint.save(tmp_path / "ck", tensors, {"steps": 7, "rng": {"x": [1, 2]}})
    loaded, state = checkpoint.load(path)
    assert state["steps"] == 7 and state["rng"] == {"x": [1, 2]}
    torch.testing.assert_close(loaded["b"], tensors["b"])
    checkpoint.save(tmp_path / "ck", tensors, {"steps": 8})  # overwrite in place
    assert sorted(os.listdir(tmp_path)) == ["ck"]
    assert checkpoint.load(path)[1]["steps"] == 8


def test_missing_truncated_and_foreign_checkpoints_are_clear_errors(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        checkpoint.load(tmp_path / "nope")
    path = checkpoint.save(tmp_path / "ck", {"a": torch.zeros(1000)}, {"steps": 1})
    data = (path / checkpoint.TENSORS).read_bytes()
    (path / checkpoint.TENSORS).write_bytes(data[: len(data) // 2])
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        checkpoint.load(path)
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / checkpoint.STATE).write_text(json.dumps({"format": "something-else"}))
    (foreign / checkpoint.TENSORS).write_bytes(b"\x00" * 16)
    with pytest.raises(ConfigError, match="not a distrl checkpoint"):
        checkpoint.load(foreign)
    (foreign / checkpoint.STATE).write_text('{"format": "distrl-checkp')
    with pytest.raises(ConfigError, match="truncated or corrupt"):
        checkpoint.load(foreign)


def test_trainer_checkpoint_restores_params_optimizer_and_normalizers(tmp_path):
    trainer = OnPolicyTrainer(small_run(tmp_path / "a", total_steps=256), SMALL, run_dir=tmp_path / "a")
    trainer.train()
    path = trainer.save_checkpoint(tmp_path / "ck")
    other = OnPolicyTrainer(small_run(tmp_path / "b", total_steps=256, seed=99), SMALL, run_dir=None)
    other.load_checkpoint(path)
    torch.testing.assert_close(other.agent.params.data, trainer.agent.params.data, rtol=0, atol=0)
    torch.testing.assert_close(other.algo.optimizer.exp_avg_sq, trainer.algo.optimizer.exp_avg_sq, rtol=0, atol=0)
    assert other.obs_normalizer.stats.count == trainer.obs_normalizer.stats.count
    assert (other.obs_normalizer.stats.mean == trainer.obs_normalizer.stats.mean).all()
    assert other.reward_scaler.stats.var == trainer.reward_scaler.stats.var
    assert other.steps == trainer.steps == 256
    trainer.close()
    other.close()


def test_interrupted_and_resumed_run_is_bit_identical(tmp_path):
    full = OnPolicyTrainer(small_run(tmp_path / "full", checkpoint_every=192), SMALL, run_dir=tmp_path / "full")
    full.train()
    first = OnPolicyTrainer(small_run(tmp_path / "cut", checkpoint_every=192), SMALL, run_dir=tmp_path / "cut")
    first.train(stop_at=384)  # "interrupted" right after its second checkpoint
    first.close()
    latest = checkpoint.find_latest(tmp_path / "cut")
    assert latest.name == f"step-{384:012d}"
    resumed = OnPolicyTrainer(small_run(tmp_path / "cut", checkpoint_every=192), SMALL, run_dir=tmp_path / "cut")
    resumed.load_checkpoint(latest)
    resumed.train()
    assert resumed.steps == full.steps == 640
    assert torch.equal(resumed.agent.params.data, full.agent.params.data)
    assert torch.equal(resumed.algo.optimizer.exp_avg, full.algo.optimizer.exp_avg)
    # and the check can fail: a different seed gives different parameters
    other = OnPolicyTrainer(small_run(tmp_path / "other", seed=4, total_steps=128), SMALL, run_dir=None)
    other.train()
    assert not torch.equal(other.agent.params.data, full.agent.params.data)
    for t in (full, resumed, other):
        t.close()


def _episodes(run_dir):
    """A Monitor file's (return, length) rows, without the wall-clock column."""
    return [tuple(line.split(",")[:2]) for line in (run_dir / "monitor.csv").read_text().splitlines()[2:]]


def test_resumed_run_logs_each_episode_once(tmp_path):
    full = OnPolicyTrainer(small_run(tmp_path / "full", checkpoint_every=192), SMALL, run_dir=tmp_path / "full")
    full.train()
    full.close()
    first = OnPolicyTrainer(small_run(tmp_path / "cut", checkpoint_every=192), SMALL, run_dir=tmp_path / "cut")
    first.train(stop_at=512)  # dies 128 steps after its last checkpoint, at 384: those episodes come again
    first.close()
    latest = checkpoint.find_latest(tmp_path / "cut")
    seen = json.loads((latest / checkpoint.STATE).read_text())["episodes"]
    assert seen < first.episodes == len(_episodes(tmp_path / "cut"))
    resumed = OnPolicyTrainer(small_run(tmp_path / "cut", checkpoint_every=192), SMALL, run_dir=tmp_path / "cut")
    resumed.load_checkpoint(latest)
    assert len(_episodes(tmp_path / "cut")) == seen
    before = [float(r) for r, _ in _episodes(tmp_path / "full")[:seen]]
    assert resumed.logger.mean_return == pytest.approx(np.mean(before[-100:]))
    assert resumed.wall_before == json.loads((latest / checkpoint.STATE).read_text())["wall_s"] > 0
    resumed.train()
    summary = resumed.finish(wall_s=0.5)
    # the first process's time counts too, and so does the final evaluation after training
    assert summary["wall_s"] - (resumed.wall_before + 0.5) >= summary["final_eval_s"] > 0
    assert resumed.episodes == full.episodes
    assert _episodes(tmp_path / "cut") == _episodes(tmp_path / "full")


def test_rewind_cuts_every_workers_monitor_file_to_the_checkpoint(tmp_path):
    logger = RunLogger(tmp_path, "CartPole-v1")
    logger.episodes([1.0, 2.0], [1, 2], step=10, rank=0)
    logger.episodes([3.0], [3], step=10, rank=1)
    rows = logger.monitor_rows()
    assert rows == {"monitor.csv": 3, "ranks/rank-0.monitor.csv": 2, "ranks/rank-1.monitor.csv": 1}
    logger.episodes([4.0], [4], step=20, rank=1)
    logger.rewind(rows)
    logger.episodes([5.0], [5], step=20, rank=1)
    logger.close()
    assert [r for r, _ in _episodes(tmp_path)] == ["1", "2", "3", "5"]
    rank1 = (tmp_path / "ranks" / "rank-1.monitor.csv").read_text().splitlines()[2:]
    assert [line.split(",")[0] for line in rank1] == ["3", "5"]
    assert logger.mean_return == pytest.approx(np.mean([1.0, 2.0, 3.0, 5.0]))


@pytest.mark.parametrize("kind", ["cnn", "lstm"])
def test_a_module_run_interrupted_and_resumed_is_bit_identical(tmp_path, kind):
    # the module path (a CNN on uint8 images, values and log-probs recorded while acting) resumes exactly; so does
    # a recurrent policy, whose states restart with the episodes at the checkpoint boundary
    cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=2, learning_rate=1e-3, net_arch=())
    pixels = dict(env="distrl_spaceenvs:QuadrantEnv", env_kwargs=("size=6",), checkpoint_every=64, total_steps=160)
    if kind == "lstm":
        cfg = dataclasses.replace(cfg, core="lstm", core_size=8)
        pixels = dict(env="distrl_memoryenvs:CueEnv", checkpoint_every=64, total_steps=160)
    full = OnPolicyTrainer(small_run(tmp_path / "full", **pixels), cfg, run_dir=tmp_path / "full")
    full.train()
    first = OnPolicyTrainer(small_run(tmp_path / "cut", **pixels), cfg, run_dir=tmp_path / "cut")
    first.train(stop_at=96)  # interrupted 32 steps after its checkpoint
    first.close()
    resumed = OnPolicyTrainer(small_run(tmp_path / "cut", **pixels), cfg, run_dir=tmp_path / "cut")
    resumed.load_checkpoint(checkpoint.find_latest(tmp_path / "cut"))
    assert resumed.steps == 64
    resumed.train()
    assert resumed.steps == full.steps == 160
    assert torch.equal(resumed.agent.params.data, full.agent.params.data)
    assert _episodes(tmp_path / "cut") == _episodes(tmp_path / "full")
    for t in (full, resumed):
        t.close()
