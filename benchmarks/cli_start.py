"""How long the command line takes to answer when it has nothing to train: help, the version, and one-line refusals.

    python benchmarks/cli_start.py b94de14            # this tree against an earlier commit, 7 runs each, alternating
    python benchmarks/cli_start.py b94de14 --runs 3

Each command runs as ``python -m distrl ...`` in a fresh process (what a user waits for), with the earlier commit's
``src/`` first on PYTHONPATH for its rows; medians of wall time. The last column says which of torch, gymnasium, ray
and transformers the command imported in this tree (read from ``python -X importtime``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from against_commit import export
from harness import alternating, markdown_table, median

ROOT = Path(__file__).parents[1]
COMMANDS = [
    ["--help"],
    ["--version"],
    ["train", "--help"],
    ["train", "ppo", "--help"],
    ["train", "ppo", "CartPole-v1", "--n-stepz", "64"],
    ["train", "ppo", "CartPole-v1", "--n-steps", "0"],
    ["train", "xyz", "CartPole-v1"],
    ["trian"],
]
HEAVY = ("torch", "gymnasium", "ray", "transformers")


def wall_s(args: list[str], src: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "distrl", *args], env=env, capture_output=True, timeout=120)
    return time.perf_counter() - start


def heavy_imports(args: list[str], src: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(src)}
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "distrl", *args], env=env, capture_output=True, text=True
    )
    found = {line.rsplit("|", 1)[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    return [name for name in HEAVY if name in found]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="the earlier commit (any git ref)")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        sources = {"this tree": ROOT / "src", args.base: export(args.base, Path(tmp))}
        rows = []
        for command in COMMANDS:
            times: dict[str, list[float]] = {name: [] for name in sources}
            for name in alternating(list(sources), args.runs):
                times[name].append(wall_s(command, sources[name]))
            head, base = (median(times[name]) for name in sources)
            loaded = ", ".join(heavy_imports(command, sources["this tree"])) or "none"
            rows.append(
                [f"`distrl {' '.join(command)}`", f"{head:.2f} s", f"{base:.2f} s", f"{base / head:.1f}x", loaded]
            )
            print(rows[-1], flush=True)
    header = ["command", "this tree", args.base, "faster", "heavy imports (this tree)"]
    print("\n".join(markdown_table(header, rows)))


if __name__ == "__main__":
    main()
