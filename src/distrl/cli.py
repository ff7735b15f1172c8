"""The ``distrl`` command: train, eval, plot, bench.

User mistakes (a ConfigError) print one line on stderr and exit with status 2;
``--debug`` shows the traceback as well.
"""

from __future__ import annotations

import inspect
import json
import os
import sys
import time
import traceback
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import tyro

from distrl import __version__, checkpoint
from distrl.argv import flag_value, merge_repeated, parse_flags, set_flag
from distrl.config import (ConfigError, Device, GRPOConfig, PPOConfig, REINFORCEConfig, RunConfig, SACConfig,
                           StrategyConfig, Tracker)
from distrl.env_names import SHORT_NAMES, portable_env_name, refuse_named_code, resolve_env_id
from distrl.presets import algo_configs, preset_names
from distrl.tasks import TEXT_TASK
from distrl.training import configs_from_checkpoint, default_run_dir, make_trainer

ALGOS = ("ppo", "sac", "reinforce", "grpo")


def _flowing_help() -> None:
    """Let each field's docstring flow into one paragraph of ``--help``.

    tyro joins a docstring's lines unless a line starts with something other than a letter, and the
    continuation lines of an attribute docstring start with the source's indentation: every help text
    broke at the source's line ends. Removing the common indentation first (``inspect.cleandoc``) lets
    them join; a blank line still starts a new paragraph.
    """
    strings = getattr(tyro, "_strings", None)
    join = getattr(strings, "remove_single_line_breaks", None)
    if join is None or getattr(join, "flows", False):
        return

    def flowing(text: str) -> str:
        return join(inspect.cleandoc(text))

    flowing.flows = True  # type: ignore[attr-defined]
    strings.remove_single_line_breaks = flowing  # type: ignore[union-attr]


_flowing_help()

USAGE = """\
usage: distrl COMMAND ...

  distrl train ALGO ENV [flags]     train an agent; `distrl train ppo cartpole --help` lists the flags
  distrl eval RUN [flags]           evaluate a run directory or checkpoint; --record FILE.gif|.mp4
  distrl plot RUN [RUN ...] [flags] reward curves from Monitor files (distrl's or stable-baselines3's)
  distrl tune ALGO ENV [flags]      an Optuna study of ALGO's hyperparameters on ENV; writes best.json,
                                    a preset (distrl train ALGO ENV --preset best.json)
  distrl bench scaling ALGO ENV     the same training with 1, 2, ... workers, speedup against ideal

  distrl --version                  the installed version

ALGO: {algos}
ENV:  a Gymnasium id (CartPole-v1, Hopper-v5, ALE/Breakout-v5, ...), a short name
{short_names},
      package.module:ClassName (a gymnasium.Env subclass) or package.module:function
      (returning a gymnasium.Env); for grpo a language model, which needs no ENV:
      distrl train grpo --model DIR --dataset FILE.jsonl --reward NAME [--strategy pipeline],
      or a numeric group task: toy or bandit (distrl train grpo bandit --strategy pipeline)
"""


def usage() -> str:
    """The top-level help, listing every short name distrl resolves."""
    lines, line = [], "     "
    for name in SHORT_NAMES:
        if len(line) + len(name) + 2 > 90:
            lines.append(line.rstrip())
            line = "     "
        line += f" {name},"
    lines.append(line.rstrip(","))
    return USAGE.format(algos=", ".join(ALGOS), short_names="\n".join(lines))


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
class SACTrainArgs(TrainFlags):
    run: RunConfig
    strategy: StrategyConfig
    sac: SACConfig


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


TRAIN_ARGS = {"ppo": PPOTrainArgs, "sac": SACTrainArgs, "reinforce": REINFORCETrainArgs, "grpo": GRPOTrainArgs}


@dataclass(frozen=True)
class EvalArgs:
    """Evaluate a trained model: prints mean ± std of the return."""

    path: tyro.conf.Positional[str]
    """Run directory (its newest checkpoint) or checkpoint directory."""
    episodes: int = 10
    """Episodes to run."""
    stochastic: bool = False
    """Sample actions instead of taking the most likely one."""
    json: bool = False
    """Print one JSON line {"mean_return", "std_return", "episodes"}."""
    seed: int | None = None
    """Seed of the evaluation episodes (default: the run's evaluation seed)."""
    device: Device = "cpu"
    """Device to load the model on."""
    record: str = ""
    """Write a video of the episodes (.gif or .mp4) instead of only printing returns."""
    env: str = ""
    """Evaluate on this env (id, short name or package.module:Name) instead of the run's."""
    compare_untrained: bool = False
    """With --record: an untrained policy plays the same episodes beside the trained one."""
    track: tuple[Tracker, ...] = ()
    """With --record: also log the video to the run's tracked runs (wandb, mlflow), as its training did."""
    trust_code: bool = False
    """Allow the code the run's config names (its env entry point, wrappers, policy factory) to be imported
    and run; without it, a run that names code other than --env stops before importing anything."""
    debug: bool = False
    """Show full tracebacks for errors."""


