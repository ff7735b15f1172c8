"""Presets and search spaces in files (``--preset best.json``, ``--space space.yaml``): read, and checked like flags."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from distrl.config import ALGO_CONFIGS, ConfigError, RunConfig, check_types

PRESET_FILE_SUFFIXES = (".json", ".yaml", ".yml")
PRESET_FILE_NOTES = ("algo", "env", "comment")


def is_preset_file(preset: str) -> bool:
    return preset.lower().endswith(PRESET_FILE_SUFFIXES)


def read_preset_file(path: str, algo: str) -> dict[str, Any]:
    """The values of a preset file for ``algo``, checked: names, types, and ``algo`` if it says one."""
    data = read_mapping(Path(path), "preset")
    if data.get("algo", algo) != algo:
        raise ConfigError(f"preset={path!r} is for algo={data['algo']!r}: this run trains {algo}")
    values = {key: value for key, value in data.items() if key not in PRESET_FILE_NOTES}
    cls = ALGO_CONFIGS[algo]
    allowed = {f.name for f in dataclasses.fields(cls)} | {"total_steps"}
    for key in values:
        if key not in allowed:
            raise ConfigError(
                f"preset={path!r}: {key}={values[key]!r} is not a {cls.__name__} field: must be one "
                f"of {', '.join(sorted(allowed | set(PRESET_FILE_NOTES)))}"
            )
    try:
        check_types(cls, {k: v for k, v in values.items() if k != "total_steps"})
        check_types(RunConfig, {k: v for k, v in values.items() if k == "total_steps"})
    except ConfigError as exc:
        raise ConfigError(f"preset={path!r}: {exc}") from None
    return {key: tuple(value) if isinstance(value, list) else value for key, value in values.items()}


def read_mapping(path: Path, field: str) -> dict[str, Any]:
    """A JSON or YAML file holding one object (a preset, a search space), or a one-line ConfigError."""
    if not path.is_file():
        raise ConfigError(f"{field}={str(path)!r} is not a file")
    text = path.read_text()
    is_yaml = path.suffix.lower() in (".yaml", ".yml")
    if is_yaml:
        try:
            import yaml
        except ImportError:
            raise ConfigError(
                f"{field}={str(path)!r}: YAML files need PyYAML (pip install pyyaml, or "
                "'distrl[tune]'); JSON needs nothing"
            ) from None
    try:
        data = yaml.safe_load(text) if is_yaml else json.loads(text)
    except Exception as exc:  # noqa: BLE001 - any parse error is the user's file: one line
        raise ConfigError(f"{field}={str(path)!r} cannot be read: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{field}={str(path)!r} must hold an object of names and values, not {type(data).__name__}")
    return data
