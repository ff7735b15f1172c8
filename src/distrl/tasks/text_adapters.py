"""The built-in text environments: ``reasoning_gym/<task>`` and ``textarena/<EnvId>`` (see :mod:`distrl.tasks.text_envs`).

Both packages are optional (``pip install 'distrl[textenvs]'``) and imported only when a run names them.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

from distrl.config import ConfigError
from distrl.tasks.builtin_rewards import extract_answer

INSTALL = "pip install 'distrl[textenvs]'"
RG_SIZE = 10_000
"""reasoning_gym/<task>: entries in the procedural dataset unless env_kwargs give ``size`` (positions wrap)."""


def _require(module: str, package: str, name: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"env={name!r} needs the {package} package ({INSTALL})") from None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"


class ReasoningGymTasks:
    """Makes ``reasoning_gym/<task>`` environments: one procedural dataset (seeded with the run's seed) that
    every environment reads; position ``j`` plays entry ``j % size``."""

    def __init__(self, name: str, task: str, seed: int, kwargs: dict[str, Any]):
        rg = _require("reasoning_gym", "reasoning-gym", name)
        known = sorted(rg.factory.DATASETS)
        if task not in known:
            close = difflib.get_close_matches(task, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else f" ({len(known)} tasks, e.g. {known[0]})"
            raise ConfigError(f"env={name!r} is not a reasoning-gym task: must be reasoning_gym/<task>{hint}")
        config = dict(kwargs)
        size = config.pop("size", RG_SIZE)
        try:
            self.dataset = rg.create_dataset(task, size=size, seed=seed, **config)
        except Exception as exc:  # noqa: BLE001 - the task's own config check, on one line
            raise ConfigError(f"env_kwargs={kwargs!r} is not allowed for env={name!r}: {_first_line(exc)}") from None
        self.name = name

    def __call__(self) -> ReasoningGymEnv:
        return ReasoningGymEnv(self.name, self.dataset)


class ReasoningGymEnv:
    """One turn: the entry's question, then the dataset's own ``score_answer`` of the turn's answer (the text in
    its last ``<answer>...</answer>``, else the whole turn)."""

    def __init__(self, name: str, dataset: Any):
        self.name, self.dataset = name, dataset
        self.entry: dict[str, Any] = {}

    def reset(self, row: dict[str, Any]) -> str:
        if not isinstance(row.get("index"), int):
            raise ConfigError(
                f"env={self.name!r} picks its entry by the row's 'index': run it without --dataset, or give every "
                "line an integer index"
            )
        self.entry = self.dataset[row["index"] % len(self.dataset)]
        return str(self.entry["question"])

    def step(self, model_turn: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        score = self.dataset.score_answer(answer=extract_answer(model_turn), entry=self.entry)
        return "", float(score), True, False, {"answer": self.entry["answer"]}


class TextArenaGames:
    """Makes ``textarena/<EnvId>`` environments (``textarena.make(EnvId, **env_kwargs)``), single-player."""

    def __init__(self, name: str, env_id: str, kwargs: dict[str, Any]):
        self.ta = _require("textarena", "textarena", name)
        known = sorted(self.ta.envs.registration.ENV_REGISTRY)
        if env_id not in known:
            close = difflib.get_close_matches(env_id, known, n=3)
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ConfigError(f"env={name!r} is not a TextArena environment: must be textarena/<EnvId>{hint}")
        self.name, self.env_id, self.kwargs = name, env_id, kwargs

    def __call__(self) -> TextArenaEnv:
        try:
            game = self.ta.make(self.env_id, **self.kwargs)
        except TypeError as exc:
            raise ConfigError(
                f"env_kwargs={self.kwargs!r} is not allowed for env={self.name!r}: {_first_line(exc)}"
            ) from None
        return TextArenaEnv(self.name, game)


class TextArenaEnv:
    """A TextArena game for one player. The model is given what is new at each turn: with the default
    observation wrapper, which repeats the whole history (the player's own moves included, as ``[Player] ...``),
    the text past what it was shown; with a ``-raw`` game the game's messages, not the player's. The return is
    the game's reward for player 0 when it ends (``close()``); a game still under way at ``max_turns`` gets
    none. TextArena seeds Python's global ``random`` at ``reset(seed=...)``."""

    def __init__(self, name: str, game: Any):
        self.name, self.game = name, game
        self.shown = ""

    def reset(self, row: dict[str, Any]) -> str:
        try:
            self.game.reset(num_players=1, seed=row["seed"])
        except Exception as exc:  # noqa: BLE001 - a game for several players says so its own way
            raise ConfigError(f"env={self.name!r} cannot be played by one player: {_first_line(exc)}") from None
        self.shown = ""
        return self._new_text()

    def step(self, model_turn: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        done, info = self.game.step(model_turn)
        if not done:
            return self._new_text(), 0.0, False, False, dict(info or {})
        closed = self.game.close()  # (rewards, game info) in textarena >= 0.7, the rewards before
        rewards = closed[0] if isinstance(closed, tuple) else closed
        return "", float((rewards or {}).get(0, 0.0)), True, False, dict(info or {})

    def _new_text(self) -> str:
        player, observation = self.game.get_observation()
        if not isinstance(observation, str):  # a -raw game: (from, message, type) triples; skip the player's own
            return "\n".join(message for source, message, *_ in observation if source != player)
        new = observation[len(self.shown) :] if observation.startswith(self.shown) else observation
        self.shown = observation
        return new
