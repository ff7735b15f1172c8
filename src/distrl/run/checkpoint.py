"""Checkpoints that never execute code on load: safetensors for tensors, JSON for the rest.

A checkpoint is a directory with ``tensors.safetensors`` and ``state.json``. It is
written to a temporary sibling directory and renamed into place, so a crash leaves
either the previous checkpoint or the new one, never half of one. Its state records the
tensor file's sha256, checked when it is loaded.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from safetensors import SafetensorError, safe_open

from distrl.config import ConfigError

if TYPE_CHECKING:
    import torch

FORMAT = "distrl-checkpoint"
FORMAT_VERSION = 1
TENSORS = "tensors.safetensors"
STATE = "state.json"
CHECKPOINTS_DIR = "checkpoints"
MODEL_DIR = "model"
DIGEST = "tensors_sha256"
CHUNK = 1 << 20


def save_file(tensors: dict[str, torch.Tensor], filename: str, metadata: dict[str, str] | None = None) -> None:
    """safetensors' ``save_file``, importing torch's half of safetensors only here: finding, verifying and reading the
    state of checkpoints (what the command line does before a run starts) needs no torch."""
    from safetensors.torch import save_file as write

    write(tensors, filename, metadata=metadata)


def load_file(filename: str) -> dict[str, torch.Tensor]:
    """safetensors' ``load_file``, importing torch only here (see :func:`save_file`)."""
    from safetensors.torch import load_file as read

    return read(filename)


def save(path: Path, tensors: dict[str, torch.Tensor], state: dict[str, Any]) -> Path:
    """Write a checkpoint directory atomically, with its tensor file's sha256 in its state; returns its path.

    A failure to write is an OSError (with ``errno`` and ``filename`` where known); it leaves no temporary
    directory behind, and a checkpoint already at ``path`` as it was."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    old = path.parent / f".{path.name}.old-{os.getpid()}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.exists() and not path.is_dir():  # a file in the way is not a checkpoint to replace
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(path))
        for leftover in (tmp, old):  # of an earlier process with this pid
            if leftover.exists():
                shutil.rmtree(leftover)
        tmp.mkdir()
        contiguous = {k: v.detach().cpu().contiguous() for k, v in tensors.items()}
        _write_tensors(contiguous, tmp / TENSORS)
        recorded = {"format": FORMAT, "format_version": FORMAT_VERSION, **state, DIGEST: sha256_of(tmp / TENSORS)}
        (tmp / STATE).write_text(json.dumps(recorded, indent=1))
        replaced = path.exists()
        if replaced:
            os.replace(path, old)
        try:
            os.replace(tmp, path)
        except OSError:
            if replaced:
                with contextlib.suppress(OSError):  # the error to raise is the one above
                    os.replace(old, path)
            raise
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)  # the error to raise is the one that stopped the write
        raise
    if replaced:
        shutil.rmtree(old, ignore_errors=True)  # the new checkpoint is in place; a hidden leftover is harmless
    return path


def _write_tensors(tensors: dict[str, torch.Tensor], file: Path) -> None:
    """safetensors' writer, whose failures are OSErrors here as for every other file."""
    try:
        save_file(tensors, str(file), metadata={"format": FORMAT})
    except SafetensorError as exc:
        found = re.search(r"os error (\d+)", str(exc))
        code = int(found.group(1)) if found else errno.EIO
        raise OSError(code, os.strerror(code), str(file)) from exc


