"""actor-learner against single: episodes/s and wall time for REINFORCE, and the per-iteration overhead.

    python benchmarks/actor_learner.py            # writes its section of docs/benchmarks.md
    python benchmarks/actor_learner.py --quick

REINFORCE with 100 episodes per iteration, one environment per collector (``single``:
one env in one process; ``actor-learner``: one env in each of 2 Ray workers). Episodes/s
counts training time (collection + update); wall time includes process and Ray start-up.
Configurations alternate; medians are reported.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from harness import alternating, markdown_table, train_at_once, write_section

ENVS = {"Ant-v5": 4, "Hopper-v5": 3, "CartPole-v1": 20}  # iterations per run
# "independent" runs the single-process run twice at once: what two processes reach on this machine
# with no communication at all, the practical ceiling for actor-learner x2.
CONFIGS = [("single", 1), ("actor-learner", 2), ("independent", 2)]


def run_once(env: str, strategy: str, workers: int, iterations: int) -> dict:
    """One training run (or, for ``independent``, ``workers`` copies of the single run at once); its summary."""
    copies = workers if strategy == "independent" else 1
    flags = (
        ["--strategy", "single"] if strategy == "independent" else ["--strategy", strategy, "--workers", str(workers)]
    )
    args = [
        "reinforce",
        env,
        "--preset",
        "none",
        "--n-envs",
        "1",
        "--episodes-per-iter",
        "100",
        "--iterations",
        str(iterations),
        *flags,
    ]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        summaries = train_at_once([(Path(tmp) / f"run{i}", args) for i in range(copies)])
        wall_s = time.perf_counter() - start
    summary = dict(summaries[0])
    for key in ("sps", "episodes_per_s", "episodes"):
        summary[key] = sum(s[key] for s in summaries)
    summary["train_s"] = max(s["train_s"] for s in summaries)
    summary["process_wall_s"] = wall_s
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=5, help="runs per configuration")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    rows = []
    overheads: dict[str, list[float]] = {}
    rates: dict[str, list[list[float]]] = {}
    for env, iterations in ENVS.items():
        iterations = max(1, iterations // 2) if args.quick else iterations
        results: dict = {c: [] for c in CONFIGS}
        for config in alternating(CONFIGS, repeats):
            r = run_once(env, *config, iterations)
            results[config].append(r)
            print(
                f"{env} {config[0]:22s} x{config[1]}: {r['episodes_per_s']:.1f} episodes/s, {r['sps']:.0f} SPS, "
                f"wall {r['process_wall_s']:.1f}s, overhead {r.get('overhead_ms_median', 0):.1f} ms",
                flush=True,
            )
        overheads[env] = [r.get("overhead_ms_median", 0.0) for r in results[("actor-learner", 2)]]
        rates[env] = [[r["episodes_per_s"] for r in results[c]] for c in CONFIGS]
        base = statistics.median(r["episodes_per_s"] for r in results[CONFIGS[0]])
        base_sps = statistics.median(r["sps"] for r in results[CONFIGS[0]])
        for config, runs in results.items():
            eps = statistics.median(r["episodes_per_s"] for r in runs)
            sps = statistics.median(r["sps"] for r in runs)
            rows.append(
                {
                    "env": env,
                    "strategy": config[0],
                    "workers": config[1],
                    "episodes": runs[0]["episodes"],
                    "sps": sps,
                    "sps_speedup": sps / base_sps,
                    "episodes_per_s": eps,
                    "train_s": statistics.median(r["train_s"] for r in runs),
                    "wall_s": statistics.median(r["process_wall_s"] for r in runs),
                    "speedup": eps / base,
                    "overhead_ms": statistics.median(r.get("overhead_ms_median", 0.0) for r in runs),
                }
            )
    lines = [
        f"`python benchmarks/actor_learner.py` — {time.strftime('%Y-%m-%d')}, 2-core machine, REINFORCE, "
        f"100 episodes per iteration, one env per collector, {repeats} runs per configuration, alternating, medians.",
        "",
        *markdown_table(
            [
                "env",
                "strategy",
                "workers",
                "episodes",
                "episodes/s",
                "speedup",
                "steps/s",
                "speedup in steps/s",
                "training s",
                "wall s (with start-up)",
                "overhead per iteration",
            ],
            [
                [
                    r["env"],
                    r["strategy"],
                    str(r["workers"]),
                    str(r["episodes"]),
                    f"{r['episodes_per_s']:.1f}",
                    f"{r['speedup']:.2f}×",
                    f"{r['sps']:,.0f}",
                    f"{r['sps_speedup']:.2f}×",
                    f"{r['train_s']:.1f}",
                    f"{r['wall_s']:.1f}",
                    f"{r['overhead_ms']:.1f} ms" if r["strategy"] == "actor-learner" else "—",
                ]
                for r in rows
            ],
        ),
    ]
    lines += [
        "",
        "`independent` = the single run twice at once, in two processes: what two processes reach on "
        "this machine with no communication (the practical ceiling for actor-learner ×2).",
        "",
        "Each speedup divides medians of runs made minutes apart. The same single run varies by ±20-30% "
        "between repeats on these shared machines (raw values below), so a ratio can exceed what two cores "
        "allow (above 2× for independent) when the single runs fall in slow phases.",
        "",
        "Episodes/s depends on the episodes' lengths, which differ between single and actor-learner (their "
        "workers' envs are seeded differently), so the speedup is also given in steps/s.",
        "",
        "What limits the speedup: first the machine (the independent row: two processes at once, no "
        "communication), then the workers' episodes, which vary in length and in cost per step, so one worker "
        "often finishes before the other. In a separate measurement the busier worker's collection took 18.5% "
        "longer than the two workers' mean on Ant-v5 and 13% on CartPole-v1. Handing the episodes out in "
        "shrinking chunks to whichever worker was free did not measurably help on this machine (Ant 1.71× "
        "against 1.66× in steps/s, CartPole 1.17× against 1.20×) and doubled the overhead, so workers keep "
        "one equal share each.",
        "",
        "Overhead = the learner's wall time for a collection beyond the slowest worker's own collection "
        "time: sending the weights, scheduling the calls, moving the episodes back and "
        "merging them (`time/overhead_s` in TensorBoard, `overhead_ms_median` in summary.json). Weights go "
        "out packed once for all workers, and batches under 512 KB come back packed as one buffer (a JSON "
        "header and the arrays' bytes, `distrl.data.wire`); larger "
        "ones (Ant's) come back through Ray's object store.",
        "",
        "Raw values, median overhead per run (ms): "
        + "; ".join(f"{env} {', '.join(f'{x:.1f}' for x in values)}" for env, values in overheads.items()),
        "",
        "Raw values, episodes/s per run (single; actor-learner; independent): "
        + "; ".join(
            f"{env} " + "; ".join(", ".join(f"{x:.1f}" for x in runs) for runs in per_config)
            for env, per_config in rates.items()
        ),
    ]
    write_section("actor-learner: REINFORCE on Ray", "\n".join(lines))


if __name__ == "__main__":
    main()
