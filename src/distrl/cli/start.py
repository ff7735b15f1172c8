"""A ``distrl train`` run started on its strategy: the strategy refused before any process starts if it does not run
the algorithm, then the ranks launched (``ddp``, ``decoupled``) or the learner run in this process (``single``, and
``actor-learner`` and ``pipeline`` with their workers), a failure elsewhere told on one line."""

from __future__ import annotations

import os
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from distrl.config import OFFLINE_CONFIGS, ONLINE_ONLY, ConfigError, RunConfig, StrategyConfig, check_decoupled
from distrl.run import checkpoint, preemption, rundir

ASYNC_ALGOS = ("ppo", "appo", "impala")
"""The algorithms ``--strategy pipeline`` trains on Gymnasium envs: asynchronous actors, a learner that never waits."""

TASK_ALGOS = ("grpo",)
"""The algorithms that train on group tasks (:mod:`distrl.tasks`), not on Gymnasium envs: ENV is the task's name as
it stands, not an id to resolve, and a language model's run (``--model``) or a resumed run needs none."""

TASK_STRATEGIES = ("single", "ddp", "pipeline")
"""The strategies that train :data:`TASK_ALGOS` (``pipeline``: generators and a scorer feed the learner groups)."""

Runner = Callable[[RunConfig, StrategyConfig, Any, Path, Path | None], Any]
"""A strategy that runs the learner in this process: (run, strategy, algorithm config, run directory, checkpoint to
resume from) -> the run's summary."""


def check_strategy(algo: str, strategy: str) -> None:
    """Refuse a strategy that does not run ``algo``, before the run directory is made."""
    if algo in TASK_ALGOS and strategy not in TASK_STRATEGIES:
        raise ConfigError(
            f"strategy={strategy!r} is not available for {algo}: must be {', '.join(TASK_STRATEGIES[:-1])} or "
            f"{TASK_STRATEGIES[-1]}"
        )
    if strategy == "decoupled":
        check_decoupled(algo)
    if algo in ONLINE_ONLY and strategy != "single":
        raise ConfigError(f"strategy={strategy!r} is not available for {algo}: it runs in one process (single)")
    if algo in OFFLINE_CONFIGS and strategy not in ("single", "ddp"):
        raise ConfigError(
            f"strategy={strategy!r} is not available for {algo}: it learns from a dataset, under single or ddp"
        )
    if strategy == "pipeline" and algo not in (*ASYNC_ALGOS, *TASK_ALGOS):
        raise ConfigError(
            f"strategy='pipeline' is not available for {algo}: it runs {', '.join(ASYNC_ALGOS)} on Gymnasium "
            "envs and grpo on group tasks (distrl train grpo bandit --strategy pipeline)"
        )


