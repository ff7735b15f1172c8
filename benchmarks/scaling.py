"""ddp scaling: steps/s and wall time with 1 and 2 workers, speedup against ideal.

    python benchmarks/scaling.py            # Hopper-v5 and CartPole-v1, writes docs/benchmarks.md + docs/scaling.png
    python benchmarks/scaling.py --quick

Every configuration trains the same total number of environment steps (``--scaling
per-worker``: each worker keeps the single-process settings and the run ends sooner).
Configurations alternate and repeat; medians are reported. The share of update time
spent in the gradient all-reduce (including waiting for the other worker) comes from
each run's summary.json.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from distrl.strategies.dist_sync import TRANSPORT_VAR
from harness import alternating, train_at_once, write_section

ROOT = Path(__file__).parents[1]
WORKLOADS = {
    # SB3's default PPO settings, one env per worker: 320 minibatches (all-reduces) per 2048 steps.
    "Hopper-v5, SB3 defaults (batch 64)": ("Hopper-v5", ["--preset", "none", "--n-envs", "1"]),
    # the same with 512-sample minibatches, as DD-PPO-style runs use: 40 all-reduces per 2048 steps.
    "Hopper-v5, batch 512": ("Hopper-v5", ["--preset", "none", "--n-envs", "1", "--batch-size", "512"]),
    # the CartPole preset: 32 native envs per worker, update-bound (20 all-reduces per 512 steps).
    "CartPole-v1, preset": ("CartPole-v1", ["--preset", "auto"]),
}
# "independent" runs two unrelated single-process trainings at once, each with half the steps:
# the most two processes can do on this machine, with no communication at all. "ddp-gloo" is ddp
# with the gradient sums on gloo instead of shared memory (DISTRL_DDP_TRANSPORT=gloo).
CONFIGS = [("single", 1), ("ddp", 1), ("ddp", 2), ("ddp-gloo", 2), ("independent", 2)]


def run_once(env: str, extra: list[str], strategy: str, workers: int, steps: int) -> dict:
    """One training run (or, for ``independent``, ``workers`` single runs at once); its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        if strategy == "independent":
            runs = [(Path(tmp) / f"run{i}", ["--strategy", "single", "--seed", str(i)]) for i in range(workers)]
            steps //= workers
        else:
            runs = [
                (
                    Path(tmp) / "run",
                    ["--strategy", "ddp" if strategy == "ddp-gloo" else strategy, "--workers", str(workers)],
                )
            ]
        os.environ[TRANSPORT_VAR] = "gloo" if strategy == "ddp-gloo" else "shm"
        try:
            summaries = train_at_once(
                [(run_dir, ["ppo", env, *extra, "--total-steps", str(steps), *flags]) for run_dir, flags in runs]
            )
        finally:
            del os.environ[TRANSPORT_VAR]
    summary = dict(summaries[0])
    summary["sps"] = sum(s["sps"] for s in summaries)
    summary["total_steps"] = sum(s["total_steps"] for s in summaries)
    summary["train_s"] = max(s["train_s"] for s in summaries)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", default="", help="run only workloads whose name contains this text")
    args = parser.parse_args()
    repeats = 1 if args.quick else args.repeats
    rows = []
    for env in [w for w in WORKLOADS if args.only in w]:
        results: dict[tuple[str, int], list[dict]] = {c: [] for c in CONFIGS}
        total = (
            (51_200 if args.quick else 102_400) if env.startswith("CartPole") else (20_480 if args.quick else 61_440)
        )
        for config in alternating(CONFIGS, repeats):
            r = run_once(*WORKLOADS[env], *config, total)
            results[config].append(r)
            print(f"{env} {config[0]:6s} x{config[1]}: {r['sps']:,.0f} SPS, train {r['train_s']:.1f}s", flush=True)
        base_sps = statistics.median(r["sps"] for r in results[("single", 1)])
        for config, runs in results.items():
            sps = statistics.median(r["sps"] for r in runs)
            train_s = statistics.median(r["train_s"] for r in runs)
            share = statistics.median(r["sync_s"] / max(r["update_s"], 1e-9) for r in runs)
            rows.append(
                {
                    "env": env,
                    "strategy": config[0],
                    "workers": config[1],
                    "steps": runs[0]["total_steps"],
                    "sps": sps,
                    "train_s": train_s,
                    "speedup": sps / base_sps,
                    "ideal": float(config[1]),
                    "sync_share": share,
                    "raw_sps": [r["sps"] for r in runs],
                }
            )
    write_report(rows, repeats)


def write_report(rows: list[dict], repeats: int) -> None:
    lines = [
        f"`python benchmarks/scaling.py` — {time.strftime('%Y-%m-%d')}, 2-core machine, {repeats} runs per "
        "configuration, alternating, medians. Same total environment steps in every configuration; "
        "`--scaling per-worker`. Speedup = SPS / SPS of `single`; ideal = number of workers. "
        "All-reduce share = time in the gradient sums (including waiting for the other worker) / update time. "
        "`ddp` sums one machine's gradients through shared memory; `ddp-gloo` is the same run with them on gloo. "
        "`independent` = two unrelated single-process runs at once, half the steps each: what two processes "
        "reach on this machine with no communication (the practical ceiling for `ddp` ×2).",
        "",
        "| workload | strategy | workers | total steps | SPS | training s | speedup | ideal | all-reduce share of update |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['env']} | {r['strategy']} | {r['workers']} | {r['steps']:,} | {r['sps']:,.0f} | "
            f"{r['train_s']:.1f} | {r['speedup']:.2f}× | {r['ideal']:.0f}× | {100 * r['sync_share']:.0f}% |"
        )
    lines += [
        "",
        "Raw SPS per run, in run order: "
        + "; ".join(
            f"{r['env']} {r['strategy']} ×{r['workers']}: {', '.join(f'{x:,.0f}' for x in r['raw_sps'])}" for r in rows
        ),
    ]
    lines += ["", "![ddp speedup against ideal](scaling.png)", ""]
    write_section("ddp scaling", "\n".join(lines))
    plot(rows, ROOT / "docs" / "scaling.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    envs = list(dict.fromkeys(r["env"] for r in rows))
    fig, axes = plt.subplots(1, len(envs), figsize=(5 * len(envs), 4), squeeze=False)
    for ax, env in zip(axes[0], envs):
        sub = [r for r in rows if r["env"] == env]
        labels = [f"{r['strategy']}\n×{r['workers']}" for r in sub]
        x = range(len(sub))
        ax.bar([i - 0.2 for i in x], [r["ideal"] for r in sub], width=0.4, color="#cccccc", label="ideal")
        ax.bar([i + 0.2 for i in x], [r["speedup"] for r in sub], width=0.4, color="#3366aa", label="measured")
        for i, r in zip(x, sub):
            ax.text(i + 0.2, r["speedup"] + 0.03, f"{r['speedup']:.2f}×", ha="center", fontsize=9)
        ax.set_xticks(list(x), labels)
        ax.set_ylabel("speedup over single (SPS ratio)")
        ax.set_title(f"PPO {env}", fontsize=10)
        ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
