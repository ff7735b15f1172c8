"""What a member of a population-based training study is, without Ray: its study's settings, its trainer, one
perturbation interval of training, the ``member.json`` each of its checkpoints carries, and the replay of a
member's schedule as one run (``distrl tune replay``).

Every interval begins alike, whether the member went on in memory, came back from its own checkpoint (paused
so that another member could run, or restarted after a crash) or took another member's: the trainer starts a
segment at that step (:meth:`~distrl.training.state.RunState.start_segment`: environments, sampling noise and
shuffling restart from seeds of the step count), then trains to the interval's end. So a member's training
depends only on the states and hyperparameters it went through, and a replay of its schedule on one process
ends with its weights exactly.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from distrl.config import ConfigError
from distrl.config.argv import parse_flags
from distrl.nets.core import checksum
from distrl.run import checkpoint
from distrl.run.logs import write_json_atomic
from distrl.training.presets import algo_configs
from distrl.tune.lineage import Segment
from distrl.tune.space import Space

SPEC_FILE = "pbt.json"
"""The study's settings, in its directory: what replay and report read."""
MEMBER_FILE = "member.json"
"""Beside every member checkpoint, and in the member's run directory: who, at which step, with what."""
SCHEDULE_FILE = "best_schedule.json"
MEMBERS_DIR = "members"


@dataclass(frozen=True)
class PBTSpec:
    """A study's settings, the same for every member: what :func:`build_trainer` needs beside the values a
    member mutates. Written to ``STUDY_DIR/pbt.json``; handed to every member in its config."""

    algo: str
    env: str
    env_id: str
    base: dict[str, Any]
    """Config values every member starts from (the preset's, and the space's fixed values)."""
    tied: dict[str, str]
    """Parameters that take another's value (SAC's gradient_steps: train_freq)."""
    run: dict[str, Any]
    """RunConfig values of every member: seed, evaluation episodes, env arguments, threads, device."""
    budget_steps: int
    interval: int
    study_dir: str
    """Absolute: a Ray Tune worker runs in a directory of Tune's."""
    mutations: dict[str, dict[str, Any]]
    """Each mutated parameter's range ({type, low, high, log[, step]}) or choices ({choices})."""
    synchronous: bool = True
    """Ranked at once (``--synchronous``): a copy is of its source as it stood at the round (see
    :func:`at_round`)."""

    def values(self, hyperparameters: dict[str, Any]) -> dict[str, Any]:
        """The config values of a member with these hyperparameters (space names, as ``one_minus_gamma``)."""
        values = {**self.base, **Space({}, self.tied, {}).values(hyperparameters)}
        if self.algo == "ppo":  # as the Optuna study does: a minibatch is at most the rollout
            rollout = values.get("n_envs", 1) * values.get("n_steps", 2048)
            values["batch_size"] = min(values.get("batch_size", 64), rollout)
        return values

    def member_dir(self, name: str) -> Path:
        return Path(self.study_dir) / MEMBERS_DIR / name

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> PBTSpec:
        return cls(**json.loads(text))

    @classmethod
    def read(cls, study_dir: Path) -> PBTSpec:
        path = study_dir / SPEC_FILE
        if not path.exists():
            raise ConfigError(f"study_dir={str(study_dir)!r} holds no {SPEC_FILE}: not a --scheduler pbt study")
        return cls.from_json(path.read_text())


def build_trainer(spec: PBTSpec, hyperparameters: dict[str, Any], run_dir: Path) -> Any:
    """A trainer of the study's algo and env with these hyperparameters, logging to ``run_dir``. It evaluates
    and checkpoints only when told (:func:`advance`, the member's checkpoints): no periodic ones of its own."""
    from distrl.training import make_trainer

    run = {
        **spec.run,
        "total_steps": spec.budget_steps,
        "run_dir": str(run_dir),
        "quiet": True,
        "eval_every": 0,
        "checkpoint_every": 0,
        "checkpoint_every_s": 0.0,
    }
    run_cfg, cfg, _ = algo_configs(spec.algo, spec.env, "none", run=run, params=spec.values(hyperparameters))
    return make_trainer(spec.algo, run_cfg, cfg, run_dir=run_dir)


