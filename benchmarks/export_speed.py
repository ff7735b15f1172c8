"""Actions per second of an exported ONNX policy run with onnxruntime, against ``predict`` in Python.

    python benchmarks/export_speed.py                  # Atari CNN and MuJoCo MLP, batch 1 and 256, 3 repeats
    python benchmarks/export_speed.py --seconds 0.5 --repeats 1 --tasks mujoco   # a quick look

Two policies, untrained (speed does not depend on the weights): PPO's Nature CNN on Breakout's 4x84x84 uint8
frames, and PPO's 64x64 tanh MLP on Hopper-v5's 11 floats. Each is saved as a distrl checkpoint and exported with
``distrl export`` (``Model.export``). Every measurement runs in a fresh process: ``onnx`` imports onnxruntime and
numpy only (what a deployment without a training stack holds), ``distrl`` loads the checkpoint and calls
``model.predict`` on batches, and ``sb3`` (the reference) builds stable-baselines3's PPO with the same network
and calls its ``predict``. Observations are random, of the right shape and dtype; every library runs on one
thread (distrl's default for a run; onnxruntime's and torch's set to 1). The figure is actions per second over ``--seconds`` of calls after a warm-up,
the median of ``--repeats`` processes (alternating the order of libraries), with each process's peak RSS.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from harness import BENCHMARKS_MD, alternating, child_main, markdown_table, measure, median, write_section

TASKS = {"atari": ("ALE/Breakout-v5", (4, 84, 84), np.uint8, 4), "mujoco": ("Hopper-v5", (11,), np.float32, 3)}
"""task -> (env id, observation shape, dtype, actions: Discrete n or Box dimension)."""
LIBS = ("onnx", "distrl", "sb3")
RESULTS = Path(__file__).parents[1] / "docs" / "results" / "export" / "speed.json"


def observations(task: str, batch: int) -> np.ndarray:
    _, shape, dtype, _ = TASKS[task]
    rng = np.random.default_rng(0)
    if dtype == np.uint8:
        return rng.integers(0, 256, (batch, *shape), dtype=np.uint8)
    return rng.standard_normal((batch, *shape)).astype(np.float32)


def sb3_model(task: str):  # noqa: ANN201
    """stable-baselines3's PPO with distrl's network on an env of the task's spaces (only its policy is used)."""
    import gymnasium as gym
    from stable_baselines3 import PPO

    _, shape, dtype, actions = TASKS[task]

    class Spaces(gym.Env):
        observation_space = (
            gym.spaces.Box(0, 255, shape, np.uint8)
            if dtype == np.uint8
            else gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
        )
        action_space = gym.spaces.Discrete(actions) if dtype == np.uint8 else gym.spaces.Box(-1, 1, (actions,))

        def reset(self, *, seed=None, options=None):  # noqa: ANN001, ANN202
            return self.observation_space.sample(), {}

        def step(self, action):  # noqa: ANN001, ANN202
            return self.observation_space.sample(), 0.0, False, False, {}

    return PPO("CnnPolicy" if dtype == np.uint8 else "MlpPolicy", Spaces(), device="cpu")


def act_function(lib: str, task: str, path: str):  # noqa: ANN201
    """A function of a batch of observations returning actions, for one library."""
    if lib == "onnx":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = options.inter_op_num_threads = 1
        session = onnxruntime.InferenceSession(path + ".onnx", options, providers=["CPUExecutionProvider"])
        return lambda obs: session.run(None, {"obs": obs})[0]
    if lib == "distrl":
        from distrl import PPO

        model = PPO.load(path, device="cpu")
        return lambda obs: model.predict(obs, deterministic=True)[0]
    import torch

    torch.set_num_threads(1)
    model = sb3_model(task)
    return lambda obs: model.predict(obs, deterministic=True)[0]