@dataclass(frozen=True)
class PlotArgs:
    """Reward curves of one or more runs."""

    runs: tyro.conf.Positional[tuple[str, ...]]
    """Run directories or Monitor CSV files."""
    x: Literal["steps", "total-steps", "time"] = "steps"
    """steps: per process; total-steps: all processes; time: wall time."""
    smooth: int = 1
    """Moving average over this many episodes."""
    out: str = "reward_curves.png"
    """PNG to write."""
    title: str = "Episode return"
    """Figure title."""
    seeds: Literal["apart", "together"] = "apart"
    """together: runs whose config.json differ only in the seed are one curve, their mean, with the band from
    the lowest to the highest of them."""
    debug: bool = False
    """Show full tracebacks for errors."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        return _dispatch(argv)
    except ConfigError as exc:
        if "--debug" in argv:
            traceback.print_exc()
        print(f"distrl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("distrl: interrupted", file=sys.stderr)
        return 130


def _dispatch(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0 if argv else 2
    if argv[0] in ("--version", "-V"):
        print(f"distrl {__version__}")
        return 0
    command, rest = argv[0], argv[1:]
    if command == "train":
        return train_command(rest)
    if command == "eval":
        return eval_command(rest)
    if command == "plot":
        return plot_command(rest)
    if command == "tune":
        from distrl.tune.study import tune_command

        return tune_command(rest)
    if command == "bench":
        if not rest or rest[0] != "scaling":
            raise ConfigError(f"bench={rest[0] if rest else ''!r} is not known: must be scaling "
                              "(distrl bench scaling ALGO ENV --workers 1,2)")
        from distrl.bench import scaling_command

        return scaling_command(rest[1:])
    raise ConfigError(f"command={command!r} is not known: must be one of train, eval, plot, tune, bench, "
                      "--version")


def train_command(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    algo = argv[0]
    if algo not in ALGOS:
        raise ConfigError(f"algo={algo!r} is not known: must be one of {', '.join(ALGOS)}")
    if flag_value(argv, "--resume") == "auto":
        argv = set_flag(argv, "--resume", checkpoint.auto_resume(flag_value(argv, "--run-dir")))
    if len(argv) < 2 or argv[1].startswith("-"):
        resume = flag_value(argv, "--resume")
        if algo == "grpo" and any(a == "--model" or a.startswith("--model=") for a in argv):
            argv = [algo, TEXT_TASK, *argv[1:]]  # a language model's run needs no ENV
        elif algo == "grpo" and resume:
            argv = [algo, configs_from_checkpoint(checkpoint.find_latest(Path(resume)))[0].env, *argv[1:]]
        elif any(a in ("-h", "--help") for a in argv):
            argv = [algo, TEXT_TASK if algo == "grpo" else "CartPole-v1", *argv[1:]]
        else:
            raise ConfigError(f"ENV is missing: distrl train {algo} ENV [flags], e.g. distrl train {algo} CartPole-v1")
    env, rest = argv[1], merge_repeated(argv[2:], "--wrapper", "--wrappers")
    rest = merge_repeated(merge_repeated(rest, "--reward", "--rewards"), "--track", "--track")
    resume_arg = flag_value(rest, "--resume")
    resume_path = None
    strategy = StrategyConfig()
    if resume_arg:
        resume_path = checkpoint.find_latest(Path(resume_arg))
        run_cfg, strategy, cfg, _ = configs_from_checkpoint(resume_path)
        refuse_named_code(run_cfg, f"checkpoint={str(resume_path)!r}", "--trust-code" in rest, own=(env, *rest),
                          cfg=cfg)
        if algo == "grpo" or run_cfg.algo == "grpo":  # group tasks are names, not Gymnasium ids
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
        run_cfg, cfg, _ = algo_configs(algo, env, flag_value(rest, "--preset") or "auto")
    description = (f"Train {algo.upper()} on {run_cfg.env}. Defaults shown include the preset "
                   f"(available: auto, none, {', '.join(preset_names(algo))}); flags override them.")
    args_cls = TRAIN_ARGS[algo]
    args = parse_flags(tyro.conf.OmitArgPrefixes[args_cls], rest, default=args_cls(run_cfg, strategy, cfg),
                    prog=f"distrl train {algo} {env}", description=description)
    algo_cfg = getattr(args, algo)
    run = args.run
    if run.track:
        from distrl.tracking import check_trackers

        check_trackers(run.track)
    if algo == "grpo":
        return _train_grpo(run, args.strategy, algo_cfg, resume_path, ["train", algo, env, *rest])
    if args.strategy.strategy == "pipeline" and algo != "ppo":
        raise ConfigError(f"strategy='pipeline' is not available for {algo}: it runs ppo on Gymnasium envs "
                          "and grpo on group tasks (distrl train grpo bandit --strategy pipeline)")
    if not run.run_dir:  # every worker must agree on the run directory: fix it before launching
        run = run.replace(run_dir=str(default_run_dir(run, resolve_env_id(run.env))))
    if args.strategy.strategy == "single":
        run_training(run, algo_cfg, resume_path)
    elif args.strategy.strategy in ("actor-learner", "pipeline"):
        from distrl.strategies.actor_learner import WorkerError, run_actor_learner
        from distrl.strategies.pool import GeneratorFailed, PipelineStalled
        from distrl.strategies.pipeline_ppo import run_async_ppo

        checkpoint.check_new_run_dir(Path(run.run_dir), resume_path)
        runner = run_actor_learner if args.strategy.strategy == "actor-learner" else run_async_ppo
        try:
            runner(run, args.strategy, algo_cfg, Path(run.run_dir), resume_path)
        except (WorkerError, GeneratorFailed, PipelineStalled) as exc:
            print(f"distrl: error: {exc}", file=sys.stderr)
            raise SystemExit(1) from None
    else:
        run_ddp(run, args.strategy, algo_cfg, resume_path, ["train", algo, env, *rest, "--run-dir", run.run_dir])
    return 0


def _train_grpo(run: RunConfig, strategy: StrategyConfig, cfg: GRPOConfig, resume_path: Path | None,
                argv: list[str]) -> int:
    from distrl.rewards import RewardError
    from distrl.strategies.pool import GeneratorFailed, PipelineStalled
    from distrl.training.group import GroupTrainer, train_grpo

    if strategy.strategy not in ("single", "ddp", "pipeline"):
        raise ConfigError(f"strategy={strategy.strategy!r} is not available for grpo: must be single, ddp or pipeline")
    if not run.run_dir:  # every worker must agree on the run directory: fix it before launching
        run = run.replace(run_dir=str(default_run_dir(run, run.env)))
    run_dir = Path(run.run_dir)
    if strategy.strategy == "ddp":
        run_ddp(run, strategy, cfg, resume_path, [*argv, "--run-dir", run.run_dir])
        return 0
    checkpoint.check_new_run_dir(run_dir, resume_path)
    GroupTrainer.check_env(run, cfg)  # the dataset, rewards and prompts, before any process starts
    try:
        if strategy.strategy == "pipeline":
            from distrl.strategies.pipeline import RewardFailed, run_pipeline

            try:
                run_pipeline(run, strategy, cfg, run_dir, resume_path)
            except RewardFailed as exc:
                raise RewardError(str(exc)) from None
        else:
            train_grpo(run, cfg, run_dir, resume_path)
    except (RewardError, GeneratorFailed, PipelineStalled) as exc:
        print(f"distrl: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    return 0


def run_training(run: RunConfig, cfg: Any, resume_path: Path | None = None) -> dict:
    """Train in this process (``--strategy single``) and write the run directory."""
    run_dir = Path(run.run_dir)
    checkpoint.check_new_run_dir(run_dir, resume_path)
    start = time.perf_counter()
    return make_trainer(run.algo, run, cfg, run_dir=run_dir).run_to_end(resume_path, start)


def run_ddp(run: RunConfig, strategy: StrategyConfig, cfg: Any, resume_path: Path | None,
            argv: list[str]) -> dict | None:
    """``--strategy ddp`` or ``decoupled``: be one rank (under a launcher or torchrun), or launch the ranks."""
    from distrl.strategies import launch
    from distrl.strategies.ddp import in_distributed_env, run_worker

    run_dir = Path(run.run_dir)
    if in_distributed_env():
        return _as_rank(run_worker, run, strategy, cfg, run_dir, resume_path)
    launch.check_before_launch(run, strategy, cfg, resume_path)
    try:
        if strategy.launcher == "spark":
            from distrl.strategies.spark_engine import launch_spark, spark_session

            with spark_session(strategy.spark_master or f"local[{strategy.workers}]") as spark:
                return launch_spark(spark, run, strategy, cfg, resume_path, local_mode=strategy.spark_local_mode)
        if strategy.uses_ray:
            return launch.launch_ray(run_worker, (run, strategy, cfg, run_dir, resume_path), strategy.workers,
                                     strategy.ray_address, run_dir, strategy.timeout_s, debug=run.debug)
        launch.launch_local(argv, strategy.workers, strategy.timeout_s)
    except launch.WorkerFailed as exc:
        print(f"distrl: error: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
    return None


def _as_rank(fn, *args):  # noqa: ANN001, ANN202
    """Run a rank's work; report an exception on one line naming the rank, then fail."""
    rank = os.environ.get("RANK", "?")
    try:
        return fn(*args)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - a rank's failure must name the rank
        traceback.print_exc()
        print(f"distrl: error: rank {rank}: {type(exc).__name__}: {exc}", file=sys.stderr)
        raise SystemExit(1) from None


