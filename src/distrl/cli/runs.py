"""``distrl eval``, ``distrl export`` and ``distrl plot``: the commands that read finished runs (``distrl collect``,
which plays one into a dataset, is in ``collect``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal

import tyro

from distrl.config import ConfigError, Device, Tracker
from distrl.config.argv import merge_repeated, parse_flags
from distrl.run import checkpoint


@dataclass(frozen=True)
class RunArgs:
    """A trained run to load, and the code it may load (the flags eval and export share)."""

    path: tyro.conf.Positional[str]
    """Run directory (its newest checkpoint) or checkpoint directory."""
    env: str = ""
    """Use this env (id, short name or package.module:Name) instead of the run's."""
    env_kwargs: tuple[str, ...] = ()
    """Constructor arguments of the env as key=value, replacing the run's (--env-kwargs a=1 b=x)."""
    wrappers: tuple[str, ...] = ()
    """Wrappers ('package.module:function') replacing the run's: --wrappers A B, or --wrapper A --wrapper B."""
    policy: str = ""
    """The policy factory ('package.module:Name') the run was trained with, named by you instead of its config."""
    trust_code: bool = False
    """Allow the code the run's config names (its env entry point, wrappers, policy factory) to be imported
    and run; without it, a run that names code stops before importing anything unless you wrote it on this
    machine (see `distrl trust RUN`) or name that code yourself (--env, --wrapper, --policy)."""
    debug: bool = False
    """Show full tracebacks for errors."""

    def load(self, device: str, precision: str | None = None) -> Any:
        """The run's model, loaded under the trust rule."""
        from distrl.api import Model

        return Model.load(
            self.path,
            device=device,
            env=self.env or None,
            wrappers=self.wrappers or None,
            policy=self.policy or None,
            env_kwargs=self.env_kwargs or None,
            trust_code=self.trust_code,
            precision=precision,
        )


@dataclass(frozen=True)
class EvalArgs(RunArgs):
    """Evaluate a trained model: prints mean ± std of the return."""

    episodes: Annotated[
        int | None, tyro.conf.arg(metavar="INT", help_behavior_hint="(default: 10; with --record: 1)")
    ] = None
    """Episodes to run; a video is for watching, and every episode adds its frames to it."""
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
    compare_untrained: bool = False
    """With --record: an untrained policy plays the same episodes beside the trained one."""
    max_steps: int = 1000
    """With --record: each episode stops after this many steps, if the env has not ended it (it says so)."""
    track: tuple[Tracker, ...] = ()
    """With --record: also log the video to the run's tracked runs (wandb, mlflow), as its training did."""
    opponent: str = ""
    """Turn-based games: play whole games against random (uniform legal moves), search (a fixed search player:
    perfect at tic-tac-toe; at connect four alpha-beta 4 moves ahead, search:DEPTH for another depth), another
    run directory or a checkpoint (RUN/checkpoints/step-N), the run moving on by one seat each game; prints wins,
    draws and losses."""

    @property
    def episodes_to_run(self) -> int:
        """--episodes, or its default: one episode for a video (a person watches it), ten otherwise."""
        if self.episodes is not None:
            return self.episodes
        return 1 if self.record else 10


@dataclass(frozen=True)
class ExportArgs(RunArgs):
    """Write a trained policy as one ONNX or TorchScript graph (observation normalisation, network and action
    post-processing inside), checked against the policy on the run's environment, with FILE.json describing it."""

    format: Literal["onnx", "torchscript"] = "onnx"
    """onnx (run it with onnxruntime or any ONNX runtime) or torchscript (torch.jit.load, C++ libtorch)."""
    out: str = ""
    """File to write; empty: RUN/export/policy.onnx (policy.pt for torchscript; policy-stochastic.* with
    --stochastic)."""
    stochastic: bool = False
    """Sample actions: the graph takes a 'noise' input (uniforms for choices, standard normals for a Box) and
    samples from it as distrl does; without it the graph takes the most likely action (argmax, mean)."""
    observations: int = 256
    """Observations of the run's environment the written graph and the policy are compared on."""
    seed: int | None = None
    """Seed of the check's environments and noise (default: the run's evaluation seed)."""