def start_run(
    algo: str, run: RunConfig, strategy: StrategyConfig, cfg: Any, resume_path: Path | None, command: list[str]
) -> int:
    """Train ``algo`` under ``strategy`` in ``run.run_dir``: launch its ranks (``ddp``, ``decoupled``; ``command``
    is what each runs), or run its learner here, fed by this process (``single``) or by workers (``actor-learner``,
    ``pipeline``). A worker that failed, a reward function that did or a Ray node that went down is told on one line,
    with exit status 1."""
    if algo == "sac" and cfg.init_from:  # before any process starts
        from distrl.training.init_from import check_strategy as check_init_from

        check_init_from(cfg.init_from, strategy.strategy)
    if strategy.strategy in ("ddp", "decoupled"):
        run_ddp(run, strategy, cfg, resume_path, [*command, "--run-dir", run.run_dir])
        return 0
    from distrl.strategies.actor_learner import WorkerError
    from distrl.strategies.actors import RayNodeDown
    from distrl.strategies.pipeline import RewardFailed
    from distrl.strategies.pool import GeneratorFailed, PipelineStalled
    from distrl.tasks.rewards import RewardError

    run_dir = Path(run.run_dir)
    checkpoint.check_new_run_dir(run_dir, resume_path)
    if algo in TASK_ALGOS or algo in OFFLINE_CONFIGS:  # the dataset (and a task's rewards, prompts), before any process
        from distrl.training import TRAINERS  # torch and the trainers load once the flags are known to be good

        TRAINERS[algo].check_env(run, cfg)
    try:
        learner_here(algo, strategy.strategy)(run, strategy, cfg, run_dir, resume_path)
    except (WorkerError, GeneratorFailed, PipelineStalled, RewardError, RewardFailed, RayNodeDown) as exc:
        print(f"distrl: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    return 0


def learner_here(algo: str, strategy: str) -> Runner:
    """What runs ``algo``'s learner in this process under ``strategy`` (``single``, ``actor-learner``, ``pipeline``)."""
    if strategy == "single":
        return run_training
    if strategy == "pipeline" and algo in TASK_ALGOS:
        from distrl.strategies.pipeline import run_pipeline

        return run_pipeline
    if strategy == "pipeline":
        from distrl.strategies.pipeline_ppo import run_async_ppo

        return run_async_ppo
    if algo in ("dqn", "sac"):  # distributed prioritised replay (Ape-X)
        from distrl.strategies.apex import run_apex

        return run_apex
    from distrl.strategies.actor_learner import run_actor_learner

    return run_actor_learner


def run_training(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, run_dir: Path, resume_path: Path | None = None
) -> dict:
    """``--strategy single``: train in this process and write ``run_dir``. Nothing is spread, so the trainer runs
    with the default strategy settings, whatever other strategy flags were given."""
    start = time.perf_counter()
    from distrl.training import make_trainer

    return make_trainer(run.algo, run, cfg, run_dir=run_dir).run_to_end(resume_path, start)


def run_ddp(
    run: RunConfig, strategy: StrategyConfig, cfg: Any, resume_path: Path | None, argv: list[str]
) -> dict | None:
    """``--strategy ddp`` or ``decoupled``: be one rank (under a launcher or torchrun), or launch the ranks."""
    from distrl.strategies import launch
    from distrl.strategies.ddp import in_distributed_env, run_worker

    run_dir = Path(run.run_dir)
    if in_distributed_env():
        return _as_rank(run_dir, run_worker, run, strategy, cfg, run_dir, resume_path)
    launch.check_before_launch(run, strategy, cfg, resume_path)
    try:
        if strategy.launcher == "spark":
            from distrl.strategies.spark_engine import launch_spark, spark_session

            with spark_session(strategy.spark_master or f"local[{strategy.workers}]") as spark:
                return launch_spark(spark, run, strategy, cfg, resume_path, local_mode=strategy.spark_local_mode)
        if strategy.uses_ray:
            from distrl.strategies.ray_launch import launch_ray

            return launch_ray(
                run_worker,
                (run, strategy, cfg, run_dir, resume_path),
                strategy.workers,
                strategy.ray_address,
                run_dir,
                strategy.timeout_s,
                debug=run.debug,
            )
        from distrl.cli import main

        entry = main if launch.fork_ranks(run.device) else None  # ranks forked from here, warm, on CPU
        launch.launch_local(argv, strategy.workers, strategy.timeout_s, entry)
    except launch.WorkerFailed as exc:
        print(f"distrl: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    return None


def _as_rank(run_dir: Path, fn, *args):  # noqa: ANN001, ANN202
    """Run a rank's work; report an exception on one line naming the rank, then fail (a user's mistake, a stop
    on a signal and a failed write of ``run_dir`` go up, to be told as they are in one process)."""
    rank = os.environ.get("RANK", "?")
    try:
        return fn(*args)
    except (ConfigError, preemption.Stopped):
        raise
    except Exception as exc:  # noqa: BLE001 - a rank's failure must name the rank
        if rundir.write_failure(exc, run_dir) is not None:
            raise
        traceback.print_exc()
        print(f"distrl: error: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
