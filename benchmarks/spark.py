"""What Spark costs as a ddp launcher: the same 2-rank run started locally and through TorchDistributor.

    python benchmarks/spark.py              # writes its section of docs/benchmarks.md
    python benchmarks/spark.py --repeats 1

Each configuration is one `distrl train ppo cartpole --strategy ddp --workers 2` command;
configurations alternate; medians. Wall = the whole command (Spark's JVM start-up included);
training = the ranks' own training time (summary.json); peak RSS = the largest sum of the
resident memory of the command's whole process tree (driver, JVM, torchrun, ranks), sampled
every 0.1 s.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from harness import alternating, markdown_table, write_section

STEPS = 51_200
BASE = ["train", "ppo", "CartPole-v1", "--strategy", "ddp", "--workers", "2", "--total-steps", str(STEPS), "--quiet"]
CONFIGS = {
    "local launcher": [],
    "Spark local[2], local_mode=True": ["--launcher", "spark", "--spark-master", "local[2]"],
    "Spark local[2], local_mode=False": ["--launcher", "spark", "--spark-master", "local[2]", "--no-spark-local-mode"],
}


def tree_rss(process: psutil.Process) -> int:
    total = 0
    for p in [process, *process.children(recursive=True)]:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total


def run_once(flags: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        start = time.perf_counter()
        proc = subprocess.Popen(
            [sys.executable, "-m", "distrl", *BASE, *flags, "--run-dir", str(run_dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        ps, peak = psutil.Process(proc.pid), 0
        while proc.poll() is None:
            peak = max(peak, tree_rss(ps))
            time.sleep(0.1)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            raise RuntimeError(proc.stderr.read().decode()[-2000:] if proc.stderr else "run failed")
        summary = json.loads((run_dir / "summary.json").read_text())
    return {
        "wall_s": wall,
        "train_s": summary["train_s"],
        "sps": summary["sps"],
        "peak_mb": peak / 2**20,
        "identical": summary["param_checksums"][0] == summary["param_checksums"][1],
        "checksum": summary["param_checksums"][0],
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    results: dict[str, list[dict]] = {name: [] for name in CONFIGS}
    for name in alternating(list(CONFIGS), args.repeats):
        r = run_once(CONFIGS[name])
        results[name].append(r)
        print(
            f"{name}: wall {r['wall_s']:.1f}s, training {r['train_s']:.1f}s, {r['sps']:,.0f} SPS, "
            f"peak {r['peak_mb']:.0f} MB",
            flush=True,
        )
    base = statistics.median(r["wall_s"] for r in results["local launcher"])
    rows = []
    for name, runs in results.items():
        wall = statistics.median(r["wall_s"] for r in runs)
        rows.append(
            [
                name,
                f"{wall:.1f}",
                f"{wall - base:+.1f}",
                f"{statistics.median(r['train_s'] for r in runs):.1f}",
                f"{statistics.median(r['sps'] for r in runs):,.0f}",
                f"{statistics.median(r['peak_mb'] for r in runs):,.0f}",
                "yes" if all(r["identical"] for r in runs) else "NO",
            ]
        )
    same = len({r["checksum"] for runs in results.values() for r in runs}) == 1
    body = "\n".join(
        [
            f"`python benchmarks/spark.py` — {time.strftime('%Y-%m-%d')}, 2-core machine, PPO CartPole-v1 preset, "
            f"2 ranks, {STEPS:,} steps, {args.repeats} runs per configuration, alternating, medians.",
            "",
            *markdown_table(
                [
                    "launcher",
                    "wall s",
                    "vs local launcher",
                    "training s",
                    "SPS",
                    "peak RSS, whole tree (MB)",
                    "ranks end identical",
                ],
                rows,
            ),
            "",
            "Final parameters are "
            + ("bit-identical across all launchers and runs" if same else "NOT identical across launchers")
            + " (same seed, same code path). "
            "Spark adds its JVM and TorchDistributor's torchrun start-up; training itself runs at the same speed.",
        ]
    )
    write_section("ddp launchers: local and Spark", body)


if __name__ == "__main__":
    main()
