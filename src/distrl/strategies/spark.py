"""Train with ``ddp`` on Spark, through Spark's TorchDistributor (``pip install 'distrl[spark]'``).

    from distrl.strategies.spark import session, train

    with session("local[2]") as spark:
        summary = train(spark, "ppo", "CartPole-v1", workers=2, local_mode=True, total_steps=50_000)

``train`` takes the place of ``HorovodRunner(np=N).run(train_fn, **kwargs)``: N ranks run
distrl's ddp strategy, rank 0 writes the run directory, and the call returns the run's
summary (the dict in summary.json).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from distrl.config import ConfigError, RunConfig, StrategyConfig, split_by_config
from distrl.envs.names import resolve_env_id
from distrl.run.rundir import default_run_dir
from distrl.strategies.launch import WorkerFailed, check_before_launch
from distrl.strategies.spark_engine import launch_spark
from distrl.strategies.spark_engine import spark_session as session
from distrl.training.presets import algo_configs

__all__ = ["WorkerFailed", "session", "train"]


def train(
    spark: Any,
    algo: str,
    env: str,
    *,
    workers: int = 2,
    local_mode: bool = True,
    preset: str = "auto",
    **hyperparameters: Any,
) -> dict[str, Any]:
    """Train ``algo`` on ``env`` with ``workers`` ranks started by TorchDistributor; returns the summary.

    Args:
        spark: an active SparkSession (``session(master)`` makes one).
        workers: ranks (TorchDistributor's ``num_processes``).
        local_mode: ranks on the driver (True) or in Spark tasks on the executors (False).
        preset: 'auto' (the env's tuned preset), 'none' or a preset name, as on the command line.
        **hyperparameters: fields of the algorithm's config (n_steps, learning_rate, ...), of
            :class:`~distrl.config.RunConfig` (total_steps, seed, run_dir, ...) and of
            :class:`~distrl.config.StrategyConfig` (scaling, sync_frac, timeout_s, strategy).

    Raises:
        ConfigError: bad input, or more workers than free task slots, before any job starts.
        WorkerFailed: a rank failed; the message names it and its exception.
    """
    run_values, strategy_values, params = split_by_config(hyperparameters, RunConfig, StrategyConfig)
    for name in ("workers", "launcher", "spark_local_mode"):
        if name in strategy_values:
            raise ConfigError(
                f"{name}={strategy_values[name]!r} is not a hyperparameter here: "
                "train() sets it from its own arguments (workers=, local_mode=)"
            )
    run_values.setdefault("quiet", True)
    run, cfg, _ = algo_configs(algo, env, preset, run_values, params)
    if not run.run_dir:
        run = run.replace(run_dir=str(default_run_dir(run, resolve_env_id(run.env))))
    strategy = StrategyConfig(
        **{"strategy": "ddp", **strategy_values}, workers=workers, launcher="spark", spark_local_mode=local_mode
    )
    check_before_launch(run, strategy, cfg, None)
    Path(run.run_dir).parent.mkdir(parents=True, exist_ok=True)
    return launch_spark(spark, run, strategy, cfg, local_mode=local_mode)
