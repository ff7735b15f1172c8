"""How a study's trials run: each in a process of its own (``ProcessTrials``), or as a Ray task
(``RayTrials``); both start, poll and collect trials the same way for :class:`~distrl.tune.study.Tuner`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from distrl.strategies.launch import describe_exit, error_line
from distrl.tune.trial import LOG_FILE, RESULT_FILE, run_trial


def _failure(trial_dir: Path, code: int) -> str:
    """How a trial process that wrote no result ended, and the line of its log that says why."""
    said = error_line(_tail(trial_dir / LOG_FILE).splitlines()[-30:]).removeprefix("distrl: error: ")
    return f"{describe_exit(code)}: {said} (log: {trial_dir / LOG_FILE})"


def _tail(path: Path, size: int = 8192) -> str:
    if not path.exists():
        return ""
    with path.open("rb") as f:
        f.seek(max(0, path.stat().st_size - size))
        return f.read().decode(errors="replace")


class ProcessTrials:
    """Each trial in a process of its own (python -m distrl.tune.trial), its output in the trial's log.

    One spare process is kept ready, its imports (torch, Optuna: about two seconds) done while the
    running trials train, so the next trial starts at once; each process still runs one trial only.
    """

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.procs: dict[int, tuple[subprocess.Popen, Path, float]] = {}
        self.spare: subprocess.Popen | None = None

    @property
    def busy(self) -> int:
        return len(self.procs)

    def _command(self, first: str) -> list[str]:
        return [sys.executable, "-m", "distrl.tune.trial", first, str(os.getpid())]

    def start(self, number: int, trial_dir: Path, spec: dict[str, Any]) -> None:
        spare, self.spare = self.spare, None
        if spare is not None and spare.poll() is None and spare.stdin is not None:
            spare.stdin.write(f"{trial_dir}\n".encode())
            spare.stdin.close()
            proc = spare
        else:
            with (trial_dir / LOG_FILE).open("ab") as log:
                proc = subprocess.Popen(
                    self._command(str(trial_dir)),
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env={**os.environ, "PYTHONUNBUFFERED": "1"},
                )
        self.procs[number] = (proc, trial_dir, time.monotonic())
        self.spare = subprocess.Popen(
            self._command("--spare"),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )

    def finished(self) -> list[tuple[int, dict[str, Any]]]:
        done = []
        for number, (proc, trial_dir, started) in list(self.procs.items()):
            code = proc.poll()
            if code is None and time.monotonic() - started > self.timeout_s:
                proc.kill()
                proc.wait()
                done.append(
                    (
                        number,
                        {
                            "error": f"timed out after {self.timeout_s:g}s (--trial-timeout-s); log: "
                            f"{trial_dir / LOG_FILE}"
                        },
                    )
                )
            elif code is not None:
                result = trial_dir / RESULT_FILE
                done.append(
                    (
                        number,
                        json.loads(result.read_text())
                        if code == 0 and result.exists()
                        else {"error": _failure(trial_dir, code)},
                    )
                )
            else:
                continue
            del self.procs[number]
        return done

    def wait(self, seconds: float) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end and all(proc.poll() is None for proc, _, _ in self.procs.values()):
            time.sleep(0.05)

    def close(self) -> None:
        for proc, _, _ in self.procs.values():  # interrupted: the study's next run retries these trials
            proc.kill()
            proc.wait()
        if self.spare is not None:
            self.spare.stdin.close()  # type: ignore[union-attr]  # it ends without a trial
            try:
                self.spare.wait(10)
            except subprocess.TimeoutExpired:
                self.spare.kill()
                self.spare.wait()


def _remote_trial(spec: dict[str, Any]) -> dict[str, Any]:
    return run_trial(spec)


class RayTrials:
    """Each trial a Ray task (one CPU), on a local instance or the cluster of --ray-address."""

    def __init__(self, ray_address: str, study_dir: Path, parallel: int, debug: bool, timeout_s: float):
        from distrl.strategies.ray_engine import ray_session

        self.session = ray_session(ray_address, study_dir, num_cpus=parallel, debug=debug)
        self.ray = self.session.__enter__()
        self.task = self.ray.remote(num_cpus=1, max_retries=0)(_remote_trial)
        self.timeout_s = timeout_s
        self.pending: dict[Any, tuple[int, float]] = {}

    @property
    def busy(self) -> int:
        return len(self.pending)

    def start(self, number: int, trial_dir: Path, spec: dict[str, Any]) -> None:
        self.pending[self.task.remote(spec)] = (number, time.monotonic())

    def finished(self) -> list[tuple[int, dict[str, Any]]]:
        ray = self.ray
        done = []
        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=0) if self.pending else ([], [])
        for ref in ready:
            number, _ = self.pending.pop(ref)
            try:
                done.append((number, ray.get(ref)))
            except Exception as exc:  # noqa: BLE001 - the task's error, whatever it was, fails the trial
                cause = getattr(exc, "cause", None) or exc
                done.append((number, {"error": f"{type(cause).__name__}: {str(cause).strip().splitlines()[-1]}"}))
        for ref, (number, started) in list(self.pending.items()):
            if time.monotonic() - started > self.timeout_s:
                ray.cancel(ref, force=True)
                del self.pending[ref]
                done.append((number, {"error": f"timed out after {self.timeout_s:g}s (--trial-timeout-s)"}))
        return done

    def wait(self, seconds: float) -> None:
        if self.pending:
            self.ray.wait(list(self.pending), num_returns=1, timeout=seconds)

    def close(self) -> None:
        for ref in self.pending:
            self.ray.cancel(ref, force=True)
        self.session.__exit__(None, None, None)
