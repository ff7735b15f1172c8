"""What distrl does on a CUDA GPU, checked in one short run (nothing in the test suite needs a GPU).

    python benchmarks/cuda_check.py --out DIR

1. One PPO minibatch gradient (the fused loss, then the plain loss through autograd, into the closed-form MLPs;
   the LSTM module path; the module path under bf16 autocast) on the GPU against the CPU, same weights, same data.
2. Command-line runs with ``--device cuda``: PPO on CartPole (closed form, then an LSTM core in bf16), SAC on
   Pendulum, PPO under ddp with NCCL (one rank, then two ranks sharing the one GPU), GRPO on a tiny language
   model in bf16; each one's summary (steps/s, final return) beside the same run on the CPU where it is cheap.

Prints one line per check and writes ``DIR/cuda_check.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
import torch

HERE = Path(__file__).parent
TESTS = HERE.parent / "tests"


def minibatch_gradient(device: str, core: str, precision: str, seed: int = 0, fused: bool = True) -> torch.Tensor:
    """The flat gradient of one PPO minibatch on ``device`` (same weights and data for every device); ``fused``:
    PPO's loss in closed form (the default), else the plain loss through autograd."""
    from distrl.algos.ppo import PPOAlgo
    from distrl.config import PPOConfig
    from distrl.data.packed import PackedBatch
    from distrl.data.rollout import Sequences
    from distrl.nets import make_agent

    env = gym.make("CartPole-v1")
    cfg = PPOConfig(core=core, n_steps=16, n_envs=4, batch_size=64, fused_loss=fused)
    agent = make_agent(env.observation_space, env.action_space, cfg, device, seed, precision=precision)
    algo = PPOAlgo(cfg, agent, seed)
    g = torch.Generator().manual_seed(seed)
    rows = 64
    obs = torch.randn(rows, 4, generator=g)
    data = torch.cat(
        [torch.randint(0, 2, (rows, 1), generator=g).float(), torch.randn(rows, 4, generator=g), torch.ones(rows, 1)], 1
    )
    data[:, 1] -= 1.0  # old log-probs below 0
    sequences = None
    if core != "none":
        T, N = 16, 4
        starts = torch.zeros(T, N)
        starts[0] = 1.0
        state = agent.initial_state(N)
        sequences = Sequences(starts.to(device), state)
    packed = PackedBatch(obs.to(device), data.to(device), (), True, sequences)
    algo._minibatch_gradient(packed.all_rows(), 0.2, sequences)
    return agent.params.grad.detach().float().cpu().clone()


def cli(args: list[str], timeout: int) -> dict:
    start = time.perf_counter()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]))
    try:
        done = subprocess.run(
            [sys.executable, "-m", "distrl", *args], capture_output=True, text=True, timeout=timeout, env=env
        )
        code, err = done.returncode, done.stderr.strip().splitlines()[-3:]
    except subprocess.TimeoutExpired:
        code, err = None, [f"timed out after {timeout} s"]
    return {"rc": code, "wall_s": round(time.perf_counter() - start, 1), "stderr_tail": err}


def summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    if not path.exists():
        return {}
    s = json.loads(path.read_text())
    keys = ("sps", "steps_per_s", "eval_mean_return", "mean_return", "final_eval_mean", "train_s", "wall_s")
    return {k: s[k] for k in keys if k in s} or {k: s[k] for k in list(s)[:8]}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="cuda_check_out")
    out = Path(parser.parse_args().out)
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "bf16": torch.cuda.is_available() and torch.cuda.is_bf16_supported(),
    }
    print(json.dumps(results), flush=True)

    for core, precision, fused in (
        ("none", "fp32", True),
        ("none", "fp32", False),
        ("lstm", "fp32", True),
        ("lstm", "bf16", True),
    ):
        name = f"gradient {core} {precision}" + ("" if fused else " plain loss")
        try:
            cpu = minibatch_gradient("cpu", core, "fp32")  # the fused loss on the CPU: the reference for both
            gpu = minibatch_gradient("cuda", core, precision, fused=fused)
            rel = float((gpu - cpu).abs().max() / cpu.abs().max())
            results[name] = {
                "max_rel_diff_vs_cpu_fp32": rel,
                "norm_cpu": float(cpu.norm()),
                "norm_gpu": float(gpu.norm()),
            }
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a finding
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, results[name], flush=True)

    try:
        import numpy as np

        from distrl import PPO

        model = PPO("CartPole-v1", core="lstm", device="cuda", n_envs=2, n_steps=32, batch_size=64).learn(256)
        obs = np.zeros((2, 4), np.float32)
        action, state = model.predict(obs)
        again, state = model.predict(obs, state=state, episode_start=np.array([True, False]))
        results["predict lstm cuda"] = {"actions": action.tolist(), "state_shapes": [list(s.shape) for s in state]}
        model.close()
    except Exception as exc:  # noqa: BLE001
        results["predict lstm cuda"] = {"error": f"{type(exc).__name__}: {exc}"}
    print("predict lstm cuda", results["predict lstm cuda"], flush=True)

    small = ["--eval-episodes", "5", "--quiet"]
    runs = {
        "ppo cartpole cuda": ["train", "ppo", "CartPole-v1", "--device", "cuda", "--total-steps", "50000", *small],
        "ppo cartpole cpu": ["train", "ppo", "CartPole-v1", "--device", "cpu", "--total-steps", "50000", *small],
        "ppo lstm bf16 cuda": [
            "train", "ppo", "CartPole-v1", "--device", "cuda", "--core", "lstm", "--precision", "bf16",
            "--total-steps", "8192", *small,
        ],
        "reinforce cartpole cuda": [
            "train", "reinforce", "CartPole-v1", "--device", "cuda", "--total-steps", "8192", *small,
        ],
        "sac pendulum cuda": ["train", "sac", "Pendulum-v1", "--device", "cuda", "--total-steps", "3000", *small],
        "ddp nccl x1 cuda": [
            "train", "ppo", "CartPole-v1", "--device", "cuda", "--strategy", "ddp", "--workers", "1",
            "--total-steps", "8192", "--timeout-s", "60", *small,
        ],
        "ddp nccl x2 one gpu": [
            "train", "ppo", "CartPole-v1", "--device", "cuda", "--strategy", "ddp", "--workers", "2",  # refused
            "--total-steps", "8192", "--timeout-s", "60", *small,
        ],
    }  # fmt: skip
    for name, args in runs.items():
        run_dir = out / name.replace(" ", "_")
        results[name] = {**cli([*args, "--run-dir", str(run_dir)], timeout=180), **summary(run_dir)}
        print(name, results[name], flush=True)

    try:
        sys.path.insert(0, str(TESTS))
        from distrl_lm import make_model, write_reversal

        model = make_model(out / "tiny_lm")
        data = out / "reversal.jsonl"
        write_reversal(data, lines=200)
        run_dir = out / "grpo_bf16_cuda"
        args = ["train", "grpo", "--model", str(model), "--dataset", str(data), "--reward", "distrl_lm:reversal"]
        args += [
            "--device",
            "cuda",
            "--precision",
            "bf16",
            "--learner-steps",
            "20",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ]
        results["grpo tiny lm bf16 cuda"] = {**cli(args, timeout=180), **summary(run_dir)}
    except Exception as exc:  # noqa: BLE001
        results["grpo tiny lm bf16 cuda"] = {"error": f"{type(exc).__name__}: {exc}"}
    print("grpo tiny lm bf16 cuda", results["grpo tiny lm bf16 cuda"], flush=True)

    (out / "cuda_check.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
