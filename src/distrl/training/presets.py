"""Tuned hyperparameters per environment (``--preset``).

``auto`` picks the preset named after the environment when there is one, else a fallback chosen from the
environment's spaces where the algorithm has one (:mod:`distrl.training.fallbacks`). Each entry
may set ``total_steps`` besides the algorithm's fields; flags given on the command
line always win over a preset.

A preset may also be a file (``--preset best.json``, as ``distrl tune`` writes it, or YAML): an
object of the algorithm's fields and ``total_steps``, with optional ``algo`` (checked), ``env`` and
``comment`` (informational). Its values are checked like flags: unknown names, wrong types and
values out of range are one-line errors.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from distrl.config import ALGO_CONFIGS, ConfigError, RunConfig, unknown_algo
from distrl.envs.short_names import known_id
from distrl.training.fallbacks import choose_fallback, fallback_for_run, has_fallbacks, preset_line
from distrl.training.preset_files import is_preset_file, read_preset_file
from distrl.training.preset_table import PRESETS, SELF_PLAY


def preset_names(algo: str) -> list[str]:
    return sorted(PRESETS.get(algo, {}))


def resolve_preset(algo: str, env_id: str, preset: str) -> tuple[str, dict[str, Any]]:
    """The preset's name and values for ``algo`` on ``env_id`` (``("none", {})`` when none applies)."""
    if is_preset_file(preset):
        return preset, read_preset_file(preset, algo)
    table = PRESETS.get(algo, {})
    if preset == "none":
        return "none", {}
    if preset == "auto":
        if env_id not in table and "atari" in table and _is_atari(env_id):
            return "atari", dict(table["atari"])
        return (env_id, dict(table[env_id])) if env_id in table else ("none", {})
    if preset not in table:
        allowed = ", ".join(["auto", "none", *sorted(table)])
        raise ConfigError(f"preset={preset!r} is not a {algo} preset: must be one of {allowed}, or a .json/.yaml file")
    return preset, dict(table[preset])


def algo_configs(
    algo: str,
    env: str,
    preset: str = "auto",
    run: dict[str, Any] | None = None,
    params: dict[str, Any] | None = None,
    *,
    fallback: bool = True,
) -> tuple[RunConfig, Any, str]:
    """Run and algorithm configs for ``env``: library defaults, then the preset, then ``run``/``params`` overrides.

    With ``preset="auto"``, an env without a preset gets the algorithm's fallback for its spaces, if one fits
    (:mod:`distrl.training.fallbacks`; the name returned is then the fallback's), which builds the env once to read
    them. ``fallback=False`` leaves it out: the command line applies it after parsing flags, so that ``--help``
    and a refused flag load no simulator.

    The ids distrl's short names stand for are known without asking Gymnasium (``known_id``), so that parsing
    flags for them loads no simulator library; every other name is resolved by Gymnasium's registry."""
    if algo not in ALGO_CONFIGS:
        raise unknown_algo(algo)
    cls = ALGO_CONFIGS[algo]
    if algo == "grpo":  # GRPO trains on group tasks and language models, not Gymnasium envs
        from distrl.tasks.names import TEXT_TASK, check_state_task, is_text_env

        if env != TEXT_TASK and not is_text_env(env):
            check_state_task(env)
        name, values = resolve_preset(algo, env, preset)
        values.pop("total_steps", None)
        _check_names(cls, {**values, **(params or {})})
        _check_names(RunConfig, run or {})
        return RunConfig(algo=algo, env=env, preset=preset, **(run or {})), cls(**{**values, **(params or {})}), name
    env_id = portable = known_id(env)
    if env_id is None:
        from distrl.envs.names import portable_env_name, resolve_env_id

        env_id, portable = resolve_env_id(env), portable_env_name(env)
    name, values = resolve_preset(algo, env_id, preset)
    if takes_self_play_preset(algo, preset, name, bool((run or {}).get("self_play"))):
        name, values = SELF_PLAY, dict(PRESETS[algo][SELF_PLAY])
    own = {f.name for f in dataclasses.fields(cls)}  # a preset's run settings (total_steps, ...) go to the run
    run_values = {key: values.pop(key) for key in list(values) if key not in own and key in _RUN_FIELDS}
    run_values.update(run or {})
    _check_names(cls, {**values, **(params or {})})
    _check_names(RunConfig, run_values)
    run_cfg = RunConfig(algo=algo, env=portable, preset=preset, **run_values)
    if fallback and preset == "auto" and name == "none" and has_fallbacks(algo):
        chosen = fallback_for_run(run_cfg).fallback
        if chosen is not None:
            name, values = chosen.name, dict(chosen.values)
    return run_cfg, cls(**{**values, **(params or {})}), name


def takes_self_play_preset(algo: str, preset: str, resolved: str, self_play: bool) -> bool:
    """Whether a run gets :data:`SELF_PLAY`: PPO under ``--self-play`` with ``preset`` auto, on an env whose
    own preset ``resolved`` found none."""
    return algo == "ppo" and self_play and preset == "auto" and resolved == "none"


def fallback_line(
    algo: str, env_id: str, preset: str, observation_space: Any, action_space: Any, self_play: bool = False
) -> str | None:
    """What a run of ``algo`` on ``env_id`` (resolved) says first when ``preset`` is auto and the env has no preset:
    the self-play preset a game under ``--self-play`` got, or the fallback these spaces got and why, where the
    algorithm has fallbacks (:func:`algo_configs` applied either)."""
    if preset != "auto" or (resolved := resolve_preset(algo, env_id, preset)[0]) != "none":
        return None
    from distrl.envs.names import shown_name

    if takes_self_play_preset(algo, preset, resolved, self_play):
        return f"preset: {SELF_PLAY} for {shown_name(env_id)} (--self-play on a game without a preset of its own)"
    if not has_fallbacks(algo):
        return None
    return preset_line(shown_name(env_id), choose_fallback(algo, observation_space, action_space))


_RUN_FIELDS = {f.name for f in dataclasses.fields(RunConfig)}


def _check_names(cls: type, values: dict[str, Any]) -> None:
    names = {f.name for f in dataclasses.fields(cls)}
    for key in values:
        if key not in names:
            raise ConfigError(
                f"{key}={values[key]!r} is not a {cls.__name__} field: must be one of {', '.join(sorted(names))}"
            )


def _is_atari(env_id: str) -> bool:
    """Whether ``env_id`` (resolved) is one of ale-py's games; asks Gymnasium only for ids distrl does not know."""
    if known_id(env_id) is not None:
        return False
    from distrl.envs.names import is_atari

    return is_atari(env_id)
