"""What a small run pays to start: the smallest PPO run under each strategy, this tree against an earlier commit, and
the Ray strategies' start-up stage by stage.

    python benchmarks/start_up.py b94de14              # 5 runs each, alternating, medians
    python benchmarks/start_up.py b94de14 --runs 3

Each run is ``python -m distrl train ppo CartPole-v1 --total-steps 512 --quiet`` in a fresh process (what a user
waits for), with the earlier commit's ``src/`` first on PYTHONPATH for its rows. The stages of the Ray strategies are
read in one process of this tree, by timing ``ray.init``, the first ``ray.get`` and ``ray.shutdown``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from against_commit import export
from harness import alternating, markdown_table, median

ROOT = Path(__file__).parents[1]
STRATEGIES = {
    "single": [],
    "ddp --workers 2": ["--strategy", "ddp", "--workers", "2"],
    "decoupled --workers 2": ["--strategy", "decoupled", "--workers", "2"],
    "actor-learner --workers 2": ["--strategy", "actor-learner", "--workers", "2"],
    "pipeline --workers 2": ["--strategy", "pipeline", "--workers", "2"],
}
RUN = ["train", "ppo", "CartPole-v1", "--total-steps", "512", "--quiet"]

STAGES = """
import json, sys, time
t0 = time.perf_counter()
marks = {}
import ray
init, get, shutdown = ray.init, ray.get, ray.shutdown
def timed_init(*a, **k):
    marks["before ray.init"] = time.perf_counter() - t0
    result = init(*a, **k)
    marks["ray.init"] = time.perf_counter() - t0 - marks["before ray.init"]
    return result
def timed_get(*a, **k):
    result = get(*a, **k)
    marks.setdefault("ray.init to the first result", time.perf_counter() - t0 - sum(marks.values()))
    return result
def timed_shutdown(*a, **k):
    start = time.perf_counter()
    marks["first result to shutdown"] = start - t0 - sum(marks.values())
    result = shutdown(*a, **k)
    marks["ray.shutdown"] = time.perf_counter() - start
    return result
ray.init, ray.get, ray.shutdown = timed_init, timed_get, timed_shutdown
from distrl.cli import main
code = main([*json.loads(sys.argv[1]), "--run-dir", sys.argv[2]])
marks["in all (after the interpreter's start)"] = time.perf_counter() - t0
print(json.dumps(marks))
"""


def wall_s(args: list[str], src: Path, run_dir: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "distrl", *args, "--run-dir", str(run_dir)], env=env, capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"{args} failed:\n{out.stderr[-2000:]}")
    return time.perf_counter() - start


def stages(flags: list[str], run_dir: Path) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", STAGES, json.dumps([*RUN, *flags]), str(run_dir)],
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="the earlier commit (any git ref)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "base").mkdir()
        sources = {"this tree": ROOT / "src", args.base: export(args.base, Path(tmp) / "base")}
        rows, single = [], {}
        for label, flags in STRATEGIES.items():
            times: dict[str, list[float]] = {name: [] for name in sources}
            for i, name in enumerate(alternating(list(sources), args.runs)):
                times[name].append(wall_s([*RUN, *flags], sources[name], Path(tmp) / f"run-{label[:4]}-{i}"))
            head, base = (median(times[name]) for name in sources)
            single = single or {"this tree": head, "base": base}
            rows.append(
                [
                    f"`{label}`",
                    f"{head:.2f} s ({head / single['this tree']:.2f}x single)",
                    f"{base:.2f} s ({base / single['base']:.2f}x single)",
                ]
            )
            print(rows[-1], flush=True)
        print("\n".join(markdown_table(["smallest PPO run", "this tree", args.base], rows)))
        stage_rows = []
        for label in ("actor-learner --workers 2", "pipeline --workers 2"):
            marks = stages(STRATEGIES[label], Path(tmp) / f"stages-{label[:4]}")
            stage_rows.append([f"`{label}`", *(f"{marks.get(k, float('nan')):.2f} s" for k in STAGE_NAMES)])
        print("\n".join(markdown_table(["this tree, one run", *STAGE_NAMES], stage_rows)))


STAGE_NAMES = (
    "before ray.init",
    "ray.init",
    "ray.init to the first result",
    "first result to shutdown",
    "ray.shutdown",
    "in all (after the interpreter's start)",
)

if __name__ == "__main__":
    main()
