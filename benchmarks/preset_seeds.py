"""How a preset holds across seeds: ``distrl train ALGO ENV`` as a new user types it (the preset, the default
strategy), on seeds 0..N-1 one after another, and the final 10-episode evaluation of each.

    python benchmarks/preset_seeds.py impala CartPole-v1                       # 8 seeds, default strategy
    python benchmarks/preset_seeds.py impala CartPole-v1 --extra="--strategy single"

The runs are learning results, not timings. Writes its section of docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import tempfile
import time
from pathlib import Path

from harness import train_at_once, write_section


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("algo")
    parser.add_argument("env")
    parser.add_argument("--seeds", type=int, default=8)
    parser.add_argument("--extra", default="", help="flags added to every run, e.g. --strategy single")
    args = parser.parse_args()
    extra = shlex.split(args.extra)
    returns = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(args.seeds):
            run_dir = Path(tmp) / f"s{seed}"
            (summary,) = train_at_once([(run_dir, [args.algo, args.env, "--seed", str(seed), *extra])])
            returns.append(summary["final_eval_mean_return"])
            print(f"seed {seed}: {returns[-1]:.1f}", flush=True)
    command = f"distrl train {args.algo} {args.env} {args.extra}".strip()
    body = "\n".join(
        [
            f"`python benchmarks/preset_seeds.py {args.algo} {args.env}"
            + (f' --extra="{args.extra}"' if args.extra else "")
            + f"` — {time.strftime('%Y-%m-%d')}: `{command} --seed S` for seeds 0-{args.seeds - 1}, one after another; "
            "the final 10-episode deterministic evaluation of each.",
            "",
            "| seeds | final evaluations | min | mean |",
            "|---|---|---|---|",
            f"| 0-{args.seeds - 1} | {', '.join(f'{r:.1f}' for r in returns)} | {min(returns):.1f} | "
            f"{statistics.mean(returns):.1f} |",
        ]
    )
    title = f"{args.algo.upper()} {args.env} preset across seeds" + (f" ({args.extra})" if args.extra else "")
    write_section(title, body)


if __name__ == "__main__":
    main()
