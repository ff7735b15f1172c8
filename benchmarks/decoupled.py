"""decoupled against ddp and single at equal total envs: SPS and the player's wait for weights.

    python benchmarks/decoupled.py            # writes its section of docs/benchmarks.md
    python benchmarks/decoupled.py --quick

Every configuration steps the same number of environments in total: ``single`` all of them
in one process, ``ddp`` half in each of 2 workers, ``decoupled`` all of them in the player
with 1 or 2 trainers (2 or 3 processes). Same total steps everywhere; configurations
alternate; medians. Player wait = share of the player's training time spent waiting for
the trainers' weights.
"""

from __future__ import annotations

import argparse
import statistics
import time

from harness import alternating, markdown_table, write_section
from scaling import run_once

WORKLOADS = {  # env, total envs, extra flags, total steps (full, quick)
    "CartPole-v1": (32, ["--preset", "auto"], 102_400, 51_200),
    "Hopper-v5": (2, ["--preset", "none", "--n-steps", "1024", "--batch-size", "256"], 40_960, 16_384),
}
CONFIGS = [("single", 1), ("ddp", 2), ("decoupled", 2), ("decoupled", 3)]


def envs_per_process(strategy: str, workers: int, total_envs: int) -> int:
    return total_envs // workers if strategy == "ddp" else total_envs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 1 if args.quick else 3
    rows = []
    for env, (total_envs, extra, steps_full, steps_quick) in WORKLOADS.items():
        steps = steps_quick if args.quick else steps_full
        results: dict = {c: [] for c in CONFIGS}
        for strategy, workers in alternating(CONFIGS, repeats):
            flags = [*extra, "--n-envs", str(envs_per_process(strategy, workers, total_envs))]
            r = run_once(env, flags, strategy, workers, steps)
            results[(strategy, workers)].append(r)
            print(f"{env} {strategy:9s} x{workers}: {r['sps']:,.0f} SPS", flush=True)
        base = statistics.median(r["sps"] for r in results[CONFIGS[0]])
        for (strategy, workers), runs in results.items():
            sps = statistics.median(r["sps"] for r in runs)
            wait = statistics.median(r.get("player_wait_s", 0.0) / r["train_s"] for r in runs)
            rows.append(
                (
                    env,
                    strategy,
                    workers,
                    envs_per_process(strategy, workers, total_envs),
                    sps,
                    sps / base,
                    wait if strategy == "decoupled" else None,
                )
            )
    lines = [
        f"`python benchmarks/decoupled.py` — {time.strftime('%Y-%m-%d')}, 2-core machine, {repeats} runs per "
        "configuration, alternating, medians. Equal total envs and total steps in every configuration.",
        "",
        *markdown_table(
            [
                "env",
                "strategy",
                "processes",
                "envs per collecting process",
                "SPS",
                "vs single",
                "player waits for weights",
            ],
            [
                [
                    env,
                    strategy,
                    str(workers),
                    str(envs),
                    f"{sps:,.0f}",
                    f"{ratio:.2f}×",
                    "—" if wait is None else f"{100 * wait:.0f}% of training time",
                ]
                for env, strategy, workers, envs, sps, ratio, wait in rows
            ],
        ),
    ]
    lines += [
        "",
        "The player collects while the trainers are idle and waits while they update, so on a "
        "2-core machine decoupled pays for its transfers without gaining parallelism; it is meant for "
        "a player on CPU feeding trainers on GPUs (`--player-device cpu --trainer-device cuda`).",
    ]
    write_section("decoupled vs ddp vs single", "\n".join(lines))


if __name__ == "__main__":
    main()
