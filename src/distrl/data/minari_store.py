"""Minari datasets (https://minari.farama.org) on this machine: open one (nothing is ever downloaded), check it
against the env a run evaluates on, and write collected episodes as a new dataset that Minari itself can read.

Minari keeps a dataset in ``<datasets_dir>/<dataset_id>/data``: ``metadata.json`` (spaces, env spec, totals) and the
episodes. It is an optional dependency, imported where the work starts. :mod:`distrl.data.offline` loads a dataset's
transitions for training.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np

from distrl.config import ConfigError

if TYPE_CHECKING:
    import minari
    from minari.data_collector import EpisodeBuffer

DATASETS_PATH_VARIABLE = "MINARI_DATASETS_PATH"
"""The environment variable Minari reads, at every call, for the folder that holds its datasets."""

DATA_FORMAT = "arrow"
"""How :func:`write_dataset` stores episodes: Arrow needs pyarrow (``minari[arrow]``), Minari's default HDF5 needs
h5py, which distrl does not otherwise use. Minari reads either, whatever wrote it."""

_UNSET_METADATA = r"`\w+` is set to None|env_spec is None"
"""Minari's warnings for metadata distrl leaves unset (author, its email, code link, a separate eval env; the env
spec of an env Gymnasium's registry does not know)."""


def _minari() -> ModuleType:
    try:
        import minari
    except ImportError as e:
        raise ConfigError(
            "offline datasets: reading or writing one needs the minari package (pip install minari)"
        ) from e
    return minari


def one_line(value: object) -> str:
    """``value`` as text on one line: numpy wraps long arrays (a Box's bounds) over several."""
    return " ".join(str(value).split())


