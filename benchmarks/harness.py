"""Shared pieces of the side-by-side benchmarks: one subprocess per measurement, alternation, medians,
and a section of docs/benchmarks.md rewritten in place."""

from __future__ import annotations

import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psutil

BENCHMARKS_MD = Path(__file__).parents[1] / "docs" / "benchmarks.md"
HERE = Path(__file__).parent
SRC = HERE.parent / "src"


def child_main(run: Callable[..., dict]) -> bool:
    """In a child (``--child LIB TASK SEED ARG``): run one measurement, print it as JSON with peak RSS."""
    if len(sys.argv) < 2 or sys.argv[1] != "--child":
        return False
    lib, task, seed, arg = sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    result = run(lib, task, seed, arg)
    result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))
    return True


def measure(script: str, lib: str, task: str, seed: int, arg: Any) -> dict:
    out = subprocess.run(
        [sys.executable, script, "--child", lib, task, str(seed), str(arg)], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(f"{lib} {task} seed {seed} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def train_at_once(runs: list[tuple[Path, list[str]]]) -> list[dict]:
    """Start ``distrl train ARGS --quiet --run-dir DIR`` for every ``(DIR, ARGS)`` at once, wait for all,
    and return their summary.json contents. Each run's stderr goes to a file beside its run dir (a pipe
    could fill up and stall a run) and is shown if the run fails."""
    procs = []
    for run_dir, args in runs:
        err = open(run_dir.parent / f"{run_dir.name}.stderr", "w+")  # noqa: SIM115 - closed below
        procs.append(
            (
                subprocess.Popen(
                    [sys.executable, "-m", "distrl", "train", *args, "--quiet", "--run-dir", str(run_dir)],
                    stdout=subprocess.DEVNULL,
                    stderr=err,
                ),
                err,
            )
        )
    for proc, err in procs:
        code = proc.wait()
        err.seek(0)
        message = err.read()
        err.close()
        if code != 0:
            raise RuntimeError(message or "run failed")
    return [json.loads((run_dir / "summary.json").read_text()) for run_dir, _ in runs]


def alternating(items: list, repeats: int):
    """``items`` ``repeats`` times, in reverse order every other round, so drift hits every item alike."""
    for i in range(repeats):
        yield from (items if i % 2 == 0 else items[::-1])


def markdown_table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + ["| " + " | ".join(r) + " |" for r in rows]


def alternate(
    script: str, task: str, repeats: int, arg: Any, key: str, libs: tuple[str, str]
) -> dict[str, dict[str, list]]:
    """Run ``task`` ``repeats`` times per library, alternating which goes first."""
    values: dict[str, list] = {lib: [] for lib in libs}
    rss: dict[str, list] = {lib: [] for lib in libs}
    for i, lib in enumerate(alternating(list(libs), repeats)):
        seed = i // len(libs)
        r = measure(script, lib, task, seed, arg)
        values[lib].append(r[key])
        rss[lib].append(r["max_rss_mb"])
        print(f"  {task} {lib:6s} seed {seed}: {key}={r[key]} rss={r['max_rss_mb']:.0f} MB", flush=True)
    return {"values": values, "rss": rss}


def compare_with_sb3(script: str, measures: list[tuple], repeats: int) -> list[tuple]:
    """Each of ``measures`` — (label, task, arg, key, higher is better, distrl's library name) — run by
    :func:`alternate` against ``sb3``: rows of (label, distrl median, SB3 median, distrl's advantage, peak RSS
    medians, raw results, distrl's library name) for :func:`comparison_table` and :func:`raw_values`."""
    rows = []
    for label, task, arg, key, higher, mine in measures:
        print(f"{label} ...", flush=True)
        res = alternate(script, task, repeats, arg, key, (mine, "sb3"))
        d, s = median(res["values"][mine]), median(res["values"]["sb3"])
        ratio = (d / s if higher else s / d) if d and s else None
        rows.append((label, d, s, ratio, median(res["rss"][mine]), median(res["rss"]["sb3"]), res, mine))
    return rows


def mm_gflops(m: int, k: int, n: int, count: int, onednn: bool = False) -> float:
    """GFLOP/s of ``count`` products of an m x k by a k x n matrix, back to back in this process's torch threads,
    after a tenth as many (at least 3) untimed: the rate an arithmetic ceiling is worked from. ``torch.mm`` (MKL on
    x86), or with ``onednn`` the oneDNN kernel of distrl's :class:`~distrl.nets.dense.Dense` layers."""
    import torch

    from distrl.nets.dense import times_transposed

    x, w, out = torch.randn(m, k), torch.randn(k, n), torch.empty(m, n)
    rows = w.t().contiguous()  # x @ rows.T: oneDNN's linear takes the weight as [n, k]

    def product() -> None:
        if onednn:
            times_transposed(x, rows)
        else:
            torch.mm(x, w, out=out)

    for _ in range(max(3, count // 10)):
        product()
    start = time.perf_counter()
    for _ in range(count):
        product()
    return count * 2 * m * k * n / (time.perf_counter() - start) / 1e9


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def paired_ratio(mine: list, theirs: list) -> float | None:
    """The median of ``mine[i] / theirs[i]``: each seed's two runs, which :func:`alternate` times one after the
    other, against each other. Where the host's speed drifts during a sitting, this moves less than the ratio of the
    two medians, which may take them from different minutes."""
    return median([m / t for m, t in zip(mine, theirs) if m is not None and t])


def write_section(title: str, body: str, out: Path = BENCHMARKS_MD) -> None:
    """Replace the ``## title`` section of ``out`` (or append it)."""
    section = f"## {title}\n\n{body.rstrip()}\n"
    text = out.read_text() if out.exists() else "# Benchmarks\n\nMeasured on the project's 2-core CI machines.\n"
    start = text.find(f"## {title}\n")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + ("\n" + text[end + 1 :] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    out.write_text(text)
    print(section)


def comparison_table(rows: list[tuple], fmt: Callable[[float | None], str]) -> list[str]:
    """Rows of (label, distrl, reference, advantage, rss distrl, rss reference, raw) as a markdown table."""
    lines = ["| measure | distrl | SB3 | distrl advantage | peak RSS distrl / SB3 (MB) |", "|---|---|---|---|---|"]
    for label, d, s, ratio, rss_d, rss_s, _ in rows:
        lines.append(
            f"| {label} | {fmt(d)} | {fmt(s)} | {'n/a' if ratio is None else f'{ratio:.2f}×'} | "
            f"{rss_d:.0f} / {rss_s:.0f} |"
        )
    return lines


def raw_values(rows: list[tuple], digits: int) -> str:
    """The "Raw values" line under a :func:`comparison_table`: every run of both libraries, per row
    (rows as there, with the raw results and distrl's library name appended)."""

    def show(values: list) -> list:
        return [None if v is None else round(v, digits) for v in values]

    return "- Raw values: " + "; ".join(
        f"{r[0]}: distrl {show(r[6]['values'][r[7]])}, SB3 {show(r[6]['values']['sb3'])}" for r in rows
    )


def sb3_seconds_to_target(
    model: Any, eval_env: Any, budget: int, every: int, target: float, before_eval: Callable[[], None] | None = None
) -> dict:
    """Train a stable-baselines3 (or sb3-contrib) model until a 10-episode deterministic evaluation every
    ``every`` steps reaches ``target``: training seconds with the evaluations left out (None when not
    reached within ``budget`` steps) and the steps taken. ``before_eval`` runs first (e.g. to copy
    observation statistics to the evaluation env)."""
    import time

    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.evaluation import evaluate_policy

    class EvalTimer(BaseCallback):
        def __init__(self) -> None:
            super().__init__()
            self.eval_s, self.next_eval, self.solved = 0.0, every, False

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += every
            start = time.perf_counter()
            if before_eval is not None:
                before_eval()
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=10, deterministic=True)
            self.eval_s += time.perf_counter() - start
            self.solved = mean >= target
            return not self.solved

    timer = EvalTimer()
    start = time.perf_counter()
    model.learn(budget, callback=timer)
    wall = time.perf_counter() - start
    return {"train_s": wall - timer.eval_s if timer.solved else None, "steps": model.num_timesteps}


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with src/ and benchmarks/ on PYTHONPATH: the Ray actors import slow_envs by name,
    and inherit it (from the driver when Ray is embedded, from the raylets on the two-node cluster)."""
    env = {**os.environ, **(extra or {})}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(SRC), str(HERE), env.get("PYTHONPATH", "")) if p)
    return env


class PeakMemory:
    """Samples, every ``every_s``, the RSS of the first root process and the sum over every root and all its
    descendants (the learner; Ray's GCS, raylets and actors). Sampling misses spikes shorter than ``every_s``."""

    def __init__(self, pids: list[int], every_s: float = 0.5):
        self.roots = [psutil.Process(pid) for pid in pids]
        self.every_s = every_s
        self.own_mb = self.tree_mb = 0.0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)
        self.thread.start()

    def _sample(self) -> None:
        while not self.stop.wait(self.every_s):
            own = tree = 0
            for i, root in enumerate(self.roots):
                try:
                    rss = root.memory_info().rss
                    children = root.children(recursive=True)
                except psutil.Error:  # the run itself has ended
                    if i == 0:
                        return
                    continue
                if i == 0:
                    own = rss
                tree += rss
                for child in children:
                    try:
                        tree += child.memory_info().rss
                    except psutil.Error:  # ended between the listing and the reading
                        pass
            self.own_mb = max(self.own_mb, own / 2**20)
            self.tree_mb = max(self.tree_mb, tree / 2**20)

    def close(self) -> None:
        self.stop.set()
        self.thread.join()


def measured_run(
    args: list[str], env: dict[str, str], label: str, timeout_s: float | None = None, *others: int
) -> dict:
    """``distrl train ARGS`` in its own process, its memory sampled (see :class:`PeakMemory`; ``others``: more
    process trees to count, such as a local Ray cluster's): its summary.json with the process's wall time, the
    peak RSS of the learner and of all its processes, and its stderr. A run past ``timeout_s`` is killed."""
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        with open(Path(tmp) / "stderr", "w+") as err:
            start = time.perf_counter()
            proc = subprocess.Popen(
                [sys.executable, "-m", "distrl", "train", *args, "--quiet", "--run-dir", str(run_dir)],
                stdout=subprocess.DEVNULL,
                stderr=err,  # a file, not a pipe: a full pipe would stall the run
                env=env,
            )
            memory = PeakMemory([proc.pid, *others])
            try:
                code = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                code = proc.wait()
                err.write(f"\n[{label}] killed after {timeout_s:.0f} s\n")
            memory.close()
            wall_s = time.perf_counter() - start
            err.seek(0)
            message = err.read()
        if code != 0:
            raise RuntimeError(f"{label} failed:\n{message[-3000:]}")
        summary = json.loads((run_dir / "summary.json").read_text())
    summary.update(
        process_wall_s=wall_s, learner_rss_mb=memory.own_mb, tree_rss_mb=memory.tree_mb, stderr=message.strip()[-3000:]
    )
    return summary
