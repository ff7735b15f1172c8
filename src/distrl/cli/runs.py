"""``distrl eval`` and ``distrl plot``: the commands that read finished runs."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Literal

import tyro

from distrl import checkpoint
from distrl.argv import merge_repeated, parse_flags
from distrl.config import ConfigError, Device, Tracker


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
        make = partial(
            make_single_env,
            model._trainer.env_id,
            parse_env_kwargs(run.env_kwargs),
            run.wrappers,
            render_mode="rgb_array",
            atari_wrappers=run.atari_wrappers,
            evaluation=True,
        )
        recording = record(make, policies, Path(args.record), args.episodes, seed, labels=labels)
    finally:
        if untrained is not None:
            untrained.close()
    panes = " | ".join(
        f"{label} (returns {', '.join(f'{r:,.1f}' for r in returns)})"
        for label, returns in zip(labels, recording.returns)
    )
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
