"""Checkpoints that never execute code on load: safetensors for tensors, JSON for the rest.

A checkpoint is a directory with ``tensors.safetensors`` and ``state.json``. It is
written to a temporary sibling directory and renamed into place, so a crash leaves
either the previous checkpoint or the new one, never half of one.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from distrl.config import ConfigError

FORMAT = "distrl-checkpoint"
FORMAT_VERSION = 1
TENSORS = "tensors.safetensors"
STATE = "state.json"
CHECKPOINTS_DIR = "checkpoints"
MODEL_DIR = "model"


def save(path: Path, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> Path:
    """Write a checkpoint directory atomically; returns its path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        contiguous = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        save_file(contiguous, str(tmp / TENSORS), metadata={"format": FORMAT})
        (tmp / STATE).write_text(json.dumps({"format": FORMAT, "format_version": FORMAT_VERSION, **state}, indent=1))
        old = path.parent / f".{path.name}.old-{os.getpid()}"
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        if old.exists():
            shutil.rmtree(old)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return path


def load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint directory; a missing, truncated or foreign one is a ConfigError."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"checkpoint={str(path)!r} does not exist")
    state = read_state(path)
    try:
        tensors = load_file(str(path / TENSORS))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint={str(path)!r}: {TENSORS} is truncated or corrupt ({exc})") from None
    return tensors, state


def read_state(path: Path) -> dict[str, Any]:
    """A checkpoint's JSON state alone (its tensors unread); a missing, truncated or foreign one is a ConfigError."""
    if not (path / STATE).is_file() or not (path / TENSORS).is_file():
        raise ConfigError(f"checkpoint={str(path)!r} is not a distrl checkpoint: expected {STATE} and {TENSORS} inside")
    try:
        state = json.loads((path / STATE).read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"checkpoint={str(path)!r}: {STATE} is truncated or corrupt ({exc})") from None
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ConfigError(f"checkpoint={str(path)!r} is not a distrl checkpoint (format field missing)")
    if state.get("format_version") != FORMAT_VERSION:
        raise ConfigError(
            f"checkpoint={str(path)!r} has format_version={state.get('format_version')!r}; "
            f"this distrl reads {FORMAT_VERSION}"
        )
    return state


def _steps_of(path: Path) -> int:
    try:
        return int(json.loads((path / STATE).read_text()).get("steps", -1))
    except (OSError, ValueError):
        return -1


def run_dir_of(checkpoint_path: Path) -> Path | None:
    """The run directory a checkpoint belongs to (``RUN/model``, ``RUN/checkpoints/step-N``), if any."""
    path = Path(checkpoint_path)
    if path.name == MODEL_DIR:
        return path.parent
    if path.parent.name == CHECKPOINTS_DIR:
        return path.parent.parent
    return None


def checkpoints_of(run_or_checkpoint: Path) -> list[Path]:
    """Every checkpoint of a run directory (its periodic ones and the final model), or the checkpoint itself."""
    path = Path(run_or_checkpoint)
    if (path / STATE).exists():
        return [path]
    found = sorted(p for p in (path / CHECKPOINTS_DIR).glob("step-*") if p.is_dir())
    return found + ([path / MODEL_DIR] if (path / MODEL_DIR).is_dir() else [])


def find_latest(run_or_checkpoint: Path) -> Path:
    """The checkpoint to load from a run directory (newest by steps) or a checkpoint path."""
    path = Path(run_or_checkpoint)
    if not path.exists():
        raise ConfigError(f"run={str(path)!r} does not exist")
    if (path / STATE).exists() or (path / TENSORS).exists():
        return path
    candidates = checkpoints_of(path)
    if not candidates:
        raise ConfigError(
            f"run={str(path)!r} holds no distrl checkpoint (looked for {MODEL_DIR}/ and {CHECKPOINTS_DIR}/step-*)"
        )
    readable = [p for p in candidates if _steps_of(p) >= 0]
    if not readable:  # let load() say what is wrong with the newest one
        return max(candidates, key=lambda p: p.name)
    return max(readable, key=_steps_of)


def auto_resume(run_dir: str | None) -> str:
    """``--resume auto``: ``run_dir`` when it holds a checkpoint (its newest is loaded), else ``""``, a fresh start.

    The same command line serves the first start and every restart, as an elastic launcher (torchrun
    ``--max-restarts``) or a job scheduler's requeue runs it again after a failure.
    """
    if not run_dir:
        raise ConfigError("resume='auto' needs --run-dir: the run directory to continue, or to start in")
    try:
        find_latest(Path(run_dir))
    except ConfigError:  # no directory, or no checkpoint in it yet
        return ""
    return run_dir


def check_new_run_dir(run_dir: Path, resume_path: Path | None) -> None:
    """Refuse to start a new run over a finished one (``--resume`` continues it instead), or in a directory
    that cannot be made (tried here, and undone: nothing is left before the run starts)."""
    if resume_path is None and (run_dir / MODEL_DIR).exists():
        raise ConfigError(
            f"run_dir={str(run_dir)!r} already holds a finished run: "
            "choose another --run-dir or continue it with --resume"
        )
    check_writable_dir("run_dir", run_dir)


def check_writable_dir(field: str, folder: Path) -> None:
    """A one-line ConfigError naming ``field`` unless ``folder`` can be made and written; making it is tried
    and undone, so nothing is left behind either way."""
    missing = [parent for parent in (folder, *folder.parents) if not parent.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        writable = os.access(folder, os.W_OK)
    except OSError as exc:
        raise ConfigError(
            f"{field}={str(folder)!r} cannot be made ({exc.strerror or exc}): must be a directory you can write"
        ) from None
    finally:
        for made in missing:  # deepest first
            if made.is_dir():
                made.rmdir()
    if not writable:
        raise ConfigError(f"{field}={str(folder)!r} cannot be written: must be a directory you can write")


@contextlib.contextmanager
def removed_after_a_mistake(run_dir: Path) -> Iterator[None]:
    """The run directory a start makes (and the folders above it that it made) is removed again when the start
    ends in a ConfigError, a mistake found once the env or network is built: nothing is left of a run that
    never began. A directory that existed before is left as it was."""
    missing = [folder for folder in (run_dir, *run_dir.parents) if not folder.exists()]
    try:
        yield
    except ConfigError:
        if missing and not any((run_dir / CHECKPOINTS_DIR).glob("step-*")):
            shutil.rmtree(missing[-1], ignore_errors=True)
        raise