def sha256_of(file: Path) -> str:
    """The sha256 of a file (hex), read in chunks."""
    digest = hashlib.sha256()
    with open(file, "rb") as f:
        while chunk := f.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def load(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Read a checkpoint directory; a missing, truncated, damaged or foreign one is a ConfigError."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(f"checkpoint={str(path)!r} does not exist")
    state = _intact_state(path)
    try:
        tensors = load_file(str(path / TENSORS))
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint={str(path)!r}: {TENSORS} is truncated or corrupt ({exc})") from None
    return tensors, state


def verify(path: Path) -> str | None:
    """Why the checkpoint at ``path`` is not intact (its state unreadable or foreign, its tensor file missing,
    truncated or changed since it was written), or None when it is. One without a recorded sha256 (written
    before distrl recorded it) is intact when its state and its tensor file's header read."""
    try:
        _intact_state(Path(path))
    except ConfigError as exc:
        return str(exc)
    return None


def _intact_state(path: Path) -> dict[str, Any]:
    """A checkpoint's state, once its tensor file is found whole and unchanged; a ConfigError otherwise."""
    state = read_state(path)
    file = path / TENSORS
    try:
        with safe_open(str(file), framework="numpy"):  # reads the header alone: a truncated file fails here
            pass
    except (SafetensorError, OSError, ValueError) as exc:
        raise ConfigError(f"checkpoint={str(path)!r}: {TENSORS} is truncated or corrupt ({exc})") from None
    recorded = state.get(DIGEST)
    if recorded is None:
        return state
    try:
        found = sha256_of(file)
    except OSError as exc:
        raise ConfigError(f"checkpoint={str(path)!r}: {TENSORS} cannot be read ({exc.strerror or exc})") from None
    if found != recorded:
        raise ConfigError(
            f"checkpoint={str(path)!r}: {TENSORS} is damaged (sha256 differs from the one recorded when it was "
            "written): resume from an earlier checkpoint of the run, or restore this one from a copy"
        )
    return state


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
    return _periodic(path) + ([path / MODEL_DIR] if (path / MODEL_DIR).is_dir() else [])


def _periodic(run_dir: Path) -> list[Path]:
    """A run's periodic checkpoints ``RUN/checkpoints/step-*``, by name."""
    return sorted(p for p in (run_dir / CHECKPOINTS_DIR).glob("step-*") if p.is_dir())


def _newest_first(paths: list[Path]) -> list[Path]:
    """Checkpoints by steps, newest first; those whose state does not read come last, by name."""
    steps = {p: _steps_of(p) for p in paths}
    readable = sorted((p for p in paths if steps[p] >= 0), key=lambda p: steps[p], reverse=True)
    unreadable = sorted((p for p in paths if steps[p] < 0), key=lambda p: p.name, reverse=True)
    return readable + unreadable


def _candidates(run_or_checkpoint: Path) -> list[Path]:
    """The checkpoints to load from a run directory, newest first, or the checkpoint path itself alone."""
    path = Path(run_or_checkpoint)
    if not path.exists():
        raise ConfigError(f"run={str(path)!r} does not exist")
    if (path / STATE).exists() or (path / TENSORS).exists():
        return [path]
    candidates = checkpoints_of(path)
    if not candidates:
        raise ConfigError(
            f"run={str(path)!r} holds no distrl checkpoint (looked for {MODEL_DIR}/ and {CHECKPOINTS_DIR}/step-*)"
        )
    return _newest_first(candidates)


def find_latest(run_or_checkpoint: Path) -> Path:
    """The checkpoint to load from a run directory (newest by steps) or a checkpoint path."""
    return _candidates(run_or_checkpoint)[0]


def find_intact(run_or_checkpoint: Path) -> tuple[Path, list[str]]:
    """The newest intact checkpoint of a run directory, and a note for each newer one skipped as damaged.

    A checkpoint path is not replaced by another: a damaged one is a ConfigError, as is a run with no
    intact checkpoint."""
    path = Path(run_or_checkpoint)
    candidates = _candidates(path)
    problems = []
    for candidate in candidates:
        problem = verify(candidate)
        if problem is None:
            return candidate, [f"skipped {newer}" for newer in problems]
        if candidate == path:  # named itself: the user asked for this one
            raise ConfigError(problem)
        problems.append(problem)
    raise ConfigError(
        f"run={str(path)!r} holds no intact checkpoint ({len(problems)} damaged); the newest: {problems[0]}"
    )


def newest_intact(run_or_checkpoint: Path) -> Path:
    """:func:`find_intact`'s checkpoint, each skipped one named on stderr (``--resume RUN``, ``distrl eval RUN``)."""
    path, skipped = find_intact(run_or_checkpoint)
    for note in skipped:
        print(f"distrl: note: {note}; going on from {path}", file=sys.stderr)
    return path


def prune(run_dir: Path, keep: int) -> list[Path]:
    """Remove all but the newest ``keep`` periodic checkpoints of a run (by steps); returns those removed.

    ``keep <= 0`` keeps them all; the final model is never removed. Each is renamed to a hidden name before
    it is deleted, so one left half-deleted by a crash is never taken for a checkpoint."""
    if keep <= 0:
        return []
    removed = []
    for path in _newest_first(_periodic(Path(run_dir)))[keep:]:
        hidden = path.parent / f".{path.name}.removing-{os.getpid()}"
        if hidden.exists():  # of an earlier process with this pid
            shutil.rmtree(hidden)
        os.replace(path, hidden)
        shutil.rmtree(hidden)
        removed.append(path)
    return removed


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
