"""distrl tune: the same study with one trial at a time and with two, wall time side by side.

Both studies run the same trials: every trial is sampled at random from the default PPO space with the
same sampler seed (--startup-trials covers the whole study), none is pruned, and each trains CartPole-v1 from
the library defaults (--preset none)
for the same budget with the same run seed. So the only difference is how many run at once. Also
reported: how busy the trials kept the cores (the trials' summed wall time over the study's) and what a
trial costs before it trains (a fresh Python process, torch's import, the env).

    python benchmarks/tune_parallel.py [--trials 8] [--budget 30000] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import alternating, markdown_table, median, write_section


def study(parallel: int, trials: int, budget: int, where: Path) -> dict:
    study_dir = where / f"p{parallel}-{time.monotonic_ns()}"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "distrl", "tune", "ppo", "CartPole-v1", "--trials", str(trials),
                    "--budget-steps", str(budget), "--parallel", str(parallel), "--startup-trials", str(trials),
                    "--pruner", "none", "--preset", "none", "--study-dir", str(study_dir), "--seed", "0"], check=True,
                   stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - start
    trial_wall, train = 0.0, 0.0
    params = []
    for run in sorted((study_dir / "trials").iterdir()):
        summary = json.loads((run / "summary.json").read_text())
        trial_wall += summary["wall_s"]
        train += summary["train_s"]
        params.append(json.loads((run / "preset.json").read_text()))
    shutil.rmtree(study_dir)
    return {"wall_s": wall, "trial_wall_s": trial_wall, "train_s": train, "params": params}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=8)
    parser.add_argument("--budget", type=int, default=30_000)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    results: dict[int, list[dict]] = {1: [], 2: []}
    with tempfile.TemporaryDirectory() as tmp:
        for parallel in alternating([1, 2], args.repeats):
            r = study(parallel, args.trials, args.budget, Path(tmp))
            results[parallel].append(r)
            print(f"  --parallel {parallel}: {r['wall_s']:.1f}s (trials' own wall time {r['trial_wall_s']:.1f}s)",
                  flush=True)
    same = all(r["params"] == results[1][0]["params"] for rs in results.values() for r in rs)
    rows = []
    for parallel, rs in results.items():
        wall = median([r["wall_s"] for r in rs])
        rows.append([f"--parallel {parallel}", f"{wall:.1f}", f"{median([r['trial_wall_s'] for r in rs]):.1f}",
                     f"{median([r['trial_wall_s'] / r['wall_s'] for r in rs]):.2f}",
                     f"{median([(r['wall_s'] * parallel - r['trial_wall_s']) / args.trials for r in rs]):.2f}"])
    speedup = median([r["wall_s"] for r in results[1]]) / median([r["wall_s"] for r in results[2]])
    body = "\n".join([
        f"`python benchmarks/tune_parallel.py --trials {args.trials} --budget {args.budget} --repeats {args.repeats}`: "
        f"a study of {args.trials} PPO trials on CartPole-v1, {args.budget:,} steps each, sampled at random from the "
        "default space with one seed (the same trials in every study"
        + ("" if same else " — NOT the case in this measurement") + "), no pruning. Medians of "
        f"{args.repeats} studies each, alternating.",
        "",
        *markdown_table(["", "study wall s", "trials' summed wall s", "cores kept busy",
                         "per-trial cost outside training, s"], rows),
        "",
        f"Two trials at a time finish the study **{speedup:.2f}x** faster than one. \"Cores kept busy\" is the trials' "
        "summed wall time over the study's; the last column is each trial's share of the study's core-seconds not "
        "spent inside its own run (its process start, imports and the study's bookkeeping).",
    ])
    write_section("distrl tune: trials in parallel", body)


if __name__ == "__main__":
    main()
