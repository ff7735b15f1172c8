"""distrl's pieces inside Ray Tune, for ``distrl tune --scheduler pbt`` (:mod:`distrl.tune.pbt`): the member
(a ``Trainable``), the driver's callback that records the lineage, and Tune's PopulationBasedTraining drawing
from a random stream of the study's own.

A member is a distrl run directory (``STUDY_DIR/members/member-NNN``) trained one perturbation interval per
``step``. Tune's PBT decides; the member does what it asks with distrl's own parts:

* ``step``: :func:`~distrl.tune.member.advance`, then a result with ``env_steps`` (PBT's time) and
  ``eval_return`` (its metric), and what the member loaded since its last result, for the lineage.
* ``save_checkpoint``: distrl's checkpoint (safetensors and JSON) in the run directory's ``checkpoints/``,
  the same files in Tune's checkpoint directory, and ``member.json``. Nothing is pickled.
* ``load_checkpoint``: its own checkpoint (it was paused for another member, or it crashed) rewinds its logs
  to it, as a resumed run does; another member's (PBT's exploit) loads that member's weights, optimizer
  state, statistics and counters into a trainer built with the perturbed hyperparameters, and keeps the
  member's own logs: its monitor.csv goes on from its own last episode.
* ``reset_config``: Tune hands an actor to another member (``reuse_actors``), or to this one with new
  hyperparameters: a trainer is built afresh for it.
"""

from __future__ import annotations

import os
import random
import shutil
import time
from pathlib import Path
from typing import Any, TextIO

import ray
from ray import tune
from ray.tune.experiment import Trial

from distrl.run import checkpoint
from distrl.tune.lineage import Segment, append_event
from distrl.tune.member import MemberState, PBTSpec, advance, at_round, build_trainer, state_checksum