def eval_command(argv: list[str]) -> int:
    from distrl.api import Model

    args = parse_flags(EvalArgs, merge_repeated(argv, "--track", "--track"), prog="distrl eval")
    if args.episodes <= 0:
        raise ConfigError(f"episodes={args.episodes} is not allowed: must be > 0")
    if args.track and not args.record:
        raise ConfigError(f"track={args.track!r} is not allowed without --record: eval logs a recorded video")
    model = Model.load(args.path, device=args.device, env=args.env or None, trust_code=args.trust_code)
    try:
        if args.record:
            return _record(model, args)
        mean, std = model.evaluate(args.episodes, deterministic=not args.stochastic, seed=args.seed)
    finally:
        model.close()
    if args.json:
        print(json.dumps({"mean_return": mean, "std_return": std, "episodes": args.episodes}))
    else:
        print(f"{mean:.2f} ± {std:.2f} over {args.episodes} episodes")
    return 0


def _record(model: Any, args: EvalArgs) -> int:
    from distrl.config import parse_env_kwargs
    from distrl.envs import make_single_env
    from distrl.video import record

    deterministic = not args.stochastic
    policies, labels = [model.player(deterministic)], ["trained"]
    untrained = None
    if args.compare_untrained:
        untrained = model.untrained(seed=12345)
        policies.insert(0, untrained.player(deterministic))
        labels.insert(0, "untrained")
    seed = args.seed if args.seed is not None else 0
    try:
        run = model._trainer.run
        make = partial(make_single_env, model._trainer.env_id, parse_env_kwargs(run.env_kwargs), run.wrappers,
                       render_mode="rgb_array", atari_wrappers=run.atari_wrappers, evaluation=True)
        recording = record(make, policies, Path(args.record), args.episodes, seed, labels=labels)
    finally:
        if untrained is not None:
            untrained.close()
    panes = " | ".join(f"{label} (returns {', '.join(f'{r:,.1f}' for r in returns)})"
                       for label, returns in zip(labels, recording.returns))
    print(f"wrote {args.record}: {recording.frames} frames, {args.episodes} episode(s): {panes}")
    if args.track:
        _track_video(model, args)
    return 0


