"""``distrl train ALGO ENV``: the flags of each algorithm, read over the preset or the resumed run's own settings;
the run is started on its strategy by :mod:`distrl.cli.start`."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tyro

from distrl.cli import ALGOS, start
from distrl.config import (
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
    on_task = algo in start.TASK_ALGOS
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
        if on_task or run_cfg.algo in start.TASK_ALGOS:  # group tasks are names, not Gymnasium ids
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
    start.check_strategy(algo, flag_value(rest, "--strategy") or strategy.strategy)  # before the flags' own checks
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
            return start.start_run(algo, run, args.strategy, algo_cfg, resume_path, command)
        except OSError as exc:
            failure = rundir.write_failure(exc, run_dir)
            if failure is None:
                raise
            raise failure from None
