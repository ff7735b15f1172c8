"""distrl tune: population-based training against random search, for the same environment steps.

Both search the same space (learning rate on a log scale, clip range, entropy coefficient) from the env's
preset, with the same budget per run and the same number of runs, so both train the same total of environment
steps:

* PBT: ``distrl tune ALGO ENV --scheduler pbt --population P`` (synchronous: ranked at once every
  ``--interval`` steps; the worst quarter copies the best and perturbs);
* random search: ``distrl tune ALGO ENV --scheduler optuna --trials P --startup-trials P --pruner none``
  (every trial drawn at random, none stopped early), evaluated as often as a PBT member.

Each repeat uses another ``--seed`` for both. The score of a study is its best final evaluation (the mean
return of ``--eval-episodes`` deterministic episodes at the end of the budget); printed, and written as JSON
with the wall times.

    python benchmarks/pbt_vs_random.py                      # Hopper-v5, PPO, 8 x 204,800 steps, 3 repeats
    python benchmarks/pbt_vs_random.py --env CartPole-v1 --budget-steps 4096 --population 2 --repeats 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from harness import markdown_table

RESULTS = Path(__file__).parents[1] / "docs" / "results" / "pbt"
SPACE = {
    "learning_rate": {"type": "float", "low": 1e-5, "high": 3e-3, "log": True},
    "clip_range": {"type": "float", "low": 0.1, "high": 0.4},
    "ent_coef": {"type": "float", "low": 1e-8, "high": 1e-2, "log": True},
}


def tune(args: argparse.Namespace, flags: list[str], study_dir: Path, seed: int) -> float:
    """Run one ``distrl tune`` study to its end; its wall time."""
    command = [
        sys.executable,
        "-m",
        "distrl",
        "tune",
        args.algo,
        args.env,
        "--budget-steps",
        str(args.budget_steps),
        "--parallel",
        str(args.parallel),
        "--space",
        str(study_dir.parent / "space.json"),
        "--no-default-space",
        "--eval-episodes",
        str(args.eval_episodes),
        "--seed",
        str(seed),
        "--study-dir",
        str(study_dir),
        *flags,
    ]
    start = time.perf_counter()
    log = study_dir.parent / f"{study_dir.name}.log"
    with log.open("w") as out:
        code = subprocess.run(command, stdout=out, stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise RuntimeError(f"{' '.join(command)} failed ({code}):\n{log.read_text()[-3000:]}")
    return time.perf_counter() - start


def pbt(args: argparse.Namespace, where: Path, seed: int) -> dict:
    study_dir = where / f"pbt-s{seed}"
    flags = ["--scheduler", "pbt", "--population", str(args.population), "--perturbation-interval", str(args.interval)]
    wall = tune(args, flags, study_dir, seed)
    finals: dict[str, float] = {}
    for line in (study_dir / "lineage.jsonl").read_text().splitlines():
        event = json.loads(line)
        if event["event"] == "eval":
            finals[event["member"]] = event["return"]
    best = json.loads((study_dir / "best_schedule.json").read_text())
    return {
        "best_return": best["return"],
        "returns": sorted(finals.values(), reverse=True),
        "best_segments": len(best["segments"]),
        "env_steps": args.population * args.budget_steps,
        "wall_s": wall,
    }


def random_search(args: argparse.Namespace, where: Path, seed: int) -> dict:
    study_dir = where / f"random-s{seed}"
    flags = [
        *("--scheduler", "optuna", "--trials", str(args.population), "--startup-trials", str(args.population)),
        *("--pruner", "none", "--evaluations", str(max(1, args.budget_steps // args.interval))),
    ]
    wall = tune(args, flags, study_dir, seed)
    summaries = [json.loads((run / "summary.json").read_text()) for run in sorted((study_dir / "trials").iterdir())]
    returns = [s["final_eval_mean_return"] for s in summaries if s.get("final_eval_mean_return") is not None]
    return {
        "best_return": max(returns),
        "returns": sorted(returns, reverse=True),
        "env_steps": sum(s["total_steps"] for s in summaries),
        "wall_s": wall,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--budget-steps", type=int, default=204_800, help="steps of each member and of each trial")
    parser.add_argument("--population", type=int, default=8, help="PBT's members, and random search's trials")
    parser.add_argument(
        "--interval", type=int, default=0, help="PBT's perturbation interval (0: a tenth of the budget, at least 1024)"
    )
    parser.add_argument("--repeats", type=int, default=3, help="studies of each, seeds 0, 1, ...")
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 1, help="members or trials at once")
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON results (default: docs/results/pbt/pbt_vs_random-ALGO-ENV.json)"
    )
    args = parser.parse_args()
    args.interval = args.interval or max(args.budget_steps // 10, 1024)
    out = args.out or RESULTS / f"pbt_vs_random-{args.algo}-{args.env.replace('/', '_')}.json"
    repeats = []
    with tempfile.TemporaryDirectory(prefix="pbt-vs-random-") as tmp:
        where = Path(tmp)
        (where / "space.json").write_text(json.dumps(SPACE))
        for seed in range(args.repeats):
            # Alternate which goes first, so that drift in the machine's speed hits both alike.
            order = [("pbt", pbt), ("random", random_search)][:: 1 if seed % 2 == 0 else -1]
            results = {name: run(args, where, seed) for name, run in order}
            repeats.append({"seed": seed, **results})
            for name, r in results.items():
                print(
                    f"  seed {seed} {name:6s}: best final return {r['best_return']:.1f} "
                    f"({r['env_steps']:,} env steps, {r['wall_s']:.0f}s)",
                    flush=True,
                )
    rows = []
    for name in ("pbt", "random"):
        best = [r[name]["best_return"] for r in repeats]
        wall = [r[name]["wall_s"] for r in repeats]
        rows.append(
            [
                name,
                f"{statistics.median(best):.1f}",
                ", ".join(f"{b:.1f}" for b in best),
                f"{statistics.median(wall):.0f}",
            ]
        )
    print(
        "\n".join(
            [
                f"{args.algo} {args.env}: {args.population} runs x {args.budget_steps:,} steps per study, "
                f"PBT perturbing every {args.interval:,} steps; {args.repeats} repeats",
                "",
                *markdown_table(["search", "median best final return", "per repeat", "median wall s"], rows),
            ]
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    report = {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "algo": args.algo,
        "env": args.env,
        "budget_steps": args.budget_steps,
        "population": args.population,
        "interval": args.interval,
        "parallel": args.parallel,
        "eval_episodes": args.eval_episodes,
        "space": SPACE,
        "repeats": repeats,
    }
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {out}")


if __name__ == "__main__":
    main()
