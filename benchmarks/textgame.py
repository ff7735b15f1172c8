"""Guess the hidden number: a multi-turn text game for the GRPO benchmarks (``grpo_vs_trl.py --task multiturn``).

    PYTHONPATH=benchmarks distrl train grpo textgame:make --model DIR --dataset games.jsonl \
        --max-turns 4 --max-turn-tokens 1 --max-new-tokens 4

A row's ``secret`` is a digit the model does not see. Each model turn is one guess; the game answers
"higher", "lower" or "correct" and cues the next guess with " guess n=". The game lasts ``turns`` guesses
(a correct guess is answered "correct" and play goes on), or ends early at a turn that is not a single
digit; its reward, given when it ends, is 1 if some guess was right. A fixed length keeps the work per
episode the same whatever the game engine: TRL's tool-call loop lets a rollout end only when the model stops
calling the tool or the completion budget runs out, never when the environment says so.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

INTRO = "find the number"
"""The opening prompt."""
CUE = " guess n="
"""Ends every observation: the model's turn that follows is its guess."""
FEEDBACK = ("higher", "lower", "correct")
TURNS = 4
"""Guesses per game: enough for a binary search over 0-9."""
CHARS = sorted(set("0123456789" + INTRO + CUE + "".join(FEEDBACK)))
"""The characters of every text the game writes, the tiny model's whole vocabulary (besides 4 special tokens)."""


class Game:
    """The rules, shared by distrl's environment below and TRL's (in ``trl_grpo.py``)."""

    def __init__(self, secret: int, turns: int = TURNS):
        if not 0 <= secret <= 9:
            raise ValueError(f"secret={secret}: must be a digit, 0 to 9")
        self.secret, self.turns = secret, turns
        self.guesses = 0
        self.solved = False

    def guess(self, n: int) -> str:
        """One guess: "higher" (the secret is greater than ``n``), "lower" or "correct"."""
        if self.over:
            raise ValueError(f"the game is over: it lasts {self.turns} guesses")
        self.guesses += 1
        if n == self.secret:
            self.solved = True
            return "correct"
        return "higher" if n < self.secret else "lower"

    @property
    def over(self) -> bool:
        return self.guesses >= self.turns


class GuessTheNumber:
    """distrl's text environment: ``reset(row) -> observation``, ``step(model_turn) -> (observation, reward,
    terminated, truncated, info)``."""

    def __init__(self, turns: int = TURNS):
        self.turns = turns
        self.game = Game(0, turns)

    def reset(self, row: dict[str, Any]) -> str:
        self.game = Game(int(row["secret"]), self.turns)
        return INTRO + CUE

    def step(self, model_turn: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        answer = model_turn.strip()
        if len(answer) != 1 or not answer.isdigit():  # not a guess: the game ends here
            return "", float(self.game.solved), True, False, {"guesses": self.game.guesses}
        feedback = self.game.guess(int(answer))
        if self.game.over:
            return f" {feedback}", float(self.game.solved), True, False, {"guesses": self.game.guesses}
        return f" {feedback}{CUE}", 0.0, False, False, {"guesses": self.game.guesses}


def make(turns: int = TURNS) -> GuessTheNumber:
    """The factory ``distrl train grpo textgame:make`` calls."""
    return GuessTheNumber(turns)


def write_games(path: str | Path, lines: int = 500, seed: int = 0) -> str:
    """``{"prompt": INTRO, "secret": 7}`` lines, secrets drawn uniformly from 0-9 with ``seed``."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(lines):
            f.write(json.dumps({"prompt": INTRO, "secret": rng.randrange(10)}) + "\n")
    return str(path)
