"""Experiment trackers beside TensorBoard (``--track wandb``, ``--track mlflow``).

A tracked run sends what TensorBoard gets (the same scalars at the same steps), its resolved config,
its summary, and the evaluation video when ``distrl eval RUN --record FILE --track ...`` records one.
Only the main process of a run has a logger, so every rank and worker logs through it.

Where the records go is each tracker's own setting, as its users know them: ``WANDB_MODE=offline``,
``WANDB_ENTITY`` for Weights & Biases (its files go in the run directory); ``MLFLOW_TRACKING_URI`` for MLflow (default
``sqlite:///mlflow.db`` in the working directory, the store ``mlflow ui`` opens there; a local database's
artifacts go in ``mlartifacts/`` beside it). The runs'
ids are kept in ``RUN/tracking.json``, so ``--resume`` and ``distrl eval`` go on logging to them.
"""

from __future__ import annotations

import json
import logging
import netrc
import os
import socket
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from distrl.config import ConfigError

TRACKING_FILE = "tracking.json"
PACKAGES = {"wandb": ("wandb", "wandb"), "mlflow": ("mlflow.tracking", "mlflow")}
"""Each tracker's module, and the distrl extra that installs it."""


class WandbTracker:
    def __init__(self, run_dir: Path, name: str, project: str, config: dict[str, Any], run_id: str | None):
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=project,
            name=name,
            dir=str(run_dir),
            config=config,
            id=run_id,
            resume="allow" if run_id else None,
            settings=wandb.Settings(silent=True, console="off"),
        )
        self.id = self.run.id

    def scalars(self, values: dict[str, float], step: int) -> None:
        self.run.log(dict(values), step=step)

    def summary(self, values: dict[str, Any]) -> None:
        for key, value in _numbers(values).items():
            self.run.summary[key] = value

    def video(self, path: Path, step: int) -> None:
        self.run.log({"eval/video": self.wandb.Video(str(path))}, step=step)

    def close(self) -> None:
        self.run.finish()


class MlflowTracker:
    """Metrics are sent in batches, every few seconds and before anything else is logged: each MLflow call is a
    database commit, and one per training iteration slowed a CartPole run by a quarter."""

    flush_every_s = 2.0

    def __init__(self, run_dir: Path, name: str, project: str, config: dict[str, Any], run_id: str | None):
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient

        self.metric = Metric
        self.pending: list[Any] = []
        self.flushed_at = time.monotonic()
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # its database set-up notices
        logging.getLogger("alembic").setLevel(logging.WARNING)
        self.uri = _mlflow_uri()
        try:  # a store that refuses to open (not a database, a server that says no) is told on one line
            self.client = MlflowClient(tracking_uri=self.uri)
            self.id = self._open_run(run_dir, name, project, run_id)
        except Exception as exc:  # noqa: BLE001 - MLflow, SQLAlchemy and HTTP errors alike
            detail = (str(exc).strip().splitlines() or [""])[0][:300]
            raise ConfigError(
                f"track='mlflow': {_mlflow_store()} cannot be opened: {type(exc).__name__}: {detail}"
            ) from exc
        if run_id:
            return
        params = [Param(key, str(value)[:6000]) for key, value in _flat(config).items()]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 params per batch
            self.client.log_batch(self.id, params=params[i : i + 100])

    def _open_run(self, run_dir: Path, name: str, project: str, run_id: str | None) -> str:
        """The id of the tracked run: ``run_id`` marked running again, or a new run in ``project``'s experiment."""
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
            return run_id
        experiment = self.client.get_experiment_by_name(project)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:  # a local database keeps its artifacts beside it (MLflow's default is ./mlruns of the working dir)
            database = self.uri.removeprefix("sqlite:///") if self.uri.startswith("sqlite:///") else ""
            location = (Path(database).parent / "mlartifacts").resolve().as_uri() if database else None
            experiment_id = self.client.create_experiment(project, artifact_location=location)
        run = self.client.create_run(experiment_id, run_name=name, tags={"distrl.run_dir": str(run_dir)})
        return str(run.info.run_id)

    def scalars(self, values: dict[str, float], step: int) -> None:
        now = int(time.time() * 1000)
        self.pending.extend(self.metric(key, float(value), now, step) for key, value in values.items())
        if time.monotonic() - self.flushed_at >= self.flush_every_s:
            self.flush()

    def flush(self) -> None:
        for i in range(0, len(self.pending), 1000):  # MLflow takes at most 1,000 metrics per batch
            self.client.log_batch(self.id, metrics=self.pending[i : i + 1000])
        self.pending = []
        self.flushed_at = time.monotonic()

    def summary(self, values: dict[str, Any]) -> None:
        from mlflow.entities import RunTag

        self.flush()
        self.client.log_dict(self.id, values, "summary.json")
        tags = [RunTag(f"summary.{key}", str(value)) for key, value in _numbers(values).items()]
        self.client.log_batch(self.id, tags=tags)

    def video(self, path: Path, step: int) -> None:
        self.flush()
        self.client.log_artifact(self.id, str(path), "eval")

    def close(self) -> None:
        self.flush()
        self.client.set_terminated(self.id)


def check_trackers(names: tuple[str, ...]) -> None:
    """Fail now, before the run directory is made or any worker starts, if a tracker cannot be used: its
    package is missing, Weights & Biases has no API key, or MLflow's tracking URI is malformed or unreachable."""
    for name in names:
        module, extra = PACKAGES[name]
        try:
            __import__(module)
        except ImportError:
            raise ConfigError(f"track={name!r} needs its package: pip install 'distrl[{extra}]'") from None
        problem = _wandb_problem() if name == "wandb" else _mlflow_problem()
        if problem:
            raise ConfigError(f"track={name!r}: {problem}")


