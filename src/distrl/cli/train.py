"""``distrl train ALGO ENV``: the flags of each algorithm, and the run started on the chosen strategy."""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from distrl.cli import ALGOS
from distrl.config import (
    OFFLINE_CONFIGS,
    ONLINE_ONLY,
    APPOConfig,
    BCConfig,
    ConfigError,
    CQLConfig,
    DQNConfig,
    GRPOConfig,
    IMPALAConfig,
    IQLConfig,
    PPOConfig,
    REINFORCEConfig,
    RunConfig,
    SACConfig,
    StrategyConfig,
    TD3BCConfig,
    TD3Config,
    check_decoupled,
    unknown_algo,
)
from distrl.config.argv import checkpoint_every_time, flag_value, merge_repeated, no_action_mask, parse_flags, set_flag
from distrl.run import checkpoint, preemption, rundir, trust
from distrl.run.rundir import default_run_dir
from distrl.tasks.names import TEXT_TASK
from distrl.training.fallbacks import fallback_for_run, has_fallbacks
from distrl.training.presets import algo_configs, preset_names


@dataclass(frozen=True, kw_only=True)
class TrainFlags:
    trust_code: bool = False
    """With --resume: allow the code the run's config names (its env entry point, wrappers, policy factory)
    to be imported and run; without it, resuming a run that names code you did not pass again stops."""


@dataclass(frozen=True)
class PPOTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    ppo: PPOConfig


@dataclass(frozen=True)
class APPOTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    appo: APPOConfig


@dataclass(frozen=True)
class IMPALATrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    impala: IMPALAConfig


@dataclass(frozen=True)
class SACTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    sac: SACConfig


@dataclass(frozen=True)
class DQNTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    dqn: DQNConfig


@dataclass(frozen=True)
class REINFORCETrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    reinforce: REINFORCEConfig


@dataclass(frozen=True)
class GRPOTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    grpo: GRPOConfig


@dataclass(frozen=True)
class BCTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    bc: BCConfig


@dataclass(frozen=True)
class TD3BCTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    td3bc: TD3BCConfig


@dataclass(frozen=True)
class IQLTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    iql: IQLConfig


@dataclass(frozen=True)
class TD3TrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    td3: TD3Config


@dataclass(frozen=True)
class CQLTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    cql: CQLConfig


TRAIN_ARGS = {
    "ppo": PPOTrainArgs,
    "appo": APPOTrainArgs,
    "impala": IMPALATrainArgs,
    "sac": SACTrainArgs,
    "dqn": DQNTrainArgs,
    "reinforce": REINFORCETrainArgs,
    "grpo": GRPOTrainArgs,
    "bc": BCTrainArgs,
    "td3bc": TD3BCTrainArgs,
    "iql": IQLTrainArgs,
    "cql": CQLTrainArgs,
    "td3": TD3TrainArgs,
}


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


def default_strategy(algo: str, argv: list[str]) -> StrategyConfig:
    """What a run spreads over unless its flags (``argv``) name a strategy: APPO and IMPALA are asynchronous by
    design, so two actors feed their learner (``--strategy pipeline --workers 2``); the rest run in one process."""
    if algo in ("appo", "impala") and flag_value(argv, "--strategy") is None:
        return StrategyConfig(strategy="pipeline", workers=2)
    return StrategyConfig()


def train_command(argv: list[str]) -> int:
    """``distrl train ALGO ENV [flags]`` (``argv`` starts at ALGO): SIGTERM and SIGINT stop it at a checkpoint."""
    with preemption.stop_signals_caught():
        return _train_command(argv)


