"""Which runs may import the code their config names without ``--trust-code``: the ones this user made here.

A run's config can name Python code: a custom env's 'package.module:Name', wrappers, a policy factory,
GRPO's reward functions. Loading such a run imports and calls that code, so a run from somewhere else
is refused until its user allows it. A run this user trained on this machine needs no such step: every
checkpoint distrl writes records the digest of its config in a per-user store
(``~/.config/distrl/trusted.json``, or ``$DISTRL_TRUST_STORE``), and a checkpoint whose config digest is
recorded for its own run directory loads without a flag. A config edited after it was written, or the
same run copied from another machine, has no such record and is refused; ``distrl trust RUN`` records
it once the user has read what it names.

The store guards against run directories written by someone else. It does not guard against anyone who
can write this user's home directory or Python environment: they could change the code itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from distrl.run.checkpoint import run_dir_of

STORE_ENV = "DISTRL_TRUST_STORE"
FORMAT = "distrl-trust"


def store_path() -> Path:
    """The per-user store: ``$DISTRL_TRUST_STORE``, else ``$XDG_CONFIG_HOME/distrl/trusted.json``."""
    if os.environ.get(STORE_ENV):
        return Path(os.environ[STORE_ENV])
    config_home = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(config_home) / "distrl" / "trusted.json"


def config_digest(state: dict[str, Any]) -> str:
    """sha256 of a checkpoint's algorithm and config, as its ``state.json`` holds them."""
    canonical = json.dumps({"algo": state.get("algo"), "config": state.get("config")}, sort_keys=True)
    return "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()


def _key(checkpoint_path: Path) -> str:
    """The run directory a checkpoint belongs to (its own path when it stands alone), absolute."""
    path = Path(checkpoint_path)
    return str((run_dir_of(path) or path).resolve())


def is_trusted(checkpoint_path: Path, state: dict[str, Any]) -> bool:
    """Whether this user's store records the config of the checkpoint at ``checkpoint_path`` for its run."""
    return config_digest(state) in _read().get(_key(checkpoint_path), ())


def remember(checkpoint_path: Path, state: dict[str, Any]) -> str | None:
    """Record a checkpoint's config digest for its run: called when this user's process writes it.

    Entries whose run directory no longer exists are dropped on the way. A store that cannot be written
    does not stop a run: the reason is returned (loading the run will then ask for ``--trust-code``)."""
    key, digest = _key(checkpoint_path), config_digest(state)
    try:
        with _locked():
            runs = {run: digests for run, digests in _read().items() if Path(run).exists()}
            if digest not in runs.get(key, ()):
                runs[key] = [*runs.get(key, ()), digest]
                _write(runs)
    except OSError as exc:
        return f"could not record the run in {store_path()}: {exc.strerror or exc}"
    return None


def _read() -> dict[str, list[str]]:
    try:
        data = json.loads(store_path().read_text())
    except (OSError, ValueError):  # no store yet, or an unreadable one: nothing is trusted
        return {}
    runs = data.get("runs") if isinstance(data, dict) and data.get("format") == FORMAT else None
    return runs if isinstance(runs, dict) else {}


def _write(runs: dict[str, list[str]]) -> None:
    path = store_path()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"format": FORMAT, "runs": runs}, indent=1))
    os.replace(tmp, path)  # a reader sees the old store or the new one, never half of one


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    """Hold the store's lock file while reading and rewriting it (parallel trials write at once)."""
    path = store_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        try:
            import fcntl
        except ImportError:  # no POSIX locks: a rare lost entry only means asking again
            yield
            return
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
