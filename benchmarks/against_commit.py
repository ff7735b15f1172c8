"""This tree's distrl against an earlier commit's, with stable-baselines3 beside both, alternating in one run.

    python benchmarks/against_commit.py 4f63b8b           # every task below, 3 repeats
    python benchmarks/against_commit.py 4f63b8b --quick   # fewer steps, 2 repeats
    python benchmarks/against_commit.py 4f63b8b --repeats 5 --only "PPO, CartPole"

The earlier commit's ``src/`` is exported with ``git archive`` into a temporary directory and put first on
the measuring children's PYTHONPATH; the children are this tree's side-by-side scripts (``--child``), so
both versions of distrl run exactly the same measurement code. Each task alternates this tree, the earlier
commit and stable-baselines3 (reversing the order every other round), and prints medians and ratios.

Needs the bench extra: pip install -e ".[bench,mujoco,atari]" (and sb3-contrib for the recurrent row).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from harness import alternating, markdown_table, median

HERE = Path(__file__).parent
ROOT = HERE.parent


def tasks(quick: bool) -> list[tuple[str, str, str, str]]:
    """(label, script, child task, child argument); every row measures steps per second."""
    return [
        ("PPO, CartPole-v1, rl-zoo settings", "ppo_vs_sb3.py", "sps-cartpole", "20000" if quick else "50000"),
        ("PPO, Hopper-v5, SB3 defaults", "ppo_vs_sb3.py", "sps-hopper", "6144" if quick else "20480"),
        ("SAC, Pendulum-v1, 1 thread", "sac_vs_sb3.py", "sps", "1:1000" if quick else "1:3000"),
        (
            "APPO, CartPole-v1, preset, single (no SB3 APPO)",
            "ppo_vs_sb3.py",
            "sps-appo-cartpole",
            "20000" if quick else "50000",
        ),
        ("PPO, ALE/Breakout-v5, Atari settings", "atari_vs_sb3.py", "sps", "2" if quick else "3"),
        (
            "recurrent PPO (LSTM), CartPole without velocities",
            "recurrent_vs_sb3.py",
            "sps",
            "5120" if quick else "10240",
        ),
    ]


def export(ref: str, into: Path) -> Path:
    """The ``src/`` directory of commit ``ref``, unpacked under ``into``."""
    archive = into / "src.tar"
    subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive), ref, "src"], check=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def measure(script: str, lib: str, task: str, seed: int, arg: str, src: Path) -> dict:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(src), str(HERE)])}
    out = subprocess.run(
        [sys.executable, str(HERE / script), "--child", lib, task, str(seed), arg],
        capture_output=True,
        text=True,
        env=env,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{script} {lib} {task} seed {seed} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("base", help="the earlier commit (any git ref)")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="", help="run only the tasks whose label contains this text")
    parser.add_argument("--repeats", type=int, default=None, help="runs of each (3; 2 with --quick)")
    args = parser.parse_args()
    repeats = args.repeats or (2 if args.quick else 3)
    with tempfile.TemporaryDirectory() as tmp:
        base_src = export(args.base, Path(tmp))
        sources = {"this tree": ROOT / "src", args.base: base_src}
        rows = []
        for label, script, task, arg in tasks(args.quick):
            if args.only not in label:
                continue
            print(f"{label} ...", flush=True)
            names = [*sources] if "no SB3" in label else [*sources, "sb3"]
            sps: dict[str, list[float]] = {name: [] for name in names}
            for i, name in enumerate(alternating(list(sps), repeats)):
                seed = i // len(sps)
                lib, src = ("sb3", sources["this tree"]) if name == "sb3" else ("distrl", sources[name])
                result = measure(script, lib, task, seed, arg, src)
                sps[name].append(result["sps"])
                print(f"  {name:10s} seed {seed}: {result['sps']:,.1f} SPS, {result['max_rss_mb']:.0f} MB", flush=True)
            head, base = (median(sps[name]) for name in sources)
            sb3 = median(sps["sb3"]) if "sb3" in sps else None
            versus_sb3 = ("—", "—", "—") if sb3 is None else (f"{sb3:,.0f}", f"{head / sb3:.2f}x", f"{base / sb3:.2f}x")
            rows.append([label, f"{head:,.0f}", f"{base:,.0f}", versus_sb3[0], f"{head / base:.2f}x", *versus_sb3[1:]])
    header = [
        "SPS, median",
        "this tree",
        args.base,
        "stable-baselines3",
        "this tree / earlier",
        "this tree / SB3",
        "earlier / SB3",
    ]
    print("\n".join(markdown_table(header, rows)))


if __name__ == "__main__":
    main()
