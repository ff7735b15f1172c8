"""decoupled: the player's update equals single-process PPO; shards; weights reach the player."""

import json
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from distributed import run_ranks
from distrl.config import PPOConfig, RunConfig, StrategyConfig

pytestmark = pytest.mark.multiprocess

CFG = PPOConfig(n_envs=4, n_steps=16, batch_size=32, n_epochs=3, learning_rate=3e-3, normalize_obs=True)
RUN = RunConfig(env="CartPole-v1", seed=2, vec="sync", quiet=True, total_steps=3 * 64)


def decoupled_rank(rank, world, share, iterations, run=RUN, cfg=CFG):
    """Rank 0 plays ``iterations`` updates of ``run``; the others train. Returns the player's (version,
    checksum) history and final parameters, or a trainer's checksum history."""
    from distrl.strategies.ddp import checksum
    from distrl.strategies.decoupled import PlayerAlgo, run_trainer
    from distrl.strategies.dist_sync import DistributedSync
    from distrl.training import OnPolicyTrainer

    strategy = StrategyConfig(strategy="decoupled", workers=world, share_data=share, trainer_device="cpu")
    group = dist.new_group(list(range(1, world)))
    if rank > 0:
        return run_trainer(run, strategy, cfg, torch.device("cpu"), group)
    player = OnPolicyTrainer(run, cfg, strategy=strategy, update_factory=lambda algo: PlayerAlgo(algo, strategy, world))
    player.broadcast_state(DistributedSync(torch.device("cpu"), 30))
    history = []
    for _ in range(iterations):
        player.train(stop_at=player.steps + 1)
        history.append((player.policy_version, checksum(player.agent.params.data)))
    params = player.agent.params.data.clone()
    player.algo.stop()
    player.close()
    return history, params


@pytest.mark.parametrize("share", [True, False], ids=["share-data", "scatter"])
def test_player_weights_match_trainers_after_every_update(share):
    (history, params), *trainers = run_ranks(decoupled_rank, 3, share, 3)
    assert [v for v, _ in history] == [1, 2, 3]
    for trainer_history in trainers:
        assert trainer_history == [c for _, c in history]
    if share:  # the whole rollout on every trainer: exactly single-process PPO on it
        from distrl.training import OnPolicyTrainer

        single = OnPolicyTrainer(RUN, CFG)
        single.train()
        single.close()
        torch.testing.assert_close(params, single.agent.params.data, rtol=0, atol=1e-6)


def scatter_rows(rank, world):
    from distrl.data.packed import PackedBatch
    from distrl.strategies.decoupled import _receive_batch, _send_batch

    rows, columns = 12, PackedBatch.columns(())
    if rank == 0:
        obs = torch.arange(rows, dtype=torch.uint8)[:, None, None].repeat(1, 2, 3)  # uint8 images travel as uint8
        table = torch.arange(rows, dtype=torch.float32)[:, None].repeat(1, columns)
        _send_batch(PackedBatch(obs, table, (), True), share=False, trainers=world - 1)
        return None
    obs, data = _receive_batch(rows, (2, 3), torch.uint8, columns, share=False, trainers=world - 1)
    assert obs.dtype == torch.uint8 and torch.equal(obs[:, 1, 2].float(), data[:, 0])
    return data[:, 0].tolist()


def test_one_process_is_a_clear_error(tmp_path):
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "ppo",
            "CartPole-v1",
            "--strategy",
            "decoupled",
            "--workers",
            "1",
            "--run-dir",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert (
        "workers=1 is not allowed: must be >= 2 with --strategy decoupled; a player needs at least one trainer"
        in result.stderr
    )


@pytest.mark.heavy
def test_cli_decoupled_run_writes_the_run_dir(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "ppo",
            "CartPole-v1",
            "--strategy",
            "decoupled",
            "--workers",
            "3",
            "--total-steps",
            "4096",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 3 and summary["strategy"] == "decoupled" and summary["player_wait_s"] > 0
    assert (run_dir / "model" / "tensors.safetensors").exists()


@pytest.mark.slow
def test_decoupled_with_three_processes_solves_cartpole(tmp_path):
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "ppo",
            "CartPole-v1",
            "--strategy",
            "decoupled",
            "--workers",
            "3",
            "--share-data",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads((run_dir / "summary.json").read_text())["final_eval_mean_return"] >= 475