def _wandb_problem() -> str | None:
    """Why ``wandb.init`` would stop for a login, if it would: no key in the environment or in ~/.netrc."""
    if os.environ.get("WANDB_MODE", "").lower() in ("offline", "disabled", "dryrun") or os.environ.get("WANDB_API_KEY"):
        return None
    if os.environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return None
    host = urlparse(os.environ.get("WANDB_BASE_URL") or "https://api.wandb.ai").hostname or ""
    try:
        if netrc.netrc(os.environ.get("NETRC") or None).authenticators(host):
            return None
    except (OSError, netrc.NetrcParseError):
        pass  # no ~/.netrc: no stored login
    return (
        f"no API key for {host}: set WANDB_API_KEY (or run `wandb login`), "
        "or WANDB_MODE=offline to keep the records in the run directory"
    )


def _mlflow_uri() -> str:
    """Where MLflow records go: ``MLFLOW_TRACKING_URI``, or distrl's default, a database in the working directory."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path('mlflow.db').resolve()}"


def _mlflow_store() -> str:
    """How messages name MLflow's store: ``MLFLOW_TRACKING_URI`` and its value, or distrl's default."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    return f"MLFLOW_TRACKING_URI={uri!r}" if uri else f"distrl's default store {_mlflow_uri()!r}"


def _mlflow_problem() -> str | None:
    """Why MLflow would refuse ``MLFLOW_TRACKING_URI``, if it would: a scheme it has no store for, its retired
    file store, a database whose directory cannot be made, a server that does not answer within 5 seconds."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        return None  # the default, a database in the working directory
    parsed = urlparse(uri)
    where = _mlflow_store()
    if parsed.scheme in ("http", "https"):
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            socket.create_connection((parsed.hostname or "", port), timeout=5).close()
        except OSError as exc:
            return f"{where} does not answer ({exc.strerror or exc}): start the server or set another URI"
        return None
    if parsed.scheme in ("", "file") and (refused := _file_store_refused(where)):
        return refused
    if parsed.scheme == "sqlite" or parsed.scheme in ("", "file"):
        path = Path(uri.removeprefix("sqlite:///").removeprefix("file://"))
        folder = path.parent if parsed.scheme == "sqlite" else path
        if parsed.scheme == "sqlite" and not _is_database(path):
            return f"{where}: {path} is not an SQLite database: name a database or a file that does not exist yet"
        try:  # the store's directory is made now, as MLflow would make it at the run's start
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return f"{where}: {folder} cannot be made ({exc.strerror or exc}): choose a writable location"
        if not os.access(folder, os.W_OK):
            return f"{where}: {folder} cannot be written: choose a writable location"
        return None
    if parsed.scheme not in ("databricks", "postgresql", "mysql", "mssql", "uc", "databricks-uc"):
        return (
            f"{where} has a scheme MLflow has no store for ({parsed.scheme!r}): "
            "use http(s)://HOST:PORT, sqlite:///PATH or a directory"
        )
    return None


SQLITE_HEADER = b"SQLite format 3\x00"
"""The first bytes of every SQLite database file (https://www.sqlite.org/fileformat.html)."""


def _is_database(path: Path) -> bool:
    """Whether SQLite can open ``path`` as a database: a file that starts as one does, an empty or missing one."""
    try:
        with path.open("rb") as handle:
            head = handle.read(len(SQLITE_HEADER))
    except FileNotFoundError:
        return True
    except OSError:  # a directory, or unreadable: MLflow would fail on it too
        return False
    return head in (b"", SQLITE_HEADER)


def _file_store_refused(where: str) -> str | None:
    """Why MLflow would refuse its file store (a directory, or a ``file://`` URI), if it would.

    MLflow 3.13 retired that store: it opens only when ``MLFLOW_ALLOW_FILE_STORE`` is ``true`` or ``1`` (any case);
    ``false``, ``0`` or unset refuse, and any other value is an error of its own. Earlier versions have no such
    switch and open it."""
    import mlflow
    from mlflow import environment_variables

    allow = getattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE", None)  # MLflow >= 3.13 only
    if allow is None:
        return None
    try:
        if allow.get():
            return None
    except ValueError:
        value = os.environ.get("MLFLOW_ALLOW_FILE_STORE")
        return f"MLFLOW_ALLOW_FILE_STORE={value!r} is not allowed: must be true, false, 1 or 0 (MLflow reads it)"
    return (
        f"{where} is MLflow's file store, which MLflow {mlflow.__version__} opens only with "
        "MLFLOW_ALLOW_FILE_STORE=true: set that, or log to a database, MLFLOW_TRACKING_URI=sqlite:///PATH.db "
        "(`mlflow migrate-filestore` moves a file store's runs into one)"
    )


def open_trackers(names: tuple[str, ...], run_dir: Path, project: str, config: dict[str, Any]) -> list[Any]:
    """The run's trackers, continuing the tracked runs ``RUN/tracking.json`` names (a resumed run)."""
    if not names:
        return []
    check_trackers(names)
    path = run_dir / TRACKING_FILE
    ids = json.loads(path.read_text()) if path.exists() else {}
    trackers: list[Any] = []
    try:
        for name in dict.fromkeys(names):
            cls = {"wandb": WandbTracker, "mlflow": MlflowTracker}[name]
            trackers.append(cls(run_dir, run_dir.name, project, config, ids.get(name)))
            ids[name] = trackers[-1].id
    except BaseException:
        close_trackers(trackers)
        raise
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ids, indent=2) + "\n")
    os.replace(tmp, path)
    return trackers


def close_trackers(trackers: list[Any]) -> None:
    for tracker in trackers:
        tracker.close()


def _flat(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in config.items():
        if isinstance(value, dict):
            flat.update(_flat(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def _numbers(values: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
