"""The built-in reward functions of text tasks, named without a module (``--reward exact_match --reward format``).

They follow the convention of every reward function (:mod:`distrl.tasks.rewards`): ``fn(prompts, completions, **fields)
-> list[float]``, one float per completion. A completion's answer is what it puts in its last
``<answer>...</answer>`` (:func:`extract_answer`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*<answer>.*?</answer>\s*$", re.DOTALL)


def extract_answer(completion: str) -> str:
    """The text inside the last ``<answer>...</answer>`` of a completion, else the whole completion; stripped."""
    found = _ANSWER.findall(completion)
    return (found[-1] if found else completion).strip()


def exact_match(prompts: list[Any], completions: list[str], answer: list[Any], **fields: Any) -> list[float]:
    """1 where the completion's answer (see :func:`extract_answer`) equals the line's ``answer`` field, else 0."""
    return [float(extract_answer(c) == str(a).strip()) for c, a in zip(completions, answer)]


def format_reward(prompts: list[Any], completions: list[str], **fields: Any) -> list[float]:
    """1 where the completion is ``<think>...</think>`` then ``<answer>...</answer>`` and nothing else, else 0."""
    return [float(_THINK_ANSWER.match(c) is not None) for c in completions]


BUILTINS: dict[str, Callable[..., Sequence[Any]]] = {"exact_match": exact_match, "format": format_reward}
"""Rewards named without a module: ``--reward exact_match --reward format``."""