@dataclass(frozen=True)
class PlotArgs:
    """Reward curves of one or more runs."""

    runs: tyro.conf.Positional[tuple[str, ...]]
    """Run directories or Monitor CSV files."""
    x: Literal["total-steps", "steps", "time"] = "total-steps"
    """total-steps: environment steps of the whole run, all processes together (as --total-steps counts them, so
    runs of different strategies and worker counts share one axis); steps: per collecting process; time: wall
    time."""
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
    argv = merge_repeated(merge_repeated(argv, "--track", "--track"), "--wrapper", "--wrappers")
    args = parse_flags(EvalArgs, argv, prog="distrl eval")
    if args.episodes_to_run <= 0:
        raise ConfigError(f"episodes={args.episodes} is not allowed: must be > 0")
    if args.track and not args.record:
        raise ConfigError(f"track={args.track!r} is not allowed without --record: eval logs a recorded video")
    if args.track:
        from distrl.run.tracking import check_trackers

        check_trackers(args.track)  # before the recording, not after it
    model = args.load(args.device)
    try:
        if args.record:
            return _record(model, args)
        if args.opponent:
            return _play(model, args)
        mean, std = model.evaluate(args.episodes_to_run, deterministic=not args.stochastic, seed=args.seed)
    finally:
        model.close()
    if args.json:
        print(json.dumps({"mean_return": mean, "std_return": std, "episodes": args.episodes_to_run}))
    else:
        print(f"{mean:.2f} ± {std:.2f} over {args.episodes_to_run} episodes")
    return 0


def play_against(model: Any, opponent: Any, games: int, deterministic: bool, seed: int | None) -> dict[str, Any]:
    """``games`` whole games of ``model`` against ``opponent`` (an :class:`Opponent`, in every other seat), ``model``
    moving on by one seat each game: its wins, draws and losses, overall and per seat."""
    import numpy as np

    from distrl.envs.evaluation import evaluate
    from distrl.envs.selfplay import games_of, outcomes
    from distrl.envs.vector import make_run_env
    from distrl.training import EVAL_SEED_OFFSET

    trainer = model._trainer
    env = make_run_env(trainer.run, games, trainer.env_id, evaluation=True)
    found = games_of(env)
    if not found:
        env.close()
        raise ConfigError(f"opponent= is not allowed for env={trainer.env_id!r}: it is not a turn-based game")
    for game in found:
        game.opponent = opponent
    rng = np.random.default_rng(seed)
    seed = trainer.run.seed + EVAL_SEED_OFFSET if seed is None else seed
    try:
        returns = evaluate(lambda obs, starts: model._act(obs, deterministic, rng, None, starts)[0], env, seed)
    finally:
        env.close()
    players = len(found[0].players)
    seats = [(seed + i) % players for i in range(games)]  # env i starts in seat (seed + i) % players, plays one game
    per_seat = {
        f"seat_{s + 1}": outcomes(returns[[i for i, x in enumerate(seats) if x == s]], "") for s in range(players)
    }
    return {**outcomes(returns, ""), "games": len(returns), **per_seat}


def _play(model: Any, args: EvalArgs) -> int:
    """``distrl eval RUN --opponent ...``: whole games in both seats, their wins, draws and losses."""
    from distrl.envs.search_players import SearchOpponent
    from distrl.envs.selfplay import ModelOpponent, RandomOpponent

    other = None
    opponent: RandomOpponent | SearchOpponent | ModelOpponent
    if args.opponent == "random":
        opponent = RandomOpponent()
    elif args.opponent.partition(":")[0] == "search":
        trainer = model._trainer
        opponent = SearchOpponent(trainer.env.single_observation_space, trainer.env_id, _search_depth(args.opponent))
    else:
        other = RunArgs(args.opponent, trust_code=args.trust_code).load(args.device)
        opponent = ModelOpponent(other, deterministic=not args.stochastic)
    try:
        result = play_against(model, opponent, args.episodes_to_run, not args.stochastic, args.seed)
    finally:
        if other is not None:
            other.close()
    if args.json:
        print(json.dumps({"opponent": args.opponent, **result}))
    else:
        seats = "; ".join(
            f"{s.replace('_', ' ')}: {r['wins']}/{r['draws']}/{r['losses']}"
            for s, r in result.items()
            if s.startswith("seat")
        )
        print(
            f"against {args.opponent}: {result['wins']} wins, {result['draws']} draws, {result['losses']} losses "
            f"in {result['games']} games (wins/draws/losses by seat: {seats})"
        )
    return 0


