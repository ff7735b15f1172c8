"""distrl tune: the same study with one trial at a time and with two, wall time side by side.

Both studies run the same trials: every trial is sampled at random from the default PPO space with the
same sampler seed (--startup-trials covers the whole study), none is pruned, and each trains CartPole-v1 from
the library defaults (--preset none)
for the same budget with the same run seed. So the only difference is how many run at once. Also
reported: how busy the trials kept the cores (the trials' summed wall time over the study's) and what a
trial costs before it trains (a fresh Python process, torch's import, the env).

    python benchmarks/tune_parallel.py [--trials 8] [--budgets 20000,100000] [--repeats 2]
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
    subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "tune",
            "ppo",
            "CartPole-v1",
            "--trials",
            str(trials),
            "--budget-steps",
            str(budget),
            "--parallel",
            str(parallel),
            "--startup-trials",
            str(trials),
            "--pruner",
            "none",
            "--preset",
            "none",
            "--study-dir",
            str(study_dir),
            "--seed",
            "0",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
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
    parser.add_argument("--budgets", default="20000,100000")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    budgets = [int(b) for b in args.budgets.split(",")]
    rows, speedups, same = [], {}, True
    with tempfile.TemporaryDirectory() as tmp:
        for budget in budgets:
            results: dict[int, list[dict]] = {1: [], 2: []}
            for parallel in alternating([1, 2], args.repeats):
                r = study(parallel, args.trials, budget, Path(tmp))
                results[parallel].append(r)
                print(
                    f"  {budget:,} steps, --parallel {parallel}: {r['wall_s']:.1f}s (trials' own wall time "
                    f"{r['trial_wall_s']:.1f}s)",
                    flush=True,
                )
            same &= all(r["params"] == results[1][0]["params"] for rs in results.values() for r in rs)
            for parallel, rs in results.items():
                rows.append(
                    [
                        f"{budget:,}",
                        str(parallel),
                        f"{median([r['wall_s'] for r in rs]):.1f}",
                        f"{median([r['trial_wall_s'] for r in rs]):.1f}",
                        f"{median([r['trial_wall_s'] / r['wall_s'] for r in rs]):.2f}",
                        f"{median([(r['wall_s'] * parallel - r['trial_wall_s']) / args.trials for r in rs]):.2f}",
                    ]
                )
            speedups[budget] = median([r["wall_s"] for r in results[1]]) / median([r["wall_s"] for r in results[2]])
    body = "\n".join(
        [
            f"`python benchmarks/tune_parallel.py --trials {args.trials} --budgets {args.budgets} "
            f"--repeats {args.repeats}`: "
            f"a study of {args.trials} PPO trials on CartPole-v1, sampled at random from the default space with one seed "
            "(the same trials in every study of a budget"
            + ("" if same else " — NOT the case in this measurement")
            + "), no pruning, library defaults otherwise. Medians of "
            f"{args.repeats} studies each, alternating.",
            "",
            *markdown_table(
                [
                    "steps per trial",
                    "--parallel",
                    "study wall s",
                    "trials' summed wall s",
                    "trials running, mean",
                    "per-trial core-s outside its run",
                ],
                rows,
            ),
            "",
            "Two trials at a time finish the study "
            + ", ".join(f"**{v:.2f}x** faster at {b:,} steps a trial" for b, v in speedups.items())
            + " than one. "
            "\"Trials running, mean\" is the trials' summed wall time over the study's; the last column is each trial's "
            "share of the study's core-seconds spent outside its own run: its process's start and imports (about 2 s of "
            "torch and Optuna, done ahead by a spare process while a core is free), loading the study, the study's "
            "bookkeeping, and at --parallel 2 a core left idle while the study's last trial runs alone.",
        ]
    )
    write_section("distrl tune: trials in parallel", body)


if __name__ == "__main__":
    main()
