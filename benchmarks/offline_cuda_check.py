"""The offline algorithms (BC, TD3+BC, IQL, CQL) and TD3 on a CUDA GPU, checked in one short run (nothing in the
test suite needs a GPU).

    python benchmarks/offline_cuda_check.py --out DIR [--d3rlpy]

1. The same updates on the GPU and on the CPU: each algorithm (BC and CQL on Box and Discrete actions) from the same
   weights, on the same batches, with the same noise (drawn on the CPU for both runs, then moved), for 1 and for 20
   gradient steps; the largest difference of any state tensor (weights, Adam's moments, targets), relative to that
   tensor's largest value. After 20 steps the same with ``--precision bf16``: bf16 on the GPU against float32 on the
   GPU (what rounding the products' operands moves) and against bf16 on the CPU (the same rounding on both).
2. Gradient steps per second at the papers' sizes (256 x 256, batch 256) on a Pendulum dataset of random play, on
   the GPU (float32 and bf16) and on one CPU thread of the same machine, as ``benchmarks/offline_vs_d3rlpy.py``
   times them; with ``--d3rlpy`` (d3rlpy importable) d3rlpy's updates on the GPU beside them. Each library keeps its
   own float32 matrix precision: distrl torch's default (``highest``); d3rlpy ``high`` (TensorFloat-32), which
   importing it sets for the whole process on a CUDA machine, so the script sets each before the library's run.
3. Command-line runs with ``--device cuda``: TD3 online, ``collect`` from it, the four offline algorithms on the
   collected dataset (and each again with ``--precision bf16``), TD3+BC under ddp (one rank, NCCL), SAC going on
   from the CQL run and IQL from the IQL run with the dataset kept; each one's summary.
4. IQL's and CQL's steps a second in float32 and in bf16 at wider networks and larger batches (``SIZES``, up to
   2,048 x 2,048 and batch 4,096), one process, 300 timed steps after 60.

Prints one line per check and writes ``DIR/offline_cuda_check.json``. Needs distrl importable (``PYTHONPATH=src``)
with gymnasium, minari, tyro, docstring-parser and typeguard; ``--d3rlpy`` also d3rlpy 2.8.1 with gym,
gym-notices, dataclasses-json, marshmallow and structlog. A machine that cannot reach PyPI takes them as wheels
installed with ``pip install --no-deps --target DIR``. The same-updates check asks torch for full float32 products;
``TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1`` in the environment would give TensorFloat-32 ones anyway (and the check would
measure those), while ``NVIDIA_TF32_OVERRIDE=0`` keeps NVIDIA's libraries off TensorFloat-32 whatever is asked.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))

import offline_vs_d3rlpy as bench  # noqa: E402 - the benchmark's dataset, settings and timed loops
from cuda_check import cli  # noqa: E402 - a distrl command in a subprocess, timed

SMALL = dict(net_arch=(64, 64), batch_size=128)


def cpu_noise() -> None:
    """Make every algorithm draw its noise from a CPU generator and move it to its device, so that a GPU run and a
    CPU run see the same numbers."""
    from distrl.algos import cql, learned, td3

    class CPUNoise(learned.BatchNoise):
        def __init__(self, device: torch.device):
            super().__init__(torch.device("cpu"))
            self.target = device

        def normal(self, *args: int | object) -> torch.Tensor:
            return super().normal(*args).to(self.target)

        def uniform(self, *args: int | object) -> torch.Tensor:
            return super().uniform(*args).to(self.target)

    td3.BatchNoise = cql.BatchNoise = CPUNoise  # the algorithms that draw noise within a step


def trained_state(
    algo: str, env_id: str, root: str, device: str, steps: int, precision: str = "fp32"
) -> dict[str, torch.Tensor]:
    from distrl import config
    from distrl.config import RunConfig
    from distrl.training import OfflineTrainer

    cfg = {"bc": config.BCConfig, "td3bc": config.TD3BCConfig, "iql": config.IQLConfig, "cql": config.CQLConfig}
    run = RunConfig(
        algo=algo, env=env_id, total_steps=steps, seed=0, quiet=True, device=device, eval_every=0, precision=precision
    )
    trainer = OfflineTrainer(run, cfg[algo](dataset=bench.DATASET_ID, datasets_dir=root, **SMALL))
    try:
        trainer.train()
        return {k: v.detach().float().cpu() for k, v in trainer.state_tensors().items() if v.is_floating_point()}
    finally:
        trainer.close()


def largest_difference(cpu: dict[str, torch.Tensor], gpu: dict[str, torch.Tensor]) -> tuple[float, str]:
    worst, name = 0.0, ""
    for key, value in cpu.items():
        scale = float(value.abs().max()) or 1.0
        rel = float((gpu[key] - value).abs().max()) / scale
        if rel > worst:
            worst, name = rel, key
    return worst, name


def same_updates(roots: dict[str, str], device: str, results: dict) -> None:
    cpu_noise()
    torch.set_float32_matmul_precision("highest")  # no TensorFloat-32, whatever the environment asks
    for algo, env_id in (
        ("bc", "Pendulum-v1"),
        ("bc", "CartPole-v1"),
        ("td3bc", "Pendulum-v1"),
        ("iql", "Pendulum-v1"),
        ("cql", "Pendulum-v1"),
        ("cql", "CartPole-v1"),
    ):
        name = f"same updates {algo} {env_id}"
        try:
            row = {}
            for steps in (1, 20):
                cpu = trained_state(algo, env_id, roots[env_id], "cpu", steps)
                gpu = trained_state(algo, env_id, roots[env_id], device, steps)
                assert cpu.keys() == gpu.keys()
                rel, where = largest_difference(cpu, gpu)
                row[f"after_{steps}"] = {"max_rel_diff": rel, "in": where, "tensors": len(cpu)}
            # bf16 products on the GPU: against float32 on the GPU (what rounding the operands costs) and against
            # bf16 on the CPU (the same rounding on both devices)
            gpu_bf16 = trained_state(algo, env_id, roots[env_id], device, 20, "bf16")
            cpu_bf16 = trained_state(algo, env_id, roots[env_id], "cpu", 20, "bf16")
            for key, (a, b) in {
                "bf16_vs_fp32_gpu_after_20": (gpu, gpu_bf16),
                "bf16_gpu_vs_cpu_after_20": (cpu_bf16, gpu_bf16),
            }.items():
                rel, where = largest_difference(a, b)
                row[key] = {"max_rel_diff": rel, "in": where}
            results[name] = row
        except Exception as exc:  # noqa: BLE001 - a check that breaks is a finding
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(name, results[name], flush=True)


def speeds(root: str, device: str, with_d3rlpy: bool, results: dict) -> None:
    for algo in ("bc", "td3bc", "iql", "cql"):
        row: dict = {}
        try:
            torch.set_float32_matmul_precision("highest")  # torch's default, which distrl keeps
            row[f"distrl_{device}"] = bench.run_distrl(algo, "Pendulum-v1", root, 0, 1000, 100, device=device)
            row[f"distrl_{device}_bf16"] = bench.run_distrl(
                algo, "Pendulum-v1", root, 0, 1000, 100, device=device, precision="bf16"
            )
            torch.set_num_threads(1)
            cpu_steps = 100 if algo == "cql" else 500
            row["distrl_cpu_1_thread"] = bench.run_distrl(algo, "Pendulum-v1", root, 0, cpu_steps, 20, device="cpu")
            torch.set_num_threads(os.cpu_count() or 1)
            if with_d3rlpy:
                torch.set_float32_matmul_precision("high")  # what importing d3rlpy sets on a CUDA machine
                row[f"d3rlpy_{device}"] = bench.run_d3rlpy(algo, root, 0, 1000, 100, device=f"{device}:0")
        except Exception as exc:  # noqa: BLE001
            row["error"] = f"{type(exc).__name__}: {exc}"
        results[f"steps/s {algo}"] = row
        print(f"steps/s {algo}", {k: round(v, 1) if isinstance(v, float) else v for k, v in row.items()}, flush=True)


SIZES = ((256, 256), (256, 4096), (1024, 1024), (2048, 4096))  # (hidden width, batch)


def bf16_sizes(root: str, device: str, results: dict, steps: int = 300) -> None:
    """IQL's and CQL's steps a second in float32 and in bf16 at wider networks and larger batches: where autocast's
    casts cost more than the faster products save, and where not."""
    from distrl import config
    from distrl.config import RunConfig
    from distrl.training import OfflineTrainer

    torch.set_float32_matmul_precision("highest")
    for algo, cfg in (("iql", config.IQLConfig), ("cql", config.CQLConfig)):
        for width, batch in SIZES:
            row: dict = {}
            for precision in ("fp32", "bf16"):
                run = RunConfig(
                    algo=algo, env="Pendulum-v1", total_steps=2 * steps, seed=0, quiet=True, device=device,
                    eval_every=0, precision=precision, preset="none",
                )  # fmt: skip
                algo_cfg = cfg(dataset=bench.DATASET_ID, datasets_dir=root, net_arch=(width, width), batch_size=batch)
                row[precision] = round(bench.timed_rate(OfflineTrainer(run, algo_cfg), steps, steps // 5), 1)
            name = f"bf16 steps/s {algo} width {width} batch {batch}"
            results[name] = {**row, "bf16_over_fp32": round(row["bf16"] / row["fp32"], 2)}
            print(name, results[name], flush=True)


def summary(run_dir: Path) -> dict:
    path = run_dir / "summary.json"
    if not path.exists():
        return {}
    s = json.loads(path.read_text())
    keys = ("total_steps", "sps", "train_s", "final_eval_mean_return", "final_mean_return")
    return {k: s[k] for k in keys if k in s}


def command_line(out: Path, device: str, results: dict) -> None:
    datasets = str(out / "datasets")
    small = ["--eval-episodes", "5", "--quiet", "--datasets-dir", datasets]
    cuda = ["--device", device]
    td3, cql, iql = out / "td3", out / "cql", out / "iql"
    runs = {
        "td3 online": [
            "train", "td3", "Pendulum-v1", *cuda, "--total-steps", "6000", "--learning-starts", "1000",
            "--run-dir", str(td3),
        ],
        "collect": ["collect", str(td3), "--steps", "20000", "--out", "pendulum/td3-v0", "--datasets-dir", datasets],
        **{
            f"{algo} offline": [
                "train", algo, "Pendulum-v1", "--dataset", "pendulum/td3-v0", *cuda, "--total-steps", "2000",
                "--run-dir", str(out / algo),
            ]
            for algo in ("bc", "td3bc", "iql", "cql")
        },
        "td3bc ddp nccl x1": [
            "train", "td3bc", "Pendulum-v1", "--dataset", "pendulum/td3-v0", *cuda, "--strategy", "ddp",
            "--workers", "1", "--timeout-s", "60", "--total-steps", "1000", "--run-dir", str(out / "td3bc-ddp"),
        ],
        "sac from cql": [
            "train", "sac", "Pendulum-v1", "--init-from", str(cql), "--keep-dataset", *cuda, "--total-steps", "2000",
            "--run-dir", str(out / "sac-from-cql"),
        ],
        "iql online from iql": [
            "train", "iql", "Pendulum-v1", "--init-from", str(iql), "--keep-dataset", "--dataset", "pendulum/td3-v0",
            *cuda, "--total-steps", "2000",
            "--run-dir", str(out / "iql-online"),
        ],
        **{
            f"{algo} offline bf16": [
                "train", algo, "Pendulum-v1", "--dataset", "pendulum/td3-v0", *cuda, "--precision", "bf16",
                "--total-steps", "2000", "--run-dir", str(out / f"{algo}-bf16"),
            ]
            for algo in ("bc", "td3bc", "iql", "cql")
        },
    }  # fmt: skip
    for name, args in runs.items():
        extra = small if args[0] == "train" else []
        if args[1] == "sac":  # it reads the dataset from the CQL run's config
            extra = extra[:-2]
        results[name] = cli([*args, *extra], timeout=180)
        if "--run-dir" in args:
            results[name].update(summary(Path(args[args.index("--run-dir") + 1])))
        print(name, results[name], flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="offline_cuda_check_out")
    parser.add_argument("--d3rlpy", action="store_true", help="time d3rlpy's updates on the GPU too")
    parser.add_argument("--device", default="cuda", help="cpu: try the script itself on a machine with no GPU")
    parser.add_argument(
        "--skip", nargs="*", default=[], choices=["same", "speed", "sizes", "cli"], help="parts to leave out"
    )
    args = parser.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "cpus": os.cpu_count(),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "tf32_environment": {k: v for k, v in os.environ.items() if "TF32" in k},
    }
    print(json.dumps(results), flush=True)
    roots = {env_id: str(out / "random" / env_id) for env_id in ("Pendulum-v1", "CartPole-v1")}
    for env_id, root in roots.items():
        results[f"dataset {env_id}"] = bench.make_dataset(env_id, 20_000, root)
    try:
        if "cli" not in args.skip:
            command_line(out, args.device, results)
        if "speed" not in args.skip:
            speeds(roots["Pendulum-v1"], args.device, args.d3rlpy, results)
        if "sizes" not in args.skip:
            bf16_sizes(roots["Pendulum-v1"], args.device, results)
        if "same" not in args.skip:  # last: it replaces the algorithms' noise for the rest of the process
            same_updates(roots, args.device, results)
    finally:
        (out / "offline_cuda_check.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
