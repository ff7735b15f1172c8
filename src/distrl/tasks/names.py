"""What ENV may name for GRPO: a numeric task, the language-model task or a text environment. Light (no torch), so
that the command line checks ENV before anything heavy loads; :mod:`distrl.tasks.group` builds the tasks."""

from __future__ import annotations

from distrl.config import ConfigError

TEXT_TASK = "lm"
"""The task name of a language-model run (``distrl train grpo lm --model PATH --dataset FILE ...``)."""
STATE_TASK_NAMES = ("toy", "bandit")
"""The numeric tasks (see :mod:`distrl.tasks.group`)."""
ADAPTERS = ("reasoning_gym", "textarena")
"""The built-in text environments' prefixes (``reasoning_gym/<task>``, ``textarena/<EnvId>``)."""


def is_text_env(name: str) -> bool:
    """Whether ENV ``name`` is a text environment: 'package.module:factory' or a built-in adapter's name."""
    return ":" in name or name.partition("/")[0] in ADAPTERS


def check_state_task(name: str) -> None:
    """Refuse a name that is no numeric task, in one line that says what ENV may be."""
    if name not in STATE_TASK_NAMES:
        raise ConfigError(
            f"env={name!r} is not a group task: must be one of {', '.join(STATE_TASK_NAMES)}, "
            f"{TEXT_TASK} with --model and --dataset, or a text environment ('package.module:factory', "
            "reasoning_gym/<task>, textarena/<EnvId>) with --model"
        )