def _train_command(argv: list[str]) -> int:
    fresh_auto = False  # --resume auto found nothing to continue: the run starts fresh
    if flag_value(argv, "--resume") == "auto":
        found = checkpoint.auto_resume(flag_value(argv, "--run-dir"))
        argv, fresh_auto = set_flag(argv, "--resume", found), not found
    resume_arg = flag_value(argv, "--resume")
    resume_path = None
    recorded = None  # the resumed run's own configs, read once from its newest intact checkpoint
    if resume_arg:
        # reading a run back (its spaces, the code it names) loads Gymnasium; parsing a new run's flags does not
        from distrl.training.recorded import configs_from_checkpoint

        resume_path = checkpoint.newest_intact(Path(resume_arg))
        recorded = configs_from_checkpoint(resume_path)
    recorded_env = False  # ENV read from the resumed run is not the user's say-so to import what it names
    if argv[0].startswith("-"):  # `distrl train --resume RUN [flags]`: the algorithm and env are the run's
        if recorded is None:
            if fresh_auto:
                raise ConfigError(
                    f"run_dir={flag_value(argv, '--run-dir')!r} holds no checkpoint to continue: name the algorithm "
                    "and env to start it (distrl train ALGO ENV --resume auto --run-dir DIR)"
                )
            raise unknown_algo(argv[0])
        argv = [recorded[0].algo, recorded[0].env, *argv]
        recorded_env = True
    algo = argv[0]
    if algo not in ALGOS:
        raise unknown_algo(algo)
    on_task = algo in TASK_ALGOS
    if len(argv) < 2 or argv[1].startswith("-"):
        if on_task and any(a == "--model" or a.startswith("--model=") for a in argv):
            argv = [algo, TEXT_TASK, *argv[1:]]  # a language model's run needs no ENV
        elif recorded is not None:
            argv = [algo, recorded[0].env, *argv[1:]]
            recorded_env = True
        elif any(a in ("-h", "--help") for a in argv):
            argv = [algo, TEXT_TASK if on_task else "CartPole-v1", *argv[1:]]
        else:
            raise ConfigError(f"ENV is missing: distrl train {algo} ENV [flags], e.g. distrl train {algo} CartPole-v1")
    env, rest = argv[1], merge_repeated(argv[2:], "--wrapper", "--wrappers")
    rest = merge_repeated(merge_repeated(rest, "--reward", "--rewards"), "--track", "--track")
    rest = no_action_mask(checkpoint_every_time(rest))
    strategy = default_strategy(algo, rest)
    if recorded is not None:
        from distrl.envs.names import portable_env_name, refuse_named_code, resolve_env_id

        assert resume_path is not None and resume_arg
        run_cfg, strategy, cfg, state = recorded
        trusted = "--trust-code" in rest or trust.is_trusted(resume_path, state)
        own = rest if recorded_env else [env, *rest]
        refuse_named_code(run_cfg, f"checkpoint={str(resume_path)!r}", trusted, own=own, cfg=cfg)
        if on_task or run_cfg.algo in TASK_ALGOS:  # group tasks are names, not Gymnasium ids
            if env != run_cfg.env:
                raise ConfigError(f"env={env!r} differs from the resumed run's env {run_cfg.env!r}")
        else:
            env_id = resolve_env_id(env)  # a run saved with a custom/ id takes its entry point from ENV
            if env_id != run_cfg.env and (run_cfg.env.startswith("custom/") or env_id != resolve_env_id(run_cfg.env)):
                raise ConfigError(f"env={env!r} differs from the resumed run's env {run_cfg.env!r}")
            run_cfg = run_cfg.replace(env=portable_env_name(env))
        home = checkpoint.run_dir_of(resume_path)  # a checkpoint from elsewhere starts a new run directory
        run_cfg = run_cfg.replace(resume=resume_arg, run_dir=str(home) if home is not None else "")
        if run_cfg.algo != algo:
            raise ConfigError(f"algo={algo!r} differs from the resumed run's algorithm {run_cfg.algo!r}")
    else:
        self_play = {"self_play": True} if "--self-play" in rest else None  # a game's preset under --self-play
        run_cfg, cfg, preset_name = algo_configs(
            algo, env, flag_value(rest, "--preset") or "auto", self_play, fallback=False
        )
    description = (
        f"Train {algo.upper()} on {run_cfg.env}. Defaults shown include the preset "
        f"(available: auto, none, {', '.join(preset_names(algo))}); flags override them."
    )
    if has_fallbacks(algo):
        description += " An env without one gets a fallback chosen from its spaces as the run starts (not shown here)."
    check_strategy(algo, flag_value(rest, "--strategy") or strategy.strategy)  # before the flags' own checks
    args_cls = TRAIN_ARGS[algo]

    def parse(algo_defaults: Any) -> Any:
        return parse_flags(
            tyro.conf.OmitArgPrefixes[args_cls],
            rest,
            default=args_cls(run_cfg, strategy, algo_defaults),
            prog=f"distrl train {algo} {env}",
            description=description,
        )

    args = parse(cfg)
    if recorded is None and preset_name == "none" and args.run.preset == "auto" and has_fallbacks(algo):
        # the env's spaces are read once the flags are known to be good (building the env loads its simulator),
        # and a second parse puts the flags over the fallback, as over a preset; the run's first line names it
        chosen = fallback_for_run(args.run).fallback
        if chosen is not None:
            args = parse(dataclasses.replace(cfg, **chosen.values))
    algo_cfg = getattr(args, algo)
    run = args.run
    if run.track:
        from distrl.run.tracking import check_trackers

        check_trackers(run.track)
    if not run.run_dir:  # every worker must agree on the run directory: fix it before launching
        from distrl.envs.names import resolve_env_id

        run = run.replace(run_dir=str(default_run_dir(run, run.env if on_task else resolve_env_id(run.env))))
    run_dir = Path(run.run_dir)
    command = ["train", algo, env, *rest]
    with checkpoint.removed_after_a_mistake(run_dir), rundir.held_here(run_dir, command):
        try:
            return _train(algo, run, args.strategy, algo_cfg, resume_path, command)
        except OSError as exc:
            failure = rundir.write_failure(exc, run_dir)
            if failure is None:
                raise
            raise failure from None


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


def _train(
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
            return launch.launch_ray(
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
