"""Multi-node ddp on one machine, as torch's own tests do it: two torchrun agents (one per "node") meet
through c10d rendezvous on 127.0.0.1, and the run they make equals the single-process run on the same
environments."""

import json
import subprocess
import sys

import pytest
import torch

from distributed import free_port
from distrl.run import checkpoint

pytestmark = pytest.mark.multiprocess


def two_nodes(args: list[str], timeout: float = 300) -> list[subprocess.CompletedProcess]:
    """``python -m distrl ARGS`` under two torchrun agents, --node-rank 0 and 1, one process each."""
    port = free_port()
    agents = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "torch.distributed.run",
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--node-rank",
                str(rank),
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-id",
                "distrl-test",
                "--max-restarts",
                "0",
                "-m",
                "distrl",
                *args,
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in (0, 1)
    ]
    done = []
    for agent in agents:
        out, err = agent.communicate(timeout=timeout)
        done.append(subprocess.CompletedProcess(agent.args, agent.returncode, out, err))
    return done


def params(run_dir) -> torch.Tensor:
    tensors, _ = checkpoint.load(run_dir / checkpoint.MODEL_DIR)
    return torch.cat([t.flatten().double() for _, t in sorted(tensors.items()) if t.is_floating_point()])


@pytest.mark.heavy  # torchrun's launch and ddp equal to one process are the default run's (test_launch, test_ddp)
def test_ppo_on_two_torchrun_nodes_equals_single_process(tmp_path):
    shared = [
        "--vec",
        "sync",
        "--seed",
        "5",
        "--n-steps",
        "16",
        "--n-epochs",
        "3",
        "--learning-rate",
        "3e-3",
        "--normalize-obs",
        "--quiet",
    ]
    run = tmp_path / "nodes"
    agents = two_nodes(
        [
            "train",
            "ppo",
            "CartPole-v1",
            "--strategy",
            "ddp",
            "--workers",
            "2",
            "--n-envs",
            "4",
            "--batch-size",
            "64",
            "--total-steps",
            "512",
            *shared,
            "--run-dir",
            str(run),
        ]
    )
    assert all(a.returncode == 0 for a in agents), [a.stderr[-2000:] for a in agents]
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["workers"] == 2 and summary["total_steps"] == 512 and summary["iterations"] == 4
    )  # 4 updates of 2 x 64 steps
    assert len(set(summary["param_checksums"])) == 1  # both nodes' replicas end identical
    single = tmp_path / "single"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "ppo",
            "CartPole-v1",
            "--n-envs",
            "8",
            "--batch-size",
            "128",
            "--total-steps",
            "512",
            *shared,
            "--run-dir",
            str(single),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    torch.testing.assert_close(params(run), params(single), rtol=0, atol=2e-5)


@pytest.mark.heavy
def test_sac_on_two_torchrun_nodes_trains_identical_replicas(tmp_path):
    run = tmp_path / "nodes"
    agents = two_nodes(
        [
            "train",
            "sac",
            "Pendulum-v1",
            "--strategy",
            "ddp",
            "--workers",
            "2",
            "--total-steps",
            "600",
            "--learning-starts",
            "200",
            "--batch-size",
            "32",
            "--net-arch",
            "32",
            "32",
            "--quiet",
            "--run-dir",
            str(run),
        ]
    )
    assert all(a.returncode == 0 for a in agents), [a.stderr[-2000:] for a in agents]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["total_steps"] == 600
    assert len(summary["param_checksums"]) == 2 and len(set(summary["param_checksums"])) == 1
