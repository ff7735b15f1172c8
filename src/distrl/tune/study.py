"""``distrl tune``: an Optuna study over an algorithm's hyperparameters on one env.

Each trial is an ordinary run directory, ``STUDY_DIR/trials/trial-NNNN``, trained for the budget by a
process of its own (``--parallel K`` at once), or by a Ray task with ``--engine ray`` /
``--ray-address``. The study lives in a database (an SQLite file in the study directory unless
``--storage`` names another), so a tune command that was stopped carries on where it was: finished
trials stay, the ones that were running are retried with the same parameters.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from distrl.config import ConfigError
from distrl.config.argv import parse_flags
from distrl.envs.names import resolve_env_id
from distrl.run import checkpoint
from distrl.training.presets import algo_configs, resolve_preset
from distrl.tune.args import TuneArgs
from distrl.tune.budget import fit_space, trial_steps
from distrl.tune.runners import ProcessTrials, RayTrials
from distrl.tune.space import Space, build_space, with_dataset
from distrl.tune.trial import PRESET_FILE, SPEC_FILE, make_pruner

__all__ = ["TuneArgs", "Tuner", "tune_command"]


def import_optuna() -> Any:
    try:
        import optuna
    except ImportError:
        raise ConfigError("Optuna is not installed: pip install 'distrl[tune]'") from None
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return optuna


def tune_command(argv: list[str]) -> int:
    """``distrl tune ALGO ENV [flags]`` (Optuna, or ``--scheduler pbt``), ``distrl tune report STUDY_DIR`` and
    ``distrl tune replay STUDY_DIR``."""
    if argv and argv[0] == "report":
        from distrl.tune.pbt_report import report_command

        return report_command(argv[1:])
    if argv and argv[0] == "replay":
        from distrl.tune.member import replay_command

        return replay_command(argv[1:])
    if len(argv) < 2 or argv[0].startswith("-") or argv[1].startswith("-"):
        if any(a in ("-h", "--help") for a in argv):
            parse_flags(TuneArgs, ["--help"], prog="distrl tune ALGO ENV")
        raise ConfigError(
            "ALGO and ENV are missing: distrl tune ALGO ENV [flags], e.g. distrl tune ppo CartPole-v1 "
            "--trials 20 --budget-steps 50000 (or distrl tune report|replay STUDY_DIR for a --scheduler pbt study)"
        )
    algo, env = argv[0], argv[1]
    args = parse_flags(TuneArgs, argv[2:], prog=f"distrl tune {algo} {env}")
    if args.scheduler == "pbt":
        from distrl.tune.pbt import PBTStudy

        return PBTStudy(algo, env, args).run()
    return Tuner(algo, env, args).run()


class Tuner:
    """The tune command's study: asks it for trials, runs them, tells it their outcome, writes the results."""

    def __init__(self, algo: str, env: str, args: TuneArgs):
        self.optuna = import_optuna()
        self.algo, self.env, self.args = algo, env, args
        self.env_id = resolve_env_id(env)
        self.space: Space = build_space(algo, args.space, defaults=not args.no_default_space)
        self.space = with_dataset(self.space, algo, self.env_id, args.dataset, args.datasets_dir)
        self.run_values = {
            "env_kwargs": args.env_kwargs,
            "wrappers": args.wrappers,
            "policy": args.policy,
            "device": args.device,
            "threads": args.threads,
            "eval_max_steps": 0,  # a trial's value is its whole evaluation: no cap that ends it early
        }
        algo_configs(algo, env, args.preset, run=self.run_values)  # the env, preset and flags, checked once
        _, base = resolve_preset(algo, self.env_id, args.preset)
        base.pop("total_steps", None)
        self.base = {k: list(v) if isinstance(v, tuple) else v for k, v in base.items()}
        self.space = fit_space(algo, self.space, self.base, args.budget_steps, args.evaluations)
        self.name = args.study or f"{algo}-{env.replace('/', '_').replace(':', '_')}"
        self.dir = Path(args.study_dir or Path("tune") / self.name)
        if args.storage:
            self._check_storage(args.storage)
        checkpoint.check_writable_dir("study_dir", self.dir)
        (self.dir / "trials").mkdir(parents=True, exist_ok=True)
        self.storage = args.storage or f"sqlite:///{(self.dir / 'study.db').resolve()}"
        self.eval_every = max(1, args.budget_steps // args.evaluations)
        self.host = socket.gethostname()

    def _check_storage(self, url: str) -> None:
        """Open ``--storage`` now, before the study directory is made: a malformed URL, a missing database
        driver or an unreachable server is one line naming it."""
        try:
            self.optuna.storages.RDBStorage(url).remove_session()
        except Exception as exc:  # noqa: BLE001 - SQLAlchemy and the drivers raise many kinds
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConfigError(
                f"storage={url!r} cannot be opened ({reason}): must be a database URL Optuna can reach, "
                "e.g. sqlite:///study.db or postgresql://user@host/db"
            ) from None

    def run(self) -> int:
        optuna = self.optuna
        study = optuna.create_study(
            storage=self.storage, study_name=self.name, direction="maximize", load_if_exists=True
        )
        self._check_same_study(study)
        retried = self._retry_interrupted(study)
        done_before = self._done(study)
        sampler = optuna.samplers.TPESampler(
            seed=self.args.seed + len(study.trials), n_startup_trials=self.args.startup_trials
        )
        self.study = optuna.load_study(
            study_name=self.name,
            storage=self.storage,
            sampler=sampler,
            pruner=make_pruner(self.args.pruner, self.args.budget_steps, self.args.startup_trials),
        )
        print(
            f"study {self.name!r} in {self.storage}: {done_before} of {self.args.trials} trials done"
            + (f", {retried} interrupted trial(s) to run again" if retried else ""),
            flush=True,
        )
        start = time.perf_counter()
        args = self.args
        runner = (
            RayTrials(args.ray_address, self.dir, args.parallel, args.debug, args.trial_timeout_s)
            if args.engine == "ray" or args.ray_address
            else ProcessTrials(args.trial_timeout_s)
        )
        try:
            self._loop(runner)
        finally:
            runner.close()
        from distrl.tune.report import write_results

        return write_results(self.study, self.dir, self.algo, self.env_id, time.perf_counter() - start)

    def _check_same_study(self, study: Any) -> None:
        """A study name reused for another algo, env or budget would mix incomparable trials."""
        mine = {"algo": self.algo, "env": self.env_id, "budget_steps": self.args.budget_steps}
        theirs = study.user_attrs.get("distrl")
        if theirs is None:
            study.set_user_attr("distrl", mine)
            return
        for key, value in mine.items():
            if theirs.get(key) != value:
                raise ConfigError(
                    f"{key}={value!r} differs from study {self.name!r}'s {theirs.get(key)!r} in "
                    f"{self.storage}: give another --study, or the same {key}"
                )

    def _retry_interrupted(self, study: Any) -> int:
        """Trials left running by a tune command of this host that has ended: failed, and queued again."""
        count = 0
        for trial in study.get_trials(deepcopy=False, states=(self.optuna.trial.TrialState.RUNNING,)):
            attrs = trial.user_attrs
            if attrs.get("host") != self.host or _alive(int(attrs.get("tune_pid", 0))):
                continue  # another machine's trial, or one a live tune command runs
            study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            study._storage.set_trial_user_attr(trial._trial_id, "error", "interrupted: its tune command ended")
            study.tell(trial.number, state=self.optuna.trial.TrialState.FAIL, skip_if_finished=True)
            study.enqueue_trial(trial.params, user_attrs={"retry_of": trial.number})
            count += 1
        return count

    def _done(self, study: Any) -> int:
        states = self.optuna.trial.TrialState
        return sum(
            t.state in (states.COMPLETE, states.PRUNED)
            or t.state == states.FAIL
            and not t.user_attrs.get("interrupted")
            for t in study.get_trials(deepcopy=False)
        )

    def _loop(self, runner: Any) -> None:
        states = self.optuna.trial.TrialState
        while True:
            for number, outcome in runner.finished():
                self._tell(number, outcome)
            trials = self.study.get_trials(deepcopy=False)
            running = sum(t.state == states.RUNNING for t in trials)
            if runner.busy < self.args.parallel and self._done(self.study) + running < self.args.trials:
                self._start(runner)
                continue
            if not runner.busy:
                return
            runner.wait(0.5)

    def _start(self, runner: Any) -> None:
        trial = self.study.ask(self.space.distributions)
        trial_dir = self.dir / "trials" / f"trial-{trial.number:04d}"
        for key, value in (("host", self.host), ("tune_pid", os.getpid()), ("run_dir", str(trial_dir))):
            trial.set_user_attr(key, value)
        values = {**self.base, **self.space.values(trial.params)}
        if self.algo == "ppo":  # the zoo samples them independently: a minibatch is at most the rollout
            rollout = values.get("n_envs", 1) * values.get("n_steps", 2048)
            values["batch_size"] = min(values.get("batch_size", 64), rollout)
        run = {
            **self.run_values,
            "seed": self.args.seed,
            "eval_every": self.eval_every,
            "eval_episodes": self.args.eval_episodes,
            "run_dir": str(trial_dir),
            "quiet": True,
        }
        try:
            total_steps = trial_steps(self.algo, values, self.args.budget_steps, self.args.evaluations)
            algo_configs(self.algo, self.env, "none", run=run, params=values)
        except ConfigError as exc:  # sampled values the config refuses: a failed trial, the study goes on
            self._tell(trial.number, {"error": str(exc)})
            return
        trial_dir.mkdir(parents=True, exist_ok=True)
        preset = {"algo": self.algo, "env": self.env_id, **values, "total_steps": total_steps}
        (trial_dir / PRESET_FILE).write_text(json.dumps(preset, indent=2) + "\n")
        spec = {
            "algo": self.algo,
            "env": self.env,
            "trial_dir": str(trial_dir.resolve()),
            "study": self.name,
            "storage": self.storage,
            "trial_id": trial._trial_id,
            "number": trial.number,
            "run": run,
            "pruner": self.args.pruner,
            "startup_trials": self.args.startup_trials,
        }
        (trial_dir / SPEC_FILE).write_text(json.dumps(spec, indent=2) + "\n")
        runner.start(trial.number, trial_dir, spec)

    def _tell(self, number: int, outcome: dict[str, Any]) -> None:
        states = self.optuna.trial.TrialState
        trial = self.study.get_trials(deepcopy=False)[number]
        if "error" in outcome:
            self.study._storage.set_trial_user_attr(trial._trial_id, "error", outcome["error"])
            self.study.tell(number, state=states.FAIL, skip_if_finished=True)
            print(f"trial {number} failed: {outcome['error']}", flush=True)
            return
        for key in ("steps", "wall_s", "sps"):
            self.study._storage.set_trial_user_attr(trial._trial_id, key, outcome[key])
        if outcome.get("pruned_at") is not None:
            self.study.tell(number, state=states.PRUNED, skip_if_finished=True)
            print(f"trial {number} pruned at {outcome['pruned_at']:,} steps ({outcome['wall_s']:.1f}s)", flush=True)
        else:
            self.study.tell(number, outcome["value"], skip_if_finished=True)
            print(f"trial {number} complete: {outcome['value']:.2f} ({outcome['wall_s']:.1f}s)", flush=True)


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
