"""Ape-X (``--strategy actor-learner`` for dqn): insert rate and learner speed with 1, 2, 4 and 8 actors.

    python benchmarks/apex_scaling.py            # writes its section of docs/benchmarks.md
    python benchmarks/apex_scaling.py --quick    # tiny budgets, 1 and 2 actors, prints the section, writes nothing

The env is ``slow_envs:SleepyCartPole``: CartPole-v1 whose every step also sleeps ``--step-ms`` (4 ms), a
remote simulator whose step costs wall time but little CPU. One actor then collects at most 1000 / 4 = 250
steps/s, and N actors should insert N times what one does even on 2 cores: the question is whether the replay
holder and the learner keep up, and whether the learner's own speed (gradient steps/s, free-running at
``--replay-ratio 0``) holds while more actors push. Every run trains ``--steps-per-actor`` x N steps, so each
lasts about as long (~60 s of training). Actor counts alternate over ``--repeats`` rounds; medians are reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import time

from harness import alternating, child_env, markdown_table, measured_run, median, write_section

ENV = "slow_envs:SleepyCartPole"
ACTORS, QUICK_ACTORS = (1, 2, 4, 8), (1, 2)
LEARNING_STARTS = 1_000
DQN = [
    "--preset",
    "none",
    "--net-arch",
    "64",
    "64",
    "--batch-size",
    "64",
    "--learning-starts",
    str(LEARNING_STARTS),
    "--buffer-size",
    "100000",
    # the final evaluation cannot be turned off: one episode of at most 100 steps keeps it under half a second
    "--eval-episodes",
    "1",
    "--eval-max-steps",
    "100",
]
WORKER_CPUS = 0.25  # what Ray reserves per actor, so that 8 actors fit on 2 cores


def run_once(actors: int, steps_per_actor: int, step_ms: float, seed: int) -> dict:
    """One Ape-X run in its own process; its summary.json with peak memory and the process's wall time."""
    env = child_env()  # the Ray actors import slow_envs too: they inherit its PYTHONPATH
    args = [
        *("dqn", ENV, "--env-kwargs", f"step_ms={step_ms:g}", *DQN),
        *("--strategy", "actor-learner", "--workers", str(actors), "--worker-cpus", str(WORKER_CPUS)),
        *("--total-steps", str(steps_per_actor * actors), "--seed", str(seed)),
    ]
    summary = measured_run(args, env, f"apex_scaling: {actors} actors, seed {seed}")
    # The learner does nothing until LEARNING_STARTS transitions are in (4-5 s with one actor, 0.5 s with 8):
    # its speed is counted over the time after that, estimated at the run's mean insert rate.
    learning_s = summary["train_s"] - LEARNING_STARTS / summary["insert_rate"]
    summary.update(gradient_steps_per_s=summary["gradient_steps"] / max(learning_s, 1e-9))
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny budgets, 1 and 2 actors; prints, writes nothing")
    parser.add_argument("--repeats", type=int, default=3, help="runs per actor count")
    parser.add_argument("--step-ms", type=float, default=4.0, help="the env's sleep per step")
    parser.add_argument(
        "--steps-per-actor",
        type=int,
        default=12_800,
        help="env steps per actor (a multiple of the 64-step push; ~60 s at the ~200 steps/s one actor reaches)",
    )
    args = parser.parse_args()
    actor_counts = QUICK_ACTORS if args.quick else ACTORS
    repeats = 1 if args.quick else args.repeats
    steps_per_actor = 2_560 if args.quick else args.steps_per_actor
    machine = f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.platform()}, Python {platform.python_version()}"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{machine}; load average at start {load}", flush=True)
    results: dict[int, list[dict]] = {n: [] for n in actor_counts}
    for i, n in enumerate(alternating(list(actor_counts), repeats)):
        r = run_once(n, steps_per_actor, args.step_ms, seed=i // len(actor_counts))
        results[n].append(r)
        print(
            f"  N={n}: insert {r['insert_rate']:,.0f}/s, {r['gradient_steps_per_s']:,.0f} gradient steps/s, "
            f"train {r['train_s']:.1f} s, wall {r['process_wall_s']:.1f} s, lag mean {r['lag_mean']:.0f}, "
            f"restarts {r['actor_restarts']}, RSS {r['learner_rss_mb']:.0f} / {r['tree_rss_mb']:.0f} MB",
            flush=True,
        )
        for line in [*r["events"], *r["stderr"].splitlines()[-5:]]:
            print(f"    {line}", flush=True)
    body = report(results, args.step_ms, steps_per_actor, repeats, machine, load)
    if args.quick:
        print(body)
    else:
        write_section("Ape-X: insert rate and learner speed with 1-8 actors", body)


def report(
    results: dict[int, list[dict]], step_ms: float, steps_per_actor: int, repeats: int, machine: str, load: str
) -> str:
    def med(n: int, key: str) -> float:
        return median([r[key] for r in results[n]])

    one_insert, one_grad = med(1, "insert_rate"), med(1, "gradient_steps_per_s")
    ceiling = 1000.0 / step_ms
    rows = []
    for n in results:
        insert, grad = med(n, "insert_rate"), med(n, "gradient_steps_per_s")
        rows.append(
            [
                str(n),
                f"{steps_per_actor * n:,}",
                f"{insert:,.0f}",
                f"{insert / (n * one_insert):.2f}",
                f"{insert / (n * ceiling):.2f}",
                f"{grad:,.0f}",
                f"{grad / one_grad:.2f}",
                f"{med(n, 'lag_mean'):,.0f} / {med(n, 'lag_p95'):,.0f} / {med(n, 'lag_max'):,.0f}",
                f"{med(n, 'train_s'):.1f}",
                str(sum(r["actor_restarts"] for r in results[n])),
                f"{med(n, 'learner_rss_mb'):,.0f} / {med(n, 'tree_rss_mb'):,.0f}",
            ]
        )
    lines = [
        f"`python benchmarks/apex_scaling.py` — {time.strftime('%Y-%m-%d')}, {machine}, load average at start "
        f"{load}. DQN (`--preset none`, 64x64 net, batch 64, buffer 100k, learning starts {LEARNING_STARTS:,}, "
        f"uniform replay) with `--strategy actor-learner --worker-cpus {WORKER_CPUS}` and the default "
        f"`--replay-ratio 0` (actors and learner run free) on `slow_envs:SleepyCartPole`: CartPole-v1 sleeping "
        f"{step_ms:g} ms per step, one env per actor, so one actor collects at most {ceiling:,.0f} steps/s. "
        f"{steps_per_actor:,} steps per actor; runs per actor count: {repeats}, alternating, medians.",
        "",
        *markdown_table(
            [
                "actors",
                "total steps",
                "insert rate (transitions/s)",
                "vs actors × 1 actor's (goal ≥ 0.8)",
                "vs the sleep's ceiling",
                "learner gradient steps/s",
                "vs 1 actor's",
                "lag mean / p95 / max (versions)",
                "training s",
                "actor restarts",
                "peak RSS learner / all processes (MB)",
            ],
            rows,
        ),
        "",
        "Insert rate = transitions the replay received / training time (summary.json's `insert_rate`). "
        "Training time includes the actors' start-up (the first push waits for them to import torch and build "
        "their env), longer when 8 start at once on 2 cores. The sleep's "
        f"ceiling is actors × {ceiling:,.0f}/s. Gradient steps/s = `gradient_steps` / (training time − the "
        f"warm-up until {LEARNING_STARTS:,} transitions were in, estimated at the run's insert rate). Lag = policy "
        "versions (gradient steps) between the weights that collected a transition and the learner's when it "
        "trained on it. Peak RSS is sampled every 0.5 s: the learner's process, and the sum over it and every "
        "process under it (Ray's GCS and raylet, the replay holder, the actors); shared pages count once per "
        "process.",
        "",
        "Raw values per run, in run order (insert rate; gradient steps/s): "
        + "; ".join(
            f"N={n}: "
            + ", ".join(f"{r['insert_rate']:,.0f}" for r in runs)
            + "; "
            + ", ".join(f"{r['gradient_steps_per_s']:,.0f}" for r in runs)
            for n, runs in results.items()
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
