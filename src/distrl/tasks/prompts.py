"""Text tasks: prompts from a JSONL file, completions scored by reward functions (:mod:`distrl.tasks.rewards`).

A dataset is a JSONL file, one JSON object per line with a ``prompt`` (a string, or a list of chat
messages ``{"role": ..., "content": ...}`` for a tokenizer's chat template) and whatever other fields
its rewards need (``{"prompt": "12+7=", "answer": "19"}``). Every line is checked before the run
starts, and every field a reward's signature requires must be on every line.

The run reads prompts in epochs, each a fresh permutation of the lines keyed by (seed, epoch):
position ``j`` of the run is line ``permutation[j // n][j % n]``. Any worker can therefore be handed
any position, and a resumed run goes on with the prompts the uninterrupted one would have drawn.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distrl.config import ConfigError
from distrl.tasks.rewards import RewardScores, RewardSet

PROMPT = "prompt"


class JsonlRows:
    """The JSON objects of a JSONL file, one per non-empty line, read in the run's order of positions.

    Position ``j`` reads row ``permutation_e[j % n]`` of epoch ``e = j // n``, a permutation keyed by (seed, e), so
    any worker can be handed any position and a resumed run reads what the uninterrupted one would have.
    """

    what = "rows"
    """What the lines hold, for messages."""
    line = "a JSON object"
    """What one line must be, for messages."""

    def __init__(self, path: str, seed: int = 0):
        self.path = path
        self.seed = seed
        if not path:
            raise ConfigError(f"dataset='' is not allowed: must be a JSONL file of {self.what} (--dataset FILE)")
        if not Path(path).is_file():
            raise ConfigError(f"dataset={path!r} is not a file: must be a JSONL file of {self.what}")
        self.rows: list[dict[str, Any]] = []
        self.lines: list[int] = []
        """The file's line number of each row (1-based), for error messages."""
        with open(path, encoding="utf-8") as f:
            for number, text in enumerate(f, start=1):
                if text.strip():
                    where = f"dataset={path!r} line {number}"
                    self.rows.append(self.check(where, _json_object(where, text, self.line)))
                    self.lines.append(number)
        if not self.rows:
            raise ConfigError(f"dataset={path!r} holds no {self.what}: must have one JSON object per line")
        self._epochs: dict[int, np.ndarray] = {}

    def check(self, where: str, row: dict[str, Any]) -> dict[str, Any]:
        """A line's object as the rows' user needs it, or a ConfigError that starts with ``where``."""
        return row

    def __len__(self) -> int:
        return len(self.rows)

    def row_indices(self, positions: np.ndarray) -> np.ndarray:
        """The row read at each of the run's positions."""
        n = len(self.rows)
        out = np.empty(len(positions), dtype=np.int64)
        for i, position in enumerate(positions):
            epoch, offset = divmod(int(position), n)
            out[i] = self._permutation(epoch)[offset]
        return out

    def at(self, positions: np.ndarray) -> list[dict[str, Any]]:
        return [self.rows[i] for i in self.row_indices(positions)]

    def _permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._epochs:
            if len(self._epochs) > 4:
                self._epochs.clear()
            rng = np.random.default_rng([self.seed, epoch, 0xDA7A])
            self._epochs[epoch] = rng.permutation(len(self.rows))
        return self._epochs[epoch]


def _json_object(where: str, text: str, line: str) -> dict[str, Any]:
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{where} is not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(row, dict):
        raise ConfigError(f"{where} is a {type(row).__name__}: must be {line}")
    return row


class PromptDataset(JsonlRows):
    """The lines of a JSONL prompt file, in the run's order of prompts: each has a ``prompt``."""

    what = "prompts"
    line = f"a JSON object with a {PROMPT!r} field"

    def check(self, where: str, row: dict[str, Any]) -> dict[str, Any]:
        if PROMPT not in row:
            raise ConfigError(f"{where} has no {PROMPT!r} field (its fields: {', '.join(sorted(row)) or 'none'})")
        prompt = row[PROMPT]
        if isinstance(prompt, list):
            for message in prompt:
                if not (
                    isinstance(message, dict)
                    and isinstance(message.get("role"), str)
                    and isinstance(message.get("content"), str)
                ):
                    raise ConfigError(
                        f"{where}: a chat prompt must be a list of {{'role': str, 'content': str}} "
                        f"messages, not {json.dumps(message)[:80]}"
                    )
        elif not isinstance(prompt, str):
            raise ConfigError(
                f"{where}: {PROMPT!r} is a {type(prompt).__name__}: must be a string or a list of chat messages"
            )
        return row

    def require_fields(self, needs: dict[str, tuple[str, ...]]) -> None:
        """Every line must have the fields each reward requires (reward name → fields)."""
        for reward, fields in needs.items():
            for row, number in zip(self.rows, self.lines):
                missing = [name for name in fields if name not in row]
                if missing:
                    raise ConfigError(
                        f"dataset={self.path!r} line {number} has no field {missing[0]!r}, which "
                        f"reward {reward!r} needs (its fields: {', '.join(sorted(row))})"
                    )


class TextTask:
    """Prompts from a :class:`PromptDataset`, completions scored by a :class:`~distrl.tasks.rewards.RewardSet` (see it
    for ``reward_workers`` and the policies); close it when done."""

    def __init__(
        self,
        dataset: str,
        rewards: Sequence[str],
        reward_weights: Sequence[float] = (),
        reward_timeout_s: float = 60.0,
        seed: int = 0,
        reward_workers: int = 0,
        reward_timeout_policy: str = "score",
        reward_error_policy: str = "fail",
        reward_timeout_score: float = 0.0,
    ):
        self.rewards_set = RewardSet(
            rewards,
            reward_weights,
            reward_timeout_s,
            reward_workers,
            reward_timeout_policy,
            reward_error_policy,
            reward_timeout_score,
        )
        self.dataset = PromptDataset(dataset, seed)
        self.dataset.require_fields(self.rewards_set.needs())
        self.reward_names = self.rewards_set.names
        self.reward_weights = self.rewards_set.weights

    def prompts(self, positions: np.ndarray) -> list[Any]:
        """The prompts (strings or chat messages) at these positions."""
        return [row[PROMPT] for row in self.dataset.at(positions)]

    def rewards(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """``[B * G, K]`` scores of the completions ``texts`` (rows grouped by prompt)."""
        return self.score(positions, group_size, tokens, texts).scores

    def score(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> RewardScores:
        """:meth:`rewards`, with the seconds each function took and the calls that failed but were scored, each
        named by its prompt's dataset line."""
        indices = self.dataset.row_indices(positions)
        rows = [self.dataset.rows[i] for i in indices for _ in range(group_size)]
        labels = [
            f"dataset line {self.dataset.lines[i]} (completion {j + 1} of {group_size})"
            for i in indices
            for j in range(group_size)
        ]
        names = sorted({key for row in rows for key in row} - {PROMPT})
        fields = {name: [row.get(name) for row in rows] for name in names}
        return self.rewards_set.score([row[PROMPT] for row in rows], list(texts), fields, labels)

    def close(self) -> None:
        """Stop the reward worker processes, if scoring started any."""
        self.rewards_set.close()
