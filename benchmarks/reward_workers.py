"""GRPO's reward worker processes against scoring in the learner's process, on grpo_vs_trl.py's reversal task.

    python benchmarks/reward_workers.py                  # writes its section of docs/benchmarks.md
    python benchmarks/reward_workers.py --repeats 1 --max-steps 3 --no-write

Model, prompts and settings are those of ``grpo_vs_trl.py`` (its docstring), with ``--strategy single`` (scoring
sits between generation and learning) and a fixed number of steps. Three rewards: ``distrl_lm:reversal``
(microseconds a batch: what the pool's messaging costs), ``bench_rewards:waiting`` (the same after sleeping 5 ms
per sample: a remote judge, a sandbox round trip) and ``bench_rewards:computing`` (after 5 ms of busy CPU per
sample); each with ``--reward-workers 0`` (one call per batch, in the learner's process) and ``2`` (two
processes, one call per sample, each with its timeout). Reported: completions per second over the training
loop, scoring's share of it, and the peak PSS of the run's process tree. Each run has its own subprocess;
configurations alternate; round k runs seed k in each; medians.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from pathlib import Path

from grpo_vs_trl import TASKS, distrl_command, distrl_result, run_measured
from harness import alternating, markdown_table, median, write_section

REWARDS = {
    "reversal": "distrl_lm:reversal",
    "reversal + 5 ms wait per sample": "bench_rewards:waiting",
    "reversal + 5 ms CPU per sample": "bench_rewards:computing",
}
WORKERS = {"in the learner's process": "0", "2 reward workers": "2"}


def section(results: dict[tuple[str, str], list[dict]], repeats: int, max_steps: int, batch: int) -> str:
    def m(config: tuple[str, str], key: str) -> float | None:
        return median([r[key] for r in results[config]])

    rows = []
    for reward, workers in results:
        rate, in_process = (
            m((reward, workers), "completions_per_s"),
            m((reward, next(iter(WORKERS))), "completions_per_s"),
        )
        rows.append(
            [
                reward,
                workers,
                f"{rate:,.0f}",
                f"{rate / in_process:.2f}×",
                f"{(m((reward, workers), 'score_s') or 0.0) / (m((reward, workers), 'train_s') or 1.0):.0%}",
                f"{m((reward, workers), 'peak_pss_mb') or 0:,.0f}",
            ]
        )
    return "\n".join(
        [
            f"`python benchmarks/reward_workers.py` — {time.strftime('%Y-%m-%d')}, 2-core machine, nothing else "
            f"running; {repeats} runs each (seeds 0-{repeats - 1}), alternating, medians; {max_steps} learner steps "
            f"of {batch} completions, --strategy single. Model, data and settings: the script's docstring.",
            "",
            *markdown_table(
                [
                    "reward",
                    "scored",
                    "completions/s",
                    "vs in the learner's process",
                    "scoring's share",
                    "peak PSS MB (all processes)",
                ],
                rows,
            ),
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=50)
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    from distrl_lm import DIGITS, make_model, write_reversal

    task = TASKS["reversal"]
    configs = [(reward, workers) for reward in REWARDS for workers in WORKERS]
    results: dict[tuple[str, str], list[dict]] = {config: [] for config in configs}
    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", chars=DIGITS, hidden=task.hidden, layers=task.layers)
        data = write_reversal(Path(tmp) / "reverse.jsonl")
        for reward, workers in alternating(configs, args.repeats):
            seed = len(results[reward, workers])  # round k: seed k
            flags = ["--strategy", "single", "--reward-workers", WORKERS[workers]]
            scored = dataclasses.replace(task, reward=REWARDS[reward], target=None)
            with tempfile.TemporaryDirectory() as run_tmp:
                run_dir = Path(run_tmp) / "run"
                cmd = distrl_command(scored, model, data, args.max_steps, str(run_dir), seed, flags)
                _, peak = run_measured(f"{reward}, {workers}", cmd)
                r = {**distrl_result(run_dir), "peak_pss_mb": peak}
            results[reward, workers].append(r)
            print(reward, workers, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    body = section(results, args.repeats, args.max_steps, task.group * task.prompts)
    if args.no_write:
        print(body)
    else:
        write_section("GRPO reward workers: processes against the learner's process", body)


if __name__ == "__main__":
    main()