def run(lib: str, task: str, seed: int, arg: str) -> dict:
    batch, seconds, path = arg.split(",", 2)
    act = act_function(lib, task, path)
    obs = observations(task, int(batch))
    for _ in range(10):
        act(obs)
    calls, start = 0, time.perf_counter()
    while (elapsed := time.perf_counter() - start) < float(seconds):
        act(obs)
        calls += 1
    return {"actions_per_s": calls * int(batch) / elapsed}


def prepare(task: str, directory: Path) -> str:
    """Save an untrained policy for ``task`` and export it, in a process of its own (a child inherits its
    parent's peak RSS across exec: the parent stays small); returns the checkpoint path, the export beside it."""
    path = directory / task
    code = (
        "from distrl import PPO\n"
        f"model = PPO({TASKS[task][0]!r}, seed=0, n_envs=1)\n"
        f"model.save({str(path)!r})\n"
        f"print(model.export({str(path) + '.onnx'!r}).check.line())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    print(f"{task}: {out.stdout.strip()}", flush=True)
    return str(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS))
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 256])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/ as it is")
    args = parser.parse_args()
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for task in args.tasks:
            path = prepare(task, Path(tmp))
            for batch in args.batches:
                key = f"{task} batch {batch}"
                values: dict[str, list] = {lib: [] for lib in LIBS}
                rss: dict[str, list] = {lib: [] for lib in LIBS}
                for i, lib in enumerate(alternating(list(LIBS), args.repeats)):
                    r = measure(__file__, lib, task, i // len(LIBS), f"{batch},{args.seconds},{path}")
                    values[lib].append(r["actions_per_s"])
                    rss[lib].append(r["max_rss_mb"])
                    print(
                        f"  {key} {lib:6s}: {r['actions_per_s']:,.0f} actions/s, {r['max_rss_mb']:.0f} MB", flush=True
                    )
                results[key] = {"actions_per_s": values, "max_rss_mb": rss}
    rows = []
    for key, r in results.items():
        a = {lib: median(r["actions_per_s"][lib]) for lib in LIBS}
        m = {lib: median(r["max_rss_mb"][lib]) for lib in LIBS}
        rows.append(
            [
                key,
                *(f"{a[lib]:,.0f}" for lib in LIBS),
                f"{a['onnx'] / a['distrl']:.2f}×",
                f"{a['distrl'] / a['sb3']:.2f}×",
                " / ".join(f"{m[lib]:.0f}" for lib in LIBS),
            ]
        )
    header = [
        "policy",
        "ONNX (onnxruntime) actions/s",
        "distrl predict",
        "SB3 predict",
        "ONNX / distrl",
        "distrl / SB3",
        "peak RSS MB: ONNX / distrl / SB3",
    ]
    table = "\n".join(markdown_table(header, rows))
    if args.no_write:
        print(table)
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({"seconds": args.seconds, "repeats": args.repeats, "results": results}, indent=2))
    body = (
        "`python benchmarks/export_speed.py`: an untrained PPO policy (Breakout's Nature CNN on 4x84x84 uint8 "
        "frames; Hopper-v5's 64x64 tanh MLP) exported with `distrl export --format onnx` and run with onnxruntime "
        "in a process that imports only onnxruntime and numpy, against `model.predict` of distrl and of "
        "stable-baselines3 (same network) in Python; random observations, one thread each, actions per second "
        f"over {args.seconds:g} s of calls, medians of {args.repeats} processes each. Raw figures: "
        f"[{RESULTS.relative_to(BENCHMARKS_MD.parent)}]({RESULTS.relative_to(BENCHMARKS_MD.parent)}).\n\n"
        f"{table}\n\n"
        "The exported graph is the policy alone, with no Python between calls; `predict` checks the observation "
        "and converts between numpy and torch on every call, and for a module policy (the CNN) binds the flat "
        "buffer's weights to the module (`torch.func.functional_call`). The ONNX process also holds no torch: "
        "its peak RSS is the deployment's footprint.\n"
    )
    write_section("distrl export: an ONNX policy against predict", body)


if __name__ == "__main__":
    if not child_main(run):
        sys.exit(main())
