"""One run directory, one run: the lock a running run holds on it, and what a failed write tells the user.

The lock is an OS-level lock (``flock``) on ``RUN/.lock``: it ends with the process that holds it, however
that process ends. The file also names its holder (host, pid, start time, command) for the message a
second run gets. A holder that died without releasing it leaves its name in the file; the next run takes
the lock over and says whose it was. Readers (``distrl eval``, ``distrl plot``) never take it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import socket
import sys
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import IO, Any

from distrl.config import ConfigError, RunConfig
from distrl.run.checkpoint import check_writable_dir, find_latest

LOCK_FILE = ".lock"
HELD_BY_LAUNCHER = "DISTRL_RUN_DIR_LOCKED"
"""Set by distrl's local launcher for the ranks it starts: the launcher holds their run directory's lock."""


def default_run_dir(run: RunConfig, env_id: str) -> Path:
    """Where a run writes when ``--run-dir`` is not given: ``runs/ALGO-ENV-sSEED-TIMESTAMP``."""
    stamp = datetime.now().strftime("%Y%m%d-%H%M%S")
    return Path("runs") / f"{run.algo}-{env_id.replace('/', '_')}-s{run.seed}-{stamp}"


class WriteFailed(Exception):
    """A run could not write into its directory (disk full, no permission, a vanished directory): printed as
    one line, exit status 1; the checkpoints written before are intact."""


@contextlib.contextmanager
def held(run_dir: Path, command: list[str] | None = None) -> Iterator[None]:
    """Hold ``run_dir``'s lock while the block runs; a ConfigError naming the holder if a live run has it."""
    check_writable_dir("run_dir", run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    handle = (run_dir / LOCK_FILE).open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(handle)
        handle.close()
        raise ConfigError(
            f"run_dir={str(run_dir)!r} is in use by a running run ({_describe(holder)}): wait for it to end, "
            "stop it, or choose another --run-dir"
        ) from None
    except OSError as exc:  # a filesystem without locks (some network mounts)
        handle.close()
        print(
            f"distrl: note: {run_dir} cannot be locked ({exc.strerror}): nothing stops a second run there",
            file=sys.stderr,
        )
        yield
        return
    left = _holder(handle)
    if left:
        print(
            f"distrl: note: took over {run_dir / LOCK_FILE}, left by {_describe(left)}, which is no longer running",
            file=sys.stderr,
        )
    me = {"host": socket.gethostname(), "pid": os.getpid(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
    me["command"] = " ".join(["distrl", *(command or [])])[:300]
    _write_holder(handle, me)
    try:
        yield
    finally:
        with contextlib.suppress(OSError):  # a full disk may refuse even this; the lock still ends with us
            _write_holder(handle, None)
        handle.close()


def held_here(run_dir: Path, command: list[str]) -> contextlib.AbstractContextManager[None]:
    """``held`` for a process that writes ``run_dir``; a nullcontext for the ranks whose launcher holds it
    and for every rank but rank 0 under torchrun (rank 0 holds it for them)."""
    if os.environ.get(HELD_BY_LAUNCHER) or os.environ.get("RANK", "0") != "0":
        return contextlib.nullcontext()
    return held(run_dir, command)


def _holder(handle: IO[str]) -> dict[str, Any]:
    handle.seek(0)
    try:
        holder = json.loads(handle.read() or "{}")
    except ValueError:
        return {"pid": "?", "host": "?", "started": "?", "command": "unreadable .lock file"}
    return holder if isinstance(holder, dict) else {}


def _write_holder(handle: IO[str], holder: dict[str, Any] | None) -> None:
    handle.seek(0)
    handle.truncate()
    if holder:
        handle.write(json.dumps(holder))
    handle.flush()


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "a process that does not say who it is"
    return (
        f"pid {holder.get('pid', '?')} on {holder.get('host', '?')}, started {holder.get('started', '?')}: "
        f"{holder.get('command', '?')}"
    )


# ---- failed writes ----

ALWAYS_WRITES = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG}
"""OS errors that only a write raises."""
ADVICE = {
    errno.ENOSPC: "free some space on that disk",
    errno.EDQUOT: "free some space within your quota",
    errno.EFBIG: "raise the file-size limit (ulimit -f)",
    errno.EROFS: "the filesystem is read-only: remount it writable",
    errno.EACCES: "make the directory writable for you",
    errno.EPERM: "make the directory writable for you",
    errno.ENOENT: "the directory was removed while the run wrote into it",
}


def write_failure(exc: BaseException, run_dir: Path | None) -> WriteFailed | None:
    """The one-line error for ``exc`` if it is a failure to write the run (a write-only OS error anywhere, or a
    permission or missing-path error on a file in ``run_dir``); None for any other exception."""
    if not isinstance(exc, OSError) or exc.errno not in ADVICE:
        return None
    path = Path(exc.filename) if exc.filename else None
    if exc.errno not in ALWAYS_WRITES:
        inside = run_dir is not None and path is not None and _within(path, run_dir)
        if not inside:
            return None
    if path is not None and ".tmp-" in path.parent.name:  # a checkpoint being written: name the checkpoint
        path = path.parent.parent / path.parent.name[1:].split(".tmp-")[0] / path.name
    where = path if path is not None else f"into {run_dir}"
    return WriteFailed(
        f"could not write {where}: {exc.strerror or exc} ({errno.errorcode.get(exc.errno, exc.errno)}); "
        f"{ADVICE[exc.errno]}, then {_how_to_go_on(run_dir)}"
    )


def _within(path: Path, folder: Path) -> bool:
    try:
        path.resolve().relative_to(folder.resolve())
    except (ValueError, OSError):
        return False
    return True


def _how_to_go_on(run_dir: Path | None) -> str:
    if run_dir is None:
        return "run again"
    try:
        latest = find_latest(run_dir)
    except ConfigError:
        return f"start again: no checkpoint of {run_dir} was complete yet"
    return f"continue from the last complete checkpoint ({latest}) with: distrl train --resume {run_dir}"