def _track_video(model: Any, args: EvalArgs) -> None:
    """Log the recorded video to the trackers of the run it came from (RUN/tracking.json)."""
    from distrl.tracking import close_trackers, open_trackers

    run_dir = checkpoint.run_dir_of(checkpoint.find_latest(Path(args.path)))
    if run_dir is None:
        raise ConfigError(f"path={args.path!r} is not in a run directory: --track logs to the run's tracked runs")
    trackers = open_trackers(args.track, run_dir, model._trainer.run.track_project, config={})
    try:
        for tracker in trackers:
            tracker.video(Path(args.record), model.num_steps)  # at the step the model was trained to
    finally:
        close_trackers(trackers)
    print(f"logged {args.record} to {', '.join(args.track)} (run {run_dir.name})")


def plot_command(argv: list[str]) -> int:
    from distrl.plots import mean_curves, reward_curves, seed_groups

    args = parse_flags(PlotArgs, argv, prog="distrl plot")
    if not args.runs:
        raise ConfigError("runs is empty: give one or more run directories or Monitor files")
    runs = [Path(r) for r in args.runs]
    if args.seeds == "together":
        mean_curves(seed_groups(runs), args.x, args.smooth, Path(args.out), args.title)
    else:
        reward_curves(runs, args.x, args.smooth, Path(args.out), args.title)
    print(f"wrote {args.out}")
    return 0