class Member(tune.Trainable):
    """One member; its name (``member-NNN``) is its Tune trial's, fixed when the study made the trial."""

    def setup(self, config: dict[str, Any]) -> None:
        self.spec = PBTSpec.from_json(config["study"])
        self.name = self.trial_name
        self.hyperparameters = {name: config[name] for name in self.spec.mutations}
        self.run_dir = self.spec.member_dir(self.name)
        self.trainer: Any = None
        """Built when first needed (:meth:`built`): Tune starts actors ahead of need and drops some unused, and
        one of those must leave the run directory as it is."""
        self.began = time.perf_counter()
        self.started = False
        """Whether this trainer has begun its run: from scratch in ``step``, or by loading a checkpoint."""
        self.finished = False
        self.origin: dict[str, Any] | None = None
        """What load_checkpoint loaded, reported with the next result (then None)."""
        self.state = MemberState(
            self.name, 0, self.hyperparameters, 0, [Segment(self.name, 0, 0, self.hyperparameters, None)]
        )

    def built(self) -> Any:
        """The member's trainer, built on first use."""
        if self.trainer is None:
            self.trainer = build_trainer(self.spec, self.hyperparameters, self.run_dir)
        return self.trainer

    def step(self) -> dict[str, Any]:
        trainer = self.built()
        if not self.started:
            trainer.begin(None)  # from scratch: episodes an attempt that crashed before its first checkpoint logged go
            self.started = True
        mean, std = advance(trainer, self.spec.interval, self.spec.budget_steps)
        done = trainer.steps >= self.spec.budget_steps
        self._update_state()
        self.state.write(self.run_dir)  # its exploit count, for the next copy, even if no checkpoint follows
        origin, self.origin = self.origin, None
        result = {
            "env_steps": trainer.steps,
            "eval_return": mean,
            "eval_std": std,
            "hyperparameters": dict(self.hyperparameters),
            "origin": origin,
            "done": done,
            "node": ray.get_runtime_context().get_node_id(),  # where this interval ran: the lineage records it
        }
        if done:
            self.state.checksum = state_checksum(trainer)
            trainer.finish(time.perf_counter() - self.began)  # final model (its evaluation is this one), summary
            self.trainer, self.finished = None, True
            self.state.write(self.run_dir)
        return result

    def _update_state(self) -> None:
        steps = self.trainer.steps
        last = self.state.schedule[-1]
        self.state.steps = steps
        self.state.schedule[-1] = Segment(last.member, last.from_step, steps, last.hyperparameters, last.started_from)

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        target = Path(checkpoint_dir)
        if self.finished:  # its final model is its last state
            written = self.run_dir / checkpoint.MODEL_DIR
        else:
            written = self.run_dir / checkpoint.CHECKPOINTS_DIR / f"step-{self.built().steps:012d}"
            self.built().save_checkpoint(written)  # with its replay buffer, where a run keeps one
            self.state.write(written)  # whose it is and where it stands: a copy taken at a round reads it (at_round)
        _link_files(written, target)
        self.state.write(target)
        self.state.write(self.run_dir)

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        path = Path(checkpoint_dir)
        saved = MemberState.read(path)
        if saved is None:
            raise RuntimeError(f"{path} holds no member.json: not a checkpoint of this study's members")
        own = saved.member == self.name
        before = None if own else MemberState.read(self.run_dir)  # its own record: its step, its copies so far
        handed = saved.steps
        if before is not None:
            path, saved = at_round(self.spec, path, saved, before.steps)
        self.built().load_checkpoint(path, rewind_logs=own)
        self.started = True
        if own:  # back after a pause or a crash: where it was
            self.state = saved
            self.origin = {"kind": "own", "step": saved.steps}
            self.trainer.report(f"went on from its checkpoint at step {saved.steps:,}")
            return
        segment = Segment(self.name, saved.steps, saved.steps, self.hyperparameters, saved.member)
        self.state = MemberState(
            self.name,
            saved.steps,
            self.hyperparameters,
            (before.exploits if before is not None else 0) + 1,
            [*saved.schedule, segment],
        )
        self.origin = {
            "kind": "copy",
            "source": saved.member,
            "source_step": saved.steps,
            "source_exploits": saved.exploits,
            "source_hyperparameters": saved.hyperparameters,
        }
        later = f" (the round's, not the one at step {handed:,} Tune handed over)" if handed != saved.steps else ""
        self.trainer.report(
            f"copied {saved.member}'s checkpoint at step {saved.steps:,}{later}; hyperparameters now "
            f"{self.hyperparameters}"
        )

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.cleanup()
        self.setup(new_config)
        return True

    def cleanup(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
            self.trainer = None


def _link_files(source: Path, target: Path) -> None:
    """``source``'s files in ``target``: hard links where the file system allows (a checkpoint is written
    once and never changed in place), copies elsewhere."""
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        if file.is_file():
            try:
                os.link(file, target / file.name)
            except OSError:
                shutil.copy2(file, target / file.name)


def _short(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


class LineageRecorder(tune.Callback):
    """A Tune callback in the driver: each member's results become lineage events and a printed line.

    A member's result tells what it loaded since its last one (``origin``): another member's checkpoint is
    an exploit; its own after Tune reported it failed is a restart (its own after a pause is neither)."""

    def __init__(self, path: Path, out: TextIO, trials_dir: Path):
        """Events to ``path``, lines to ``out``; ``trials_dir``: where Tune keeps each trial's files (error.txt)."""
        self.path, self.out, self.trials_dir = path, out, trials_dir
        self.last: dict[str, tuple[int, dict[str, Any]]] = {}
        """Each member's last reported step and hyperparameters."""
        self.failed: dict[str, str] = {}
        """Members that failed and are being restarted, with the error."""

    def say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def on_trial_result(
        self, iteration: int, trials: list[Any], trial: Any, result: dict[str, Any], **info: Any
    ) -> None:
        member = str(trial)
        step, mean = int(result["env_steps"]), float(result["eval_return"])
        hyperparameters = result["hyperparameters"]
        before_step, before = self.last.get(member, (0, hyperparameters))
        origin = result.get("origin") or {}
        if member in self.failed:
            restored = int(origin.get("source_step", origin.get("step", 0)))
            error = self.failed.pop(member)
            event = {"event": "restart", "member": member, "failed_after": before_step, "step": restored}
            append_event(self.path, {**event, "error": error})
            self.say(f"{member} failed after step {before_step:,} ({error}); restarted from step {restored:,}")
        if origin.get("kind") == "copy":
            source_values = origin["source_hyperparameters"]
            append_event(
                self.path,
                {
                    "event": "exploit",
                    "member": member,
                    "step": before_step,
                    "source": origin["source"],
                    "source_step": origin["source_step"],
                    "source_exploits": origin["source_exploits"],
                    "source_hyperparameters": source_values,
                    "old": before,
                    "new": hyperparameters,
                },
            )
            changes = ", ".join(
                f"{k} {_short(source_values.get(k))} → {_short(v)}"
                for k, v in hyperparameters.items()
                if v != source_values.get(k)
            )
            self.say(
                f"{member} copied {origin['source']} at step {origin['source_step']:,} (its own: {before_step:,}): "
                f"{changes or 'no change'}"
            )
        append_event(
            self.path, {"event": "eval", "member": member, "step": step, "return": mean, "node": result.get("node")}
        )
        self.say(f"{member} at step {step:,}: return {mean:.2f}")
        self.last[member] = (step, hyperparameters)

    def _error_line(self, trial: Any) -> str:
        """The last line of a failed trial's error file (the exception), and where Tune keeps the traceback."""
        path = trial.error_file
        if path and Path(path).exists():
            lines = [line.strip() for line in Path(path).read_text().splitlines() if line.strip()]
            if lines:
                return f"{lines[-1]}; traceback in {self.trials_dir / str(trial) / Path(path).name}"
        return "failed"

    def on_trial_recover(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        self.failed[str(trial)] = self._error_line(trial)

    def on_trial_error(self, iteration: int, trials: list[Any], trial: Any, **info: Any) -> None:
        member = str(trial)
        error = self._error_line(trial)
        step = self.last.get(member, (0, {}))[0]
        append_event(self.path, {"event": "failed", "member": member, "step": step, "error": error})
        self.say(f"{member} failed after step {step:,} and is given up ({error})")


class SeededPBT(tune.schedulers.PopulationBasedTraining):
    """Tune's PopulationBasedTraining, its draws (whom to copy, which factor, whether to resample) from a
    random stream of the study's own.

    Tune's PBT draws from Python's global ``random`` module, which Tune's own event loop also shuffles with, as
    often as its timing has it. Each scheduler decision here runs with the global state swapped for the
    study's stream, seeded once: ranked at once (``synch``), the population's decisions then follow from
    the seed and the evaluations alone, and a study repeats itself.
    """

    def __init__(self, seed: int, synch: bool, **kwargs: Any):
        super().__init__(synch=synch, **kwargs)
        self.synchronous = synch
        self.random_state = random.Random(seed).getstate()

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        outside = random.getstate()
        random.setstate(self.random_state)
        try:
            return super().on_trial_result(GivenUpLeftOut(tune_controller), trial, result)
        finally:
            self.random_state = random.getstate()
            random.setstate(outside)

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        """Tune's choice; and, ranked at once, the round every member left waits for when one was given up.

        Tune's synchronous PBT holds a round until every live member has reported. A member that fails for good
        counts no more (:class:`GivenUpLeftOut`), but the members that reported before it failed already wait,
        paused, and no result of theirs is coming to hold the round: it is held here, with the last of them.
        Where that holds no round either (a member that finished its budget ended one without a result of it,
        seen once on a loaded machine: every member paused at or past the round's step, none to run), the member
        furthest behind goes on, so that its next result holds the next round.
        """
        trial = super().choose_trial_to_run(tune_controller)
        live = GivenUpLeftOut(tune_controller).get_live_trials()
        if trial is None and self.synchronous and live and all(t.status == Trial.PAUSED for t in live):
            last = max(live, key=lambda t: t.last_result.get("env_steps", 0))
            self.on_trial_result(tune_controller, last, last.last_result)
            trial = super().choose_trial_to_run(tune_controller)
            if trial is None:  # still every member waits and none will report: the one furthest behind goes on
                trial = min(live, key=lambda t: t.last_result.get("env_steps", 0))
        return trial


class GivenUpLeftOut:
    """The tune controller a scheduler is handed, whose live trials leave out those that failed for good.

    Tune keeps such a trial among the live ones, and its synchronous PBT would wait for it forever: its
    round check asks whether every live trial has reached the round's step.
    """

    def __init__(self, controller: Any):
        self.controller = controller

    def get_live_trials(self) -> set[Any]:
        return {t for t in self.controller.get_live_trials() if t.status != Trial.ERROR}

    def __getattr__(self, name: str) -> Any:  # everything else is the controller's own
        return getattr(self.controller, name)
