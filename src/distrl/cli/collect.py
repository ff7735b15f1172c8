"""``distrl collect RUN --out ID``: a trained run's policy played into a Minari dataset, in one process or several."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from distrl.cli.runs import RunArgs
from distrl.config import ConfigError, Device
from distrl.config.argv import merge_repeated, parse_flags
from distrl.run import preemption


@dataclass(frozen=True)
class CollectArgs(RunArgs):
    """Play a trained run's policy and write the episodes as a Minari dataset (an offline RL dataset)."""

    steps: int = 100_000
    """Transitions to record, in whole episodes (the last episode may take it past this)."""
    out: str = ""
    """The dataset's id, e.g. cartpole/expert-v0 (required)."""
    datasets_dir: str = ""
    """Where Minari datasets live; empty: MINARI_DATASETS_PATH, else Minari's default (~/.minari/datasets)."""
    stochastic: bool = False
    """Sample actions instead of taking the most likely one."""
    epsilon: float = 0.0
    """Replace each action, with this probability, by a uniformly random one."""
    random: bool = False
    """Uniformly random actions throughout (the run only names the env)."""
    every_checkpoint: bool = False
    """Play each of the run's checkpoints in turn, --steps divided among them: the policy as it improved (a
    medium-replay-style mix)."""
    n_envs: int = 1
    """Environments stepped together, in each worker."""
    workers: int = 1
    """Processes recording at once, each --steps / workers of every checkpoint's share with seeds of its own; their
    episodes go into the one dataset, in worker order."""
    seed: int | None = None
    """Seed of the episodes and of the random actions (default: the run's evaluation seed); worker w of checkpoint k
    plays from seed + 1000 (k * workers + w)."""
    device: Device = "cpu"
    """Device to load the model on."""


def collect_command(argv: list[str]) -> int:
    args = parse_flags(CollectArgs, merge_repeated(argv, "--wrapper", "--wrappers"), prog="distrl collect")
    if not args.out:
        raise ConfigError("out='' is not allowed: name the dataset, e.g. --out cartpole/expert-v0")
    if args.steps <= 0:
        raise ConfigError(f"steps={args.steps} is not allowed: must be > 0")
    if args.n_envs < 1:
        raise ConfigError(f"n_envs={args.n_envs} is not allowed: must be >= 1")
    if args.workers < 1:
        raise ConfigError(f"workers={args.workers} is not allowed: must be >= 1")
    if args.random and (args.stochastic or args.epsilon):
        raise ConfigError("random=True is not allowed with --stochastic or --epsilon: it plays random actions only")
    with preemption.stopped_at_once(f"no dataset {args.out} was written"):
        return _collect(args)


def _collect(args: CollectArgs) -> int:
    from distrl.data.minari_store import write_dataset
    from distrl.data.recorder import behaviour
    from distrl.run import checkpoint

    sources = checkpoint.checkpoints_of(Path(args.path)) if args.every_checkpoint else [Path(args.path)]
    if not sources:
        raise ConfigError(f"path={args.path!r} holds no checkpoint to play")
    jobs = []  # (checkpoint, its worker's steps, stream)
    for k, source in enumerate(sources):
        share = max(1, args.steps // len(sources) + (1 if k < args.steps % len(sources) else 0))
        for w in range(args.workers):
            part = share // args.workers + (1 if w < share % args.workers else 0)
            if part:
                jobs.append((str(source), part, k * args.workers + w))
    if args.workers == 1:
        recorded = [_record_job(args, *job) for job in jobs]
    else:
        recorded = _record_in_workers(args, jobs)
    episodes = [episode for part in recorded for episode in part.episodes]
    about_run = recorded[-1]
    steps = sum(len(e["actions"]) for e in episodes)
    returns = [float(e["rewards"].sum()) for e in episodes]
    mean = sum(returns) / len(returns)
    about = behaviour(not args.stochastic, args.epsilon, args.random)
    played = f"{len(sources)} checkpoints of {args.path}" if args.every_checkpoint else args.path
    path = write_dataset(
        args.out,
        episodes,
        about_run.env_id,
        about_run.observation_space,
        about_run.action_space,
        f"distrl {about_run.algo}",
        args.datasets_dir or None,
        f"{steps:,} steps in {len(episodes):,} episodes of {played} ({about}); mean return {mean:.2f}",
    )
    print(
        f"{args.out}: {steps:,} steps, {len(episodes):,} episodes, mean return {mean:.2f} "
        f"(min {min(returns):.2f}, max {max(returns):.2f}); written to {path}"
    )
    return 0


@dataclass
class Recorded:
    """What one recording job brought back: its episodes, and what the dataset says of the run that played them."""

    episodes: list[dict[str, Any]]
    env_id: str
    observation_space: Any
    action_space: Any
    algo: str


def _record_job(args: CollectArgs, source: str, steps: int, stream: int) -> Recorded:
    """Load the checkpoint ``source`` under the trust rule and record ``steps`` steps from its own seed stream."""
    model = RunArgs.load(dataclasses.replace(args, path=source), args.device)
    try:
        episodes = model.record(
            steps,
            deterministic=not args.stochastic,
            epsilon=args.epsilon,
            random=args.random,
            n_envs=args.n_envs,
            seed=args.seed,
            stream=stream,
        )
        trainer = model._trainer
        env = trainer.env
        return Recorded(episodes, trainer.env_id, env.single_observation_space, env.single_action_space, model.algo)
    finally:
        model.close()


RECORD_STEPS_PER_S = 20
"""The slowest recording speed a worker is waited for (steps a second, at least ten minutes in all): a worker slower
than that is taken for hung."""


def _record_in_workers(args: CollectArgs, jobs: list[tuple[str, int, int]]) -> list[Recorded]:
    """The jobs on ``args.workers`` fresh processes (spawned: this process may hold torch's threads), in job order."""
    import multiprocessing

    with multiprocessing.get_context("spawn").Pool(args.workers) as pool:
        pending = [pool.apply_async(_record_job, (args, *job)) for job in jobs]
        results = []
        for (source, steps, stream), result in zip(jobs, pending):
            timeout = max(600.0, steps / RECORD_STEPS_PER_S)
            try:
                results.append(result.get(timeout))
            except multiprocessing.TimeoutError:
                raise ConfigError(
                    f"workers={args.workers}: the worker recording {steps:,} steps of {source} (stream {stream}) did "
                    f"not finish within {timeout:.0f} s"
                ) from None
        return results
