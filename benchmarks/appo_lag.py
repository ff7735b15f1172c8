"""APPO with its actors several versions behind the learner against APPO with none, on CartPole-v1.

    python benchmarks/appo_lag.py            # 3 seeds per setting; writes its section of docs/benchmarks.md
    python benchmarks/appo_lag.py --quick    # 1 seed, prints the section, writes nothing

Both settings run the APPO CartPole-v1 preset (100k steps) under ``--strategy pipeline``, one fragment per
learner step:

- lag 0: one actor, ``--queue-size 1``: the actor starts a fragment only once the learner took the last one, so
  every fragment is drawn by the learner's current policy (synchronous APPO, computed in two processes);
- lagged: two actors, ``--queue-size 8``, fragments sampled uniformly from the buffer: up to 8 fragments wait
  ahead of the learner, so most are trained on several versions after the policy that drew them, and V-trace
  corrects for it; fragments more than ``--max-policy-lag 12`` versions old are dropped.

The question is whether V-trace keeps the lagged run learning as well: the table gives each run's final
10-episode evaluation, its mean over the last 100 training episodes, the lag it ran with (mean, p95, max) and
the fraction of fragments dropped. Settings alternate over seeds.
"""

from __future__ import annotations

import argparse
import csv
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import alternating, markdown_table, median, write_section

RESULT = Path(__file__).parents[1] / "docs" / "results" / "appo_lag.json"

SETTINGS = {
    "lag 0": ["--workers", "1", "--queue-size", "1", "--fragments-per-step", "1"],
    "lagged": [
        "--workers",
        "2",
        "--queue-size",
        "8",
        "--fragments-per-step",
        "1",
        "--replay-sampling",
        "uniform",
        "--max-policy-lag",
        "12",
    ],
}


def last_100(run_dir: Path) -> float:
    """Mean return of the last 100 training episodes in the run's monitor.csv."""
    lines = (run_dir / "monitor.csv").read_text().splitlines()[1:]  # after the JSON header line
    returns = [float(row["r"]) for row in csv.DictReader(lines)]
    return sum(returns[-100:]) / len(returns[-100:])


def train(setting: str, seed: int, root: Path) -> dict:
    run_dir = root / f"{setting.replace(' ', '_')}-s{seed}"
    args = ["appo", "CartPole-v1", "--strategy", "pipeline", *SETTINGS[setting], "--seed", str(seed)]
    out = subprocess.run(
        [sys.executable, "-m", "distrl", "train", *args, "--quiet", "--run-dir", str(run_dir)],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{setting} seed {seed} failed:\n{out.stderr[-2000:]}")
    s = json.loads((run_dir / "summary.json").read_text())
    return {
        "eval": s["final_eval_mean_return"],
        "last_100": last_100(run_dir),
        "train_s": s["train_s"],
        "lag_mean": s["policy_lag_mean"],
        "lag_p95": s["policy_lag_p95"],
        "lag_max": s["policy_lag_max"],
        "dropped": s["fragments_dropped_for_lag_fraction"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 seed, print only")
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    results: dict[str, list[dict]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory() as tmp:
        for i, setting in enumerate(alternating(list(SETTINGS), seeds)):
            seed = i // len(SETTINGS)
            r = train(setting, seed, Path(tmp))
            results[setting].append(r)
            print(f"  {setting} seed {seed}: {json.dumps({k: round(v, 3) for k, v in r.items()})}", flush=True)
    data = {"command": "appo_lag.py", "env": "CartPole-v1", "algo": "appo", "steps": 100_000, "settings": SETTINGS}
    data["runs"] = {setting: [dict(r, seed=seed) for seed, r in enumerate(runs)] for setting, runs in results.items()}
    body = "\n".join(report(data))
    if args.quick:
        print(body)
    else:
        RESULT.write_text(json.dumps(data, indent=1) + "\n")  # docs/results.md shows it too
        write_section("APPO: learning with lagged actors (V-trace)", body)


def report(data: dict) -> list[str]:
    """The table of a result of this benchmark (as written to docs/results/appo_lag.json)."""
    rows = []
    for setting, runs in data["runs"].items():
        for r in runs:
            rows.append(
                [
                    setting,
                    str(r["seed"]),
                    f"{r['eval']:.0f}",
                    f"{r['last_100']:.0f}",
                    f"{r['lag_mean']:.1f} / {r['lag_p95']:.0f} / {r['lag_max']:.0f}",
                    f"{100 * r['dropped']:.1f}%",
                    f"{r['train_s']:.1f}",
                ]
            )
    medians = {s: median([r["eval"] for r in runs]) for s, runs in data["runs"].items()}
    return [
        "APPO on CartPole-v1 with its preset (100k steps), `--strategy pipeline`, one fragment per learner step: "
        "`lag 0` is one actor with `--queue-size 1` (every fragment drawn by the learner's current policy); "
        "`lagged` is two actors with `--queue-size 8 --replay-sampling uniform --max-policy-lag 12`. "
        "Reproduce: `python benchmarks/appo_lag.py`.",
        "",
        *markdown_table(
            [
                "setting",
                "seed",
                "final 10-episode eval",
                "last 100 episodes",
                "lag mean / p95 / max",
                "dropped for lag",
                "training s",
            ],
            rows,
        ),
        "",
        f"Median final evaluation: lag 0 {medians['lag 0']:.0f}, lagged {medians['lagged']:.0f}.",
    ]


if __name__ == "__main__":
    main()
