"""``distrl bench scaling``: the same training with 1, 2, 4... workers, and its speedup against ideal."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import tyro

from distrl.config import ConfigError
from distrl.config.argv import parse_flags
from distrl.run.plots import speedup, speedup_chart


@dataclass(frozen=True)
class ScalingArgs:
    """Train ALGO on ENV once per worker count; report wall time, total steps and speedup against ideal."""

    algo: tyro.conf.Positional[str]
    env: tyro.conf.Positional[str]
    workers: str = "1,2"
    """Comma-separated worker counts; 1 runs --strategy single, the others --strategy STRATEGY."""
    strategy: Literal["ddp", "actor-learner", "decoupled"] = "ddp"
    """How the workers share the work."""
    total_steps: int = 0
    """Environment steps per run (0: the preset's)."""
    out_dir: str = "bench-scaling"
    """Where the chart (speedup.png), the figures (scaling.json) and the runs go."""
    extra: str = ""
    """More flags for every run, given with '=': --extra='--preset none --n-envs 1'."""


def parse_workers(text: str) -> list[int]:
    try:
        counts = [int(w) for w in text.split(",") if w.strip()]
    except ValueError:
        counts = []
    if not counts or any(c < 1 for c in counts):
        raise ConfigError(f"workers={text!r} is not allowed: must be comma-separated positive integers, e.g. 1,2,4")
    return sorted(set(counts))


def scaling_command(argv: list[str]) -> int:
    args = parse_flags(ScalingArgs, argv, prog="distrl bench scaling")
    counts = parse_workers(args.workers)
    if args.strategy == "decoupled" and 1 in counts[1:]:
        raise ConfigError("workers: decoupled needs >= 2 processes (a player and a trainer)")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in counts:
        strategy = "single" if n == 1 else args.strategy
        run_dir = out / f"{strategy}-x{n}"
        cmd = [
            sys.executable,
            "-m",
            "distrl",
            "train",
            args.algo,
            args.env,
            "--strategy",
            strategy,
            "--quiet",
            "--run-dir",
            str(run_dir),
            *args.extra.split(),
        ]
        if n > 1:
            cmd += ["--workers", str(n)]
        if args.total_steps:
            cmd += ["--total-steps", str(args.total_steps)]
        print(f"[{len(rows) + 1}/{len(counts)}] {strategy} x{n} ...", file=sys.stderr, flush=True)
        start = time.perf_counter()
        result = subprocess.run(cmd, capture_output=True, text=True)
        if result.returncode != 0:
            raise ConfigError(f"the {strategy} x{n} run failed: {result.stderr.strip().splitlines()[-1:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
        rows.append(
            {
                "workers": n,
                "strategy": strategy,
                "wall_s": time.perf_counter() - start,
                "train_s": summary["train_s"],
                "total_steps": summary["total_steps"],
                "sps": summary["sps"],
            }
        )
        print(
            f"    {summary['total_steps']:,} steps, training {summary['train_s']:.1f}s, {summary['sps']:,.0f} SPS",
            file=sys.stderr,
            flush=True,
        )
    base = rows[0]
    for row in rows:
        row["speedup"] = speedup(base["train_s"], base["total_steps"], row["train_s"], row["total_steps"])
    (out / "scaling.json").write_text(
        json.dumps({"algo": args.algo, "env": args.env, "strategy": args.strategy, "runs": rows}, indent=2)
    )
    speedup_chart(
        [r["workers"] for r in rows],
        [r["speedup"] for r in rows],
        f"{args.algo.upper()} {args.env}, --strategy {args.strategy}",
        out / "speedup.png",
    )
    print(f"{'workers':>7} {'strategy':>13} {'total steps':>12} {'training s':>10} {'speedup':>8} {'ideal':>6}")
    for r in rows:
        print(
            f"{r['workers']:>7} {r['strategy']:>13} {r['total_steps']:>12,} {r['train_s']:>10.1f} "
            f"{r['speedup']:>7.2f}x {r['workers']:>5}x"
        )
    print(f"chart: {out / 'speedup.png'}, figures: {out / 'scaling.json'}")
    return 0
