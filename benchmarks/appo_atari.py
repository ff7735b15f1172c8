"""APPO on Breakout with 2 actors against distrl's synchronous PPO and Sample Factory's APPO, in one run.

    python benchmarks/appo_atari.py              # 2 rounds; writes its section of docs/benchmarks.md
    python benchmarks/appo_atari.py --quick      # 1 round of 15k steps, prints the section, writes nothing

All three train ALE/Breakout-v5 (84x84 grey, 4 frames, frame skip 4, sticky actions 0.25) with the Nature CNN
and the same batching: 8 environments, fragments of 32 steps, one gradient step per 128 steps (one epoch; an
actor's fragment is 4 x 32 steps), float32 on the CPU:

- distrl APPO: ``distrl train appo ALE/Breakout-v5 --strategy pipeline --workers 2`` (2 actors of 4 envs; the
  learner trains on both actors' fragments per step, in two minibatches);
- distrl PPO, synchronous: ``distrl train ppo ALE/Breakout-v5 --strategy single`` (8 envs in this process,
  collect then update);
- Sample Factory 2.1.1's APPO (``sf_appo_atari.py``, in its own venv): 2 rollout workers of 4 envs with its
  double-buffered sampling, an inference worker and a learner, V-trace on.

SPS is agent steps (calls of the frame-skipped env's step) per second of training, start-up excluded: distrl's
``total_steps / train_s``, Sample Factory's learner count over its steady-state window. The three alternate
over ``--rounds``; medians are reported with the ratios.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from harness import alternating, markdown_table, median, write_section

HERE = Path(__file__).parent
ENV = "ALE/Breakout-v5"
SAME = [
    "--preset",
    "atari",
    "--n-steps",
    "32",
    "--batch-size",
    "128",
    "--n-epochs",
    "1",
    "--device",
    "cpu",
    "--eval-episodes",
    "1",
    "--eval-max-steps",
    "100",
]
DISTRL = {
    "distrl APPO, 2 actors": ["appo", ENV, *SAME, "--n-envs", "4", "--strategy", "pipeline", "--workers", "2"],
    "distrl PPO, synchronous": ["ppo", ENV, *SAME, "--n-envs", "8", "--strategy", "single"],
}
SF = "Sample Factory APPO, 2 workers"


def distrl_sps(args: list[str], steps: int, root: Path) -> float:
    run_dir = Path(tempfile.mkdtemp(dir=root))
    out = subprocess.run(
        [sys.executable, "-m", "distrl", "train", *args, "--total-steps", str(steps), "--quiet"]
        + ["--run-dir", str(run_dir / "run")],
        capture_output=True,
        text=True,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{args[:2]} failed:\n{out.stderr[-2000:]}")
    return json.loads((run_dir / "run" / "summary.json").read_text())["sps"]


def sample_factory_sps(python: str, steps: int, root: Path) -> float:
    result = root / "sf.json"
    command = [sys.executable, str(HERE / "sf_appo_atari.py"), "--python", python, "--steps", str(steps)]
    command += ["--workers", "2", "--envs-per-worker", "4", "--batch-size", "128", "--out", str(result)]
    out = subprocess.run(command, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"Sample Factory failed:\n{out.stderr[-2000:]}")
    return json.loads(result.read_text())["sps"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30_000, help="agent steps per run")
    parser.add_argument("--sf-python", default="/work/sfvenv/bin/python")
    args = parser.parse_args()
    rounds, steps = (1, 15_000) if args.quick else (args.rounds, args.steps)
    sps: dict[str, list[float]] = {name: [] for name in [*DISTRL, SF]}
    with tempfile.TemporaryDirectory() as tmp:
        for name in alternating(list(sps), rounds):
            if name == SF:
                value = sample_factory_sps(args.sf_python, steps, Path(tmp))
            else:
                value = distrl_sps(DISTRL[name], steps, Path(tmp))
            sps[name].append(value)
            print(f"  {name}: {value:.1f} SPS", flush=True)
    medians = {name: median(values) for name, values in sps.items()}
    appo = medians["distrl APPO, 2 actors"]
    rows = [
        [name, f"{medians[name]:.1f}", f"{appo / medians[name]:.2f}×", ", ".join(f"{v:.1f}" for v in values)]
        for name, values in sps.items()
    ]
    body = "\n".join(
        [
            f"ALE/Breakout-v5, Nature CNN, 8 envs, fragments of 32 steps, one gradient step per 128 steps, float32, "
            f"{steps:,} agent steps per run, {rounds} alternating rounds. Reproduce: `cd benchmarks && python "
            "appo_atari.py` (Sample Factory in its own venv: see `sf_appo_atari.py`).",
            "",
            *markdown_table(["run", "SPS (median)", "distrl APPO's advantage", "each round"], rows),
        ]
    )
    if args.quick:
        print(body)
    else:
        write_section("APPO on Breakout: 2 actors against synchronous PPO and Sample Factory", body)


if __name__ == "__main__":
    main()