def advance(trainer: Any, interval: int, total: int) -> tuple[float, float]:
    """Train one perturbation interval and evaluate: (mean, std) of the evaluation's returns.

    A segment starts here (idempotent: it is a function of the step count), then whole iterations run until
    the next multiple of ``interval`` (or ``total``) is reached; learning-rate and clip schedules anneal over
    ``total``, the member's whole budget.
    """
    trainer.start_segment()
    target = min(total, (trainer.steps // interval + 1) * interval)
    trainer.train(total_steps=total, stop_at=target)
    return trainer.evaluate_now()


@dataclass
class MemberState:
    """What ``member.json`` records: the member, its steps, its hyperparameters, how many times it copied
    another, its schedule so far (its ancestry's segments, the last one ending at ``steps``) and, once it has
    finished, the checksum of its final state (:func:`state_checksum`)."""

    member: str
    steps: int
    hyperparameters: dict[str, Any]
    exploits: int
    schedule: list[Segment]
    checksum: str = ""

    def write(self, folder: Path) -> None:
        data = {**asdict(self), "schedule": [s.to_json() for s in self.schedule]}
        write_json_atomic(folder / MEMBER_FILE, data)

    @classmethod
    def read(cls, folder: Path) -> MemberState | None:
        path = folder / MEMBER_FILE
        if not path.exists():
            return None
        data = json.loads(path.read_text())
        return cls(
            data["member"],
            int(data["steps"]),
            data["hyperparameters"],
            int(data["exploits"]),
            [Segment.from_json(s) for s in data["schedule"]],
            data.get("checksum", ""),
        )


def at_round(spec: PBTSpec, given: Path, saved: MemberState, own_steps: int) -> tuple[Path, MemberState]:
    """The checkpoint a member ranked at once copies, and its source's state there: the source's own checkpoint at
    the round's step (``own_steps``, where the copying member stopped), from the source's run directory, where it
    was written once. Tune's copy (``given``) is not always that one: seen on a loaded machine, the source had
    trained its next interval before the copying member started again, and the copy came out an interval ahead
    of the population. Asynchronously, ``given`` as it is (the newest of the best)."""
    if not spec.synchronous:
        return given, saved
    at = spec.member_dir(saved.member) / checkpoint.CHECKPOINTS_DIR / f"step-{own_steps:012d}"
    state = MemberState.read(at)
    if state is not None and state.member == saved.member and state.steps == own_steps:
        return at, state
    if saved.steps == own_steps:  # the round's, where the source's own copy is gone
        return given, saved
    raise RuntimeError(
        f"{saved.member} has no checkpoint at step {own_steps:,} in {at}, where this round's copy is taken "
        f"(Tune handed over its checkpoint at step {saved.steps:,})"
    )


def state_checksum(trainer: Any) -> str:
    """The checksum of everything a trainer's checkpoint holds (weights, optimizer moments, statistics, in key
    order): two trainers with equal checksums continue alike."""
    tensors = trainer.state_tensors()
    return checksum(torch.cat([tensors[k].detach().cpu().flatten().double() for k in sorted(tensors)]))


@dataclass(frozen=True)
class ReplayArgs:
    """Train one run along a PBT study's best_schedule.json: each segment with its hyperparameters, from the
    state the previous one ended with, at the steps where the best member's ancestry changed them."""

    run_dir: str = ""
    """The replay's run directory; empty: STUDY_DIR/replay."""
    schedule: str = ""
    """A schedule file other than STUDY_DIR/best_schedule.json (a member's member.json works too)."""
    debug: bool = False
    """Show full tracebacks for errors."""


def replay_command(argv: list[str]) -> int:
    """``distrl tune replay STUDY_DIR [--run-dir DIR]``."""
    if not argv or argv[0].startswith("-"):
        if any(a in ("-h", "--help") for a in argv):
            parse_flags(ReplayArgs, ["--help"], prog="distrl tune replay STUDY_DIR")
        raise ConfigError("STUDY_DIR is missing: distrl tune replay STUDY_DIR [--run-dir DIR]")
    study_dir = Path(argv[0])
    args = parse_flags(ReplayArgs, argv[1:], prog=f"distrl tune replay {argv[0]}")
    spec = PBTSpec.read(study_dir)
    path = Path(args.schedule) if args.schedule else study_dir / SCHEDULE_FILE
    if not path.exists():
        raise ConfigError(f"schedule={str(path)!r} does not exist: run distrl tune report {study_dir} first")
    data = json.loads(path.read_text())
    segments = [Segment.from_json(s) for s in data.get("segments", data.get("schedule", []))]
    run_dir = Path(args.run_dir) if args.run_dir else study_dir / "replay"
    checkpoint.check_writable_dir("run_dir", run_dir)
    if (run_dir / checkpoint.MODEL_DIR).exists():
        raise ConfigError(f"run_dir={str(run_dir)!r} holds a finished run already: give another --run-dir")
    final = replay(spec, segments, run_dir)
    member = data.get("member", "")
    expected = data.get("checksum", "")
    verdict = ""
    if expected:
        verdict = (
            f"; equal to {member}'s final state" if final == expected else f"; NOT equal to {member}'s ({expected})"
        )
    print(f"replayed {len(segments)} segment(s) into {run_dir}: state checksum {final}{verdict}", flush=True)
    return 0 if not expected or final == expected else 1


def replay(spec: PBTSpec, segments: list[Segment], run_dir: Path) -> str:
    """Train ``segments`` one after the other into ``run_dir`` as one run; the final state's checksum.

    Each segment's trainer is built with its hyperparameters and loads the state the previous segment ended
    with (a checkpoint at the step where the member loaded its source's), then advances interval by interval
    as the member did. The run ends like any other: final model and summary.json.
    """
    if not segments or segments[0].from_step != 0:
        first = segments[0].from_step if segments else None
        raise ConfigError(f"schedule: its first segment starts at step {first}: must start at step 0")
    for before, after in zip(segments, segments[1:]):
        if after.from_step != before.to_step:
            raise ConfigError(
                f"schedule: a segment starts at step {after.from_step}: must start where the one before it ends, "
                f"at {before.to_step}"
            )
    start = time.perf_counter()
    previous: Path | None = None
    for i, segment in enumerate(segments):
        trainer = build_trainer(spec, segment.hyperparameters, run_dir)
        try:
            if previous is None:
                trainer.begin(None)
            else:
                trainer.load_checkpoint(previous)
            trainer.report(
                f"replay: segment {i + 1} of {len(segments)} ({segment.member}'s, steps {segment.from_step:,} to "
                f"{segment.to_step:,}): {segment.hyperparameters}"
            )
            while trainer.steps < segment.to_step:
                advance(trainer, spec.interval, spec.budget_steps)
            if i + 1 < len(segments):
                previous = run_dir / checkpoint.CHECKPOINTS_DIR / f"step-{trainer.steps:012d}"
                trainer.save_checkpoint(previous)
                trainer.close()
        except BaseException:
            trainer.close()
            raise
    final = state_checksum(trainer)
    trainer.finish(time.perf_counter() - start)
    return final
