"""Spark as a launcher: TorchDistributor starts the ranks, :mod:`distrl.strategies.ddp` does the rest.

``pyspark.ml.torch.distributor.TorchDistributor`` runs a picklable function under torchrun,
either on the Spark driver (``local_mode=True``) or in one barrier task per rank on the
executors (``local_mode=False``). Each rank receives torchrun's ``env://`` variables and
calls the same :func:`~distrl.strategies.ddp.run_worker` as every other launcher.

What TorchDistributor does not do, this module does: it checks for free task slots before
asking for a barrier stage (one that cannot be scheduled waits forever), points local
executors at this Python, and turns a failed run into an error naming the rank and its
exception (TorchDistributor reports only a failed command with its last output lines).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import traceback
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from distrl.config import ConfigError, RunConfig, StrategyConfig
from distrl.strategies.launch import WorkerFailed, blame

RANK_ERROR = "distrl-rank-error: "
"""Prefix of the one JSON line a failing rank prints; the launcher finds it in the run's output."""


def require_spark() -> None:
    """Fail with the install hint unless pyspark and a Java runtime are present."""
    try:
        import pyspark  # noqa: F401
    except ImportError:
        raise ConfigError("launcher='spark' needs pyspark: pip install 'distrl[spark]'") from None
    java_home = os.environ.get("JAVA_HOME")
    if not shutil.which("java") and not (java_home and Path(java_home, "bin", "java").exists()):
        raise ConfigError("launcher='spark' needs a Java runtime (17 or newer) on PATH or in JAVA_HOME")


@contextlib.contextmanager
def spark_session(master: str, app_name: str = "distrl") -> Iterator[Any]:
    """A SparkSession for ``master`` that stops on exit; local masters run executors on this Python."""
    require_spark()
    from pyspark.sql import SparkSession

    local = master.startswith("local")
    if local:  # executors otherwise start `python3` from PATH, which may lack distrl
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    builder = SparkSession.builder.master(master).appName(app_name).config("spark.ui.enabled", "false")
    if local:
        builder = builder.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    try:
        yield spark
    finally:
        spark.stop()


def task_slots(spark: Any) -> tuple[int, int]:
    """(all task slots, slots busy with running tasks) of ``spark``'s application."""
    sc = spark.sparkContext
    cpus_per_task = int(sc.getConf().get("spark.task.cpus", "1"))
    match = re.fullmatch(r"local(?:\[(\*|\d+)(?:,\d+)?\])?", sc.master)
    if match:
        n = match.group(1)
        cores = 1 if n is None else (os.cpu_count() or 1) if n == "*" else int(n)
    else:  # a cluster: Spark's default parallelism is the executors' total cores
        cores = sc.defaultParallelism
    tracker = sc.statusTracker()
    busy = 0
    for stage_id in tracker.getActiveStageIds():
        info = tracker.getStageInfo(stage_id)
        busy += info.numActiveTasks if info is not None else 0
    return cores // cpus_per_task, busy


def check_spark(spark: Any, workers: int, local_mode: bool) -> None:
    """Clear errors, before any job starts, for what would otherwise hang or fail deep inside Spark."""
    if local_mode:
        return
    total, busy = task_slots(spark)
    free = total - busy
    if workers > free:
        raise ConfigError(
            f"workers={workers} is not allowed: must be <= {free}, the free Spark task slots of "
            f"master {spark.sparkContext.master} ({total} slots, {busy} busy); a barrier stage "
            "waits for all its slots at once"
        )
    python = spark.sparkContext.pythonExec
    if spark.sparkContext.master.startswith("local") and shutil.which(python) != sys.executable:
        raise ConfigError(
            f"spark executors run python={python!r}, not this Python {sys.executable!r}: set "
            "PYSPARK_PYTHON to it before the SparkSession starts (distrl's spark_session does)"
        )


def launch_spark(
    spark: Any,
    run: RunConfig,
    strategy: StrategyConfig,
    cfg: Any,
    resume_path: Path | None = None,
    local_mode: bool = True,
) -> dict[str, Any]:
    """Train ``strategy.workers`` ranks through TorchDistributor; returns rank 0's summary."""
    from pyspark.ml.torch.distributor import TorchDistributor

    check_spark(spark, strategy.workers, local_mode)
    run = run.replace(run_dir=str(Path(run.run_dir).resolve()))  # ranks may start in another directory
    distributor = TorchDistributor(num_processes=strategy.workers, local_mode=local_mode, use_gpu=run.device == "cuda")
    resume = str(resume_path) if resume_path is not None else None
    reports: list[str] = []
    try:
        with _watch_output(reports):
            summary = distributor.run(spark_rank, run, strategy, cfg, run.run_dir, resume)
    except Exception as exc:  # noqa: BLE001 - any failure of the job becomes one line naming the rank
        raise WorkerFailed(describe_failure(exc, strategy.workers, reports)) from None
    if not isinstance(summary, dict):
        # on the driver every rank writes the same output file and the last one wins; rank 0
        # wrote the summary into the run directory, which the driver shares with it
        summary = json.loads((Path(run.run_dir) / "summary.json").read_text())
    return summary


def spark_rank(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: str, resume: str | None
) -> dict[str, Any] | None:
    """One rank under torchrun; on failure prints a line the launcher reads back, then re-raises."""
    from distrl.strategies.ddp import run_worker

    try:
        return run_worker(run, strategy, cfg, Path(run_dir), Path(resume) if resume else None)
    except BaseException as exc:
        traceback.print_exc()
        sys.stderr.flush()
        report = {"rank": int(os.environ.get("RANK", "-1")), "error": f"{type(exc).__name__}: {exc}"}
        print(RANK_ERROR + json.dumps(report), flush=True)
        raise


class _Tee:
    """A text stream that passes everything on and keeps the lines holding a rank's error report."""

    def __init__(self, stream: Any, found: list[str]):
        self._stream, self._found = stream, found

    def write(self, text: str) -> int:
        if RANK_ERROR in text:
            self._found.extend(line for line in text.splitlines() if RANK_ERROR in line)
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _watch_output(found: list[str]) -> Iterator[None]:
    """Collect report lines from the ranks' output, which TorchDistributor copies to this process's
    stdout (ranks on the driver) or stderr (ranks on executors, through its log stream)."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Tee(sys.stdout, found), _Tee(sys.stderr, found)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def describe_failure(exc: BaseException, workers: int, output: Sequence[str] = ()) -> str:
    """One line for a failed TorchDistributor run: the first rank that reported an exception, else its output."""
    text = _all_text(exc)
    reports: list[dict[str, Any]] = []
    decoder = json.JSONDecoder()
    for line in [*output, *text.splitlines()]:
        at = line.find(RANK_ERROR)
        if at < 0:
            continue
        with contextlib.suppress(ValueError):
            report, _ = decoder.raw_decode(line[at + len(RANK_ERROR) :])
            if report not in reports:
                reports.append(report)
    if reports:
        # reversed: when a rank reported twice, its first report is the one kept
        return blame({r["rank"]: f"of {workers} failed under Spark: {r['error']}" for r in reversed(reports)})
    lines = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("at ")]
    errors = [line for line in lines if "Error" in line or "Exception" in line]
    last = errors[-1] if errors else (lines[-1] if lines else type(exc).__name__)
    return f"the Spark run of {workers} ranks failed and no rank reported an exception: {last}"


def _all_text(exc: BaseException) -> str:
    """The messages of ``exc`` and its causes (Spark wraps the task's Python error in a Java one)."""
    parts, seen = [], set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        parts.append(str(current))
        current = current.__cause__ or current.__context__
    return "\n".join(parts)
