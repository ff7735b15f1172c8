"""One trial of a tuning study: an ordinary training run that reports its evaluations to the study.

The tune command writes ``TRIAL_DIR/trial.json`` and runs ``python -m distrl.tune.trial TRIAL_DIR PID``,
hands TRIAL_DIR to a spare such process that has already imported torch, or, on Ray, runs :func:`run_trial`
in a task. The run trains from ``TRIAL_DIR/preset.json`` into
``TRIAL_DIR`` itself; after each periodic evaluation it reports the mean return to the study and
stops there when the study's pruner says so. ``TRIAL_DIR/result.json`` holds the outcome.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

SPEC_FILE = "trial.json"
RESULT_FILE = "result.json"
PRESET_FILE = "preset.json"
LOG_FILE = "trial.log"


def make_pruner(kind: str, budget_steps: int, startup_trials: int) -> Any:
    """The study's pruner: median of the trials so far at the same step (after a third of the budget),
    successive halving, or none."""
    import optuna

    if kind == "median":
        return optuna.pruners.MedianPruner(n_startup_trials=startup_trials, n_warmup_steps=budget_steps // 3)
    if kind == "halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    return optuna.pruners.NopPruner()


def run_trial(spec: dict[str, Any]) -> dict[str, Any]:
    """Train the trial's run in this process; returns (and writes to result.json) its outcome."""
    import optuna

    from distrl.training import make_trainer
    from distrl.training.presets import algo_configs

    trial_dir = Path(spec["trial_dir"])
    run, cfg, _ = algo_configs(spec["algo"], spec["env"], str(trial_dir / PRESET_FILE), run=spec["run"])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    study = optuna.load_study(
        study_name=spec["study"],
        storage=spec["storage"],
        pruner=make_pruner(spec["pruner"], run.total_steps, spec["startup_trials"]),
    )
    trial = optuna.trial.Trial(study, spec["trial_id"])
    start = time.perf_counter()
    trainer = make_trainer(run.algo, run, cfg, run_dir=trial_dir)
    pruned_at: list[int] = []

    def report(steps: int, mean: float) -> bool:
        trial.report(mean, steps)
        if steps < run.total_steps and trial.should_prune():
            pruned_at.append(steps)
            trainer.report(f"pruned by the study at {steps:,} steps (evaluation {mean:.1f})")
            return True
        return False

    trainer.stop_when = report
    summary = trainer.run_to_end(None, start)
    result = {
        "value": summary["final_eval_mean_return"],
        "pruned_at": pruned_at[0] if pruned_at else None,
        "steps": summary["total_steps"],
        "wall_s": summary["wall_s"],
        "sps": summary["sps"],
    }
    tmp = trial_dir / (RESULT_FILE + ".tmp")
    tmp.write_text(json.dumps(result) + "\n")
    os.replace(tmp, trial_dir / RESULT_FILE)
    return result


def _exit_with_parent(parent: int) -> None:
    """End this process when the tune command that started it (pid ``parent``) is gone, killed: no one
    would read the result, and the study's next run retries the trial."""

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                print("distrl: error: the tune command ended; this trial stops", file=sys.stderr, flush=True)
                os._exit(3)
            time.sleep(0.2)  # a getppid call: noticing within a fifth of a second costs nothing

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _preload() -> None:
    """The seconds of imports a trial would otherwise wait for (a failure here shows again in the trial)."""
    try:
        import optuna  # noqa: F401
        import torch.utils.tensorboard  # noqa: F401

        import distrl.training  # noqa: F401
    except Exception:
        pass


def main(argv: list[str]) -> int:
    """``TRIAL_DIR PARENT_PID`` runs that trial; ``--spare PARENT_PID`` imports what a trial needs, then waits
    for a trial directory on stdin (the tune command keeps one such process ready to start the next trial)."""
    from distrl.config import ConfigError

    _exit_with_parent(int(argv[1]))
    if argv[0] == "--spare":
        # The imports run beside the wait, so that the trial's log takes this process's output as soon as
        # the trial is handed over: a tune command killed meanwhile is then reported there, not lost.
        preload = threading.Thread(target=_preload, daemon=True, name="preload")
        preload.start()
        line = sys.stdin.readline().strip()
        if not line:  # the study needs no more trials
            return 0
        with open(Path(line) / LOG_FILE, "ab") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
        preload.join()
        argv = [line]
    try:
        run_trial(json.loads((Path(argv[0]) / SPEC_FILE).read_text()))
    except ConfigError as exc:
        print(f"distrl: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