def _search_depth(opponent: str) -> int:
    """The connect four depth of ``--opponent search`` or ``search:DEPTH``."""
    from distrl.envs.search_players import DEFAULT_DEPTH

    _, colon, depth = opponent.partition(":")
    if not colon:
        return DEFAULT_DEPTH
    if not depth.isdigit() or int(depth) < 1:
        raise ConfigError(
            f"opponent={opponent!r} is not allowed: search:DEPTH takes a whole number of moves >= 1, e.g. search:4"
        )
    return int(depth)


def export_command(argv: list[str]) -> int:
    from distrl.export.writer import default_path

    args = parse_flags(ExportArgs, merge_repeated(argv, "--wrapper", "--wrappers"), prog="distrl export")
    if args.observations <= 0:
        raise ConfigError(f"observations={args.observations} is not allowed: must be > 0")
    model = args.load("cpu", precision="fp32")  # the graph computes in float32: so does the policy it is checked on
    try:
        loaded = checkpoint.newest_intact(Path(args.path))
        out = (
            Path(args.out)
            if args.out
            else default_path(checkpoint.run_dir_of(loaded) or loaded, args.format, args.stochastic)
        )
        written = model.export(out, args.format, args.stochastic, args.observations, args.seed)
    finally:
        model.close()
    size = written.path.stat().st_size
    print(f"wrote {written.path} ({args.format}, {size / 1024:,.0f} KiB) and {written.metadata}")
    print(written.check.line())
    return 0


def _record(model: Any, args: EvalArgs) -> int:
    import sys

    from distrl.config import parse_env_kwargs
    from distrl.envs.vector import make_single_env
    from distrl.envs.video import record

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
        recording = record(
            make,
            policies,
            Path(args.record),
            args.episodes_to_run,
            seed,
            max_steps=args.max_steps,
            labels=labels,
            progress=sys.stderr,
        )
    finally:
        if untrained is not None:
            untrained.close()
    panes = " | ".join(
        f"{label} (returns {', '.join(f'{r:,.1f}' + ('*' if c else '') for r, c in zip(returns, cut))})"
        for label, returns, cut in zip(labels, recording.returns, recording.cut)
    )
    note = f"; * cut at --max-steps {args.max_steps:,}" if any(any(c) for c in recording.cut) else ""
    print(f"wrote {args.record}: {recording.frames:,} frames, {args.episodes_to_run} episode(s): {panes}{note}")
    if args.track:
        _track_video(model, args)
    return 0


def _track_video(model: Any, args: EvalArgs) -> None:
    """Log the recorded video to the trackers of the run it came from (RUN/tracking.json)."""
    from distrl.run.tracking import close_trackers, open_trackers

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
    from distrl.run.plots import mean_curves, reward_curves, seed_groups

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


def trust_command(argv: list[str]) -> int:
    """``distrl trust RUN [RUN ...]``: let runs from elsewhere load the code their config names (see distrl.run.trust)."""
    from distrl.envs.names import named_code
    from distrl.run import trust
    from distrl.training.recorded import configs_from_state

    if not argv or argv[0] in ("-h", "--help"):
        print(f"usage: distrl trust RUN [RUN ...]\n\n{trust.__doc__}")
        return 0 if argv else 2
    for run in argv:
        paths = checkpoint.checkpoints_of(Path(run))
        if not paths:
            checkpoint.find_latest(Path(run))  # says what is wrong with it
        named: dict[tuple[str, str], None] = {}
        for path in paths:
            state = checkpoint.read_state(path)  # the config alone: the tensors are not needed
            run_cfg, _, algo_cfg = configs_from_state(path, state)
            names = named_code(run_cfg, algo_cfg)
            named.update(dict.fromkeys(names))
            if names:
                problem = trust.remember(path, state)
                if problem is not None:
                    raise ConfigError(f"run={run!r}: {problem}")
        if named:
            listed = ", ".join(f"{field}={name!r}" for field, name in named)
            print(f"trusted {run} ({len(paths)} checkpoint(s)): loading it may import and run {listed}")
        else:
            print(f"{run} names no code: it loads without being trusted")
    return 0