def _reason(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


@contextlib.contextmanager
def _minari_datasets_path(root: Path) -> Iterator[None]:
    """Point Minari's id lookups at ``root`` for the duration, then put the variable back as it was."""
    before = os.environ.get(DATASETS_PATH_VARIABLE)
    os.environ[DATASETS_PATH_VARIABLE] = str(root)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(DATASETS_PATH_VARIABLE, None)
        else:
            os.environ[DATASETS_PATH_VARIABLE] = before


def _datasets_root(datasets_dir: str | None) -> Path:
    """Where dataset ids live: ``datasets_dir``, else Minari's own choice (``MINARI_DATASETS_PATH``, else
    ``~/.minari/datasets``), made absolute: Minari's writer joins a relative folder to itself when it sizes the
    files it wrote."""
    if datasets_dir is not None:
        return Path(datasets_dir).expanduser().absolute()
    from minari.storage import get_dataset_path

    return Path(get_dataset_path()).absolute()


def _local_ids(root: Path) -> list[str]:
    if not root.is_dir():
        return []
    minari = _minari()
    with _minari_datasets_path(root), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Minari warns about each misconfigured dataset it skips
        return sorted(minari.list_local_datasets())


def _looks_like_path(dataset: str) -> bool:
    return os.path.isabs(dataset) or dataset.startswith((".", "~")) or (Path(dataset) / "data").is_dir()


def _open(dataset: str, path: Path) -> minari.MinariDataset:
    try:
        return _minari().MinariDataset(path / "data")
    # Each storage fails in its own way (ValueError, KeyError, ImportError for a missing pyarrow or h5py, JSON
    # errors): whatever Minari says, the user gets one line naming the path and Minari's reason.
    except Exception as e:
        raise ConfigError(f"dataset={dataset!r}: {path} is not a dataset Minari can open: {_reason(e)}") from None


def open_dataset(dataset: str, datasets_dir: str | None = None) -> minari.MinariDataset:
    """Open a Minari dataset from this machine; nothing is ever downloaded.

    Args:
        dataset: a dataset id (``"cartpole/random-v0"``), looked up under ``datasets_dir``, else under
            ``MINARI_DATASETS_PATH``, else under Minari's default ``~/.minari/datasets``; or the path of a dataset's
            directory (the one holding ``data/``): absolute, starting with ``.`` or ``~``, or any directory that holds
            ``data/``.
        datasets_dir: the folder of datasets to look the id up in. ``os.environ`` is left as it was.

    Raises:
        ConfigError: (one line) the id is not on this machine (the message lists the ids that are), or the
            directory is not one Minari can open (the message gives Minari's reason).
    """
    _minari()  # without minari, say so before anything else
    if _looks_like_path(dataset):
        path = Path(dataset).expanduser()
        if not path.is_dir():
            raise ConfigError(f"dataset={dataset!r} is not a directory; give a dataset id or a dataset's directory")
        return _open(dataset, path)
    root = _datasets_root(datasets_dir)
    if not (root / dataset / "data").is_dir():
        local = _local_ids(root)
        shown = ", ".join(local[:20]) + (f", and {len(local) - 20} more" if len(local) > 20 else "")
        raise ConfigError(
            f"dataset={dataset!r} is not in {root} (local datasets: {shown or 'none'}); nothing is downloaded"
        )
    return _open(dataset, root / dataset)


def check_spaces(
    dataset: minari.MinariDataset, observation_space: gym.Space, action_space: gym.Space, env_id: str
) -> None:
    """Refuse a dataset recorded with other spaces than the env's (what a policy trained on it would act in).

    Raises:
        ConfigError: (one line) naming the space that differs and both values.
    """
    for name, recorded, env in (
        ("observation_space", dataset.observation_space, observation_space),
        ("action_space", dataset.action_space, action_space),
    ):
        if recorded != env:
            raise ConfigError(
                f"dataset={dataset.id!r} has {name} {one_line(recorded)} but env_id={env_id!r} has "
                f"{one_line(env)}; use a dataset recorded on this env"
            )


def _episode_buffer(
    k: int, episode: dict[str, Any], observation_space: gym.Space, action_space: gym.Space
) -> EpisodeBuffer:
    from minari.data_collector import EpisodeBuffer

    steps = len(episode["rewards"])
    lengths = {key: len(episode[key]) for key in ("observations", "actions", "terminations", "truncations")}
    if lengths != {"observations": steps + 1, "actions": steps, "terminations": steps, "truncations": steps}:
        raise ValueError(
            f"episodes[{k}] has {steps} rewards, so it needs {steps + 1} observations and {steps} actions, "
            f"terminations and truncations; got {lengths}"
        )

    def stored(values: Any, space: gym.Space) -> Any:
        # Minari's Arrow storage declares a Box's column in the space's dtype: hand it values of that dtype.
        return (
            np.asarray(values, dtype=space.dtype) if isinstance(space, gym.spaces.Box | gym.spaces.Discrete) else values
        )

    seed = episode.get("seed")
    return EpisodeBuffer(
        seed=None if seed is None else int(seed),
        observations=stored(episode["observations"], observation_space),
        actions=stored(episode["actions"], action_space),
        rewards=np.asarray(episode["rewards"]),
        terminations=np.asarray(episode["terminations"], dtype=bool),
        truncations=np.asarray(episode["truncations"], dtype=bool),
    )


@contextlib.contextmanager
def _size_measured_once() -> Iterator[Callable[[Any], float]]:
    """Minari's writer without its quadratic cost: yields the real size measure, to call once at the end.

    Minari (0.5) walks the whole dataset folder after every episode it writes, to record the dataset's size: the
    writes cost the square of the episodes (writing a 400k-step dataset of short episodes had reached 4,500 of them
    after 15 minutes, 2.7 a second by then). Within this block the walk counts nothing; the caller records the size
    once.
    """
    from minari.dataset.minari_storage import MinariStorage

    measure = MinariStorage.get_size
    MinariStorage.get_size = lambda self: 0.0
    try:
        yield measure
    finally:
        MinariStorage.get_size = measure


def write_dataset(
    dataset_id: str,
    episodes: Sequence[dict[str, Any]],
    env_id: str,
    observation_space: gym.Space,
    action_space: gym.Space,
    algorithm_name: str,
    datasets_dir: str | None = None,
    description: str | None = None,
) -> str:
    """Write ``episodes`` as a new Minari dataset and return its directory.

    The dataset is written whole into a hidden folder beside its destination (Minari skips hidden folders), then
    renamed into place: a failure leaves nothing half-written under the id. No environment is rolled out for
    reference scores.

    Args:
        dataset_id: ``(namespace/)name-v<version>``; it must not exist yet.
        episodes: each a dict of numpy arrays ``observations [T+1, ...]``, ``actions [T, ...]``, ``rewards [T]``,
            ``terminations [T]`` and ``truncations [T]`` (bool), and optionally the reset's ``seed``.
        env_id: the Gymnasium id of the env that produced them (stored as the dataset's env spec; an id Gymnasium does
            not know, such as a 'package.module:Name', is not stored: the dataset keeps the spaces alone).
        observation_space: the env's observation space.
        action_space: the env's action space.
        algorithm_name: what collected the episodes, stored in the metadata.
        datasets_dir: the folder of datasets to write into; else ``MINARI_DATASETS_PATH``, else Minari's default.
            ``os.environ`` is left as it was.
        description: stored in the metadata.

    Raises:
        ConfigError: (one line) the id is malformed or taken.
    """
    minari = _minari()
    from minari.dataset.minari_dataset import parse_dataset_id
    from minari.namespace import create_namespace, list_local_namespaces

    try:
        namespace = parse_dataset_id(dataset_id)[0]
    except (ValueError, TypeError):  # TypeError: Minari parses an id without a version, then fails on int(None)
        raise ConfigError(
            f"dataset_id={dataset_id!r} is not a Minari id: must be (namespace/)name-v<version>, e.g. 'cartpole/random-v0'"
        ) from None
    try:
        gym.spec(env_id)
        env: str | None = env_id
    except gym.error.Error:  # an env distrl names by 'package.module:Name': the dataset records its spaces alone
        env = None
    if not episodes:
        raise ValueError("write_dataset needs at least one episode")
    buffers = [_episode_buffer(k, e, observation_space, action_space) for k, e in enumerate(episodes)]

    root = _datasets_root(datasets_dir)
    target = root / dataset_id
    taken = ConfigError(f"dataset_id={dataset_id!r} already exists in {root}; choose another id or version")
    if target.exists():
        raise taken
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".distrl-writing-", dir=root))
    try:
        with _minari_datasets_path(staging), warnings.catch_warnings(), _size_measured_once() as measure:
            warnings.filterwarnings("ignore", message=_UNSET_METADATA, category=UserWarning)
            written = minari.create_dataset_from_buffers(
                dataset_id,
                buffers,
                env=env,
                algorithm_name=algorithm_name,
                observation_space=observation_space,
                action_space=action_space,
                description=description,
                data_format=DATA_FORMAT,
                ref_min_score=None,
                ref_max_score=None,
                expert_policy=None,
            )
            written.storage.update_metadata({"dataset_size": measure(written.storage)})
        if namespace is not None:
            with _minari_datasets_path(root):
                if namespace not in list_local_namespaces():
                    create_namespace(namespace)
        try:
            # Atomic on one filesystem; refused if the id appeared meanwhile (a non-empty directory is never replaced).
            os.rename(staging / dataset_id, target)
        except OSError:
            if target.exists():
                raise taken from None
            raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)
