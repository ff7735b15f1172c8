"""Text environments: multi-turn episodes a language model plays, for GRPO (``distrl train grpo ENV --model DIR``).

A text environment answers the model's turns::

    env.reset(row) -> observation
    env.step(model_turn) -> (observation, reward, terminated, truncated, info)

An observation is a string, or a list of chat messages ``{"role": ..., "content": ...}`` (rendered with the
tokenizer's chat template). ``reset`` gives the episode's first observation, which the model reads as its
prompt; ``step`` gets the text of one model turn and gives the *new* observation only (what the environment
says next, not the conversation so far), the turn's reward, and whether the episode ended. The episode's
return is the sum of its rewards (undiscounted). How the turns become one token sequence is
:mod:`distrl.nets.multi_turn`'s business.

ENV names an environment in one of three ways:

- ``package.module:factory``: ``factory(**env_kwargs)`` (a function, or a class) returns a new environment.
  It is called once per rollout (``n = B * G`` times per draw: every rollout has an environment of its own)
  and once more to check what it returns before the run starts. The name is code a run records: loading a recorded run imports it
  only with the user's say-so (:mod:`distrl.run.trust`).
- ``reasoning_gym/<task>``: a reasoning-gym procedural task as a one-turn environment (``pip install
  'distrl[textenvs]'``); ``env_kwargs`` pass the dataset's ``size`` (default 10,000) and the task's config.
- ``textarena/<EnvId>``: a single-player TextArena game, e.g. ``textarena/GuessTheNumber-v0``;
  ``env_kwargs`` go to ``textarena.make``.

**Rows.** Each prompt position of the run (see :func:`distrl.data.groups.step_positions`) has a row: the
dataset's line at that position when ``--dataset`` is given (lines are JSON objects; epochs are fresh
permutations, as for prompt datasets), else ``{"index": position}``. A group is G rollouts of the same row.

**Seeding.** ``reset`` gets the row with two more fields: ``seed``, keyed by (run seed, prompt position) and so
the same for the G rollouts of a group (they start the same game: a group-relative advantage compares answers
to one problem), and ``member``, the rollout's place in its group (0 .. G - 1), for an environment that wants
noise of its own per rollout (key it by ``(seed, member)``). An environment that draws its randomness from
these alone plays identical episodes under every strategy and after a resume.

**Rewards.** A scored batch's first reward is ``env``, the episodes' returns (weight 1); the ``--reward``
functions, if any, follow with their weights, scoring the final transcript (the model's turns and the
environment's answers, as text): ``fn(prompts, completions, **fields)`` with each row's ``prompt`` field (``""``
without one) and its other fields.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np

from distrl.config import ConfigError
from distrl.envs.names import import_attr
from distrl.tasks.prompts import JsonlRows
from distrl.tasks.rewards import RewardScores, RewardSet
from distrl.tasks.streams import KeyedStreams
from distrl.tasks.text_adapters import ReasoningGymTasks, TextArenaGames

Observation = str | list[dict[str, str]]
"""What an environment says: text, or chat messages for the tokenizer's chat template."""
ENV_REWARD = "env"
"""The name of the episodes' return among a text-environment task's rewards."""
SET_FIELDS = ("seed", "member")
"""The fields distrl adds to a row before ``reset`` reads it."""
SEED_TAG = 0x7E27


class TextEnv(Protocol):
    """A text environment: see the module's docstring."""

    def reset(self, row: dict[str, Any]) -> Observation: ...

    def step(self, model_turn: str) -> tuple[Observation, float, bool, bool, dict[str, Any]]: ...


class Transition(NamedTuple):
    """One checked answer of an environment to a model turn."""

    observation: Observation
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any]


class CheckedEnv:
    """A user's environment whose answers are checked: a wrong one is a one-line ConfigError naming ``name``."""

    def __init__(self, name: str, env: Any):
        self.name, self.env = name, env

    def reset(self, row: dict[str, Any]) -> Observation:
        return self._observation(self.env.reset(row), "reset")

    def step(self, model_turn: str) -> Transition:
        out = self.env.step(model_turn)
        if not isinstance(out, tuple) or len(out) != 5:
            raise ConfigError(
                f"env={self.name!r}: step returned {_shown(out)}: must return a tuple (observation, reward, "
                "terminated, truncated, info)"
            )
        observation, reward, terminated, truncated, info = out
        if isinstance(reward, bool) or not isinstance(reward, (int, float, np.floating, np.integer)):
            raise ConfigError(f"env={self.name!r}: step returned the reward {_shown(reward)}: must be a float")
        if not math.isfinite(float(reward)):
            raise ConfigError(f"env={self.name!r}: step returned the reward {reward!r}: must be finite")
        return Transition(
            self._observation(observation, "step"), float(reward), bool(terminated), bool(truncated), info
        )

    def _observation(self, observation: Any, method: str) -> Observation:
        if isinstance(observation, str) or (
            isinstance(observation, list)
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in observation
            )
        ):
            return observation
        raise ConfigError(
            f"env={self.name!r}: {method} returned the observation {_shown(observation)}: must be a string or a "
            "list of chat messages {'role': str, 'content': str}"
        )


def _shown(value: Any) -> str:
    text = repr(value).replace("\n", " ")
    return f"{type(value).__name__} {text[:60]}{'...' if len(text) > 60 else ''}"


def load_env_factory(name: str, kwargs: dict[str, Any], seed: int) -> Callable[[], CheckedEnv]:
    """What makes one environment of ENV ``name`` (called once per rollout); checks one before handing it out."""
    kind, _, rest = name.partition("/")
    if ":" not in name and kind == "reasoning_gym":
        make: Callable[[], Any] = ReasoningGymTasks(name, rest, seed, kwargs)
    elif ":" not in name and kind == "textarena":
        make = TextArenaGames(name, rest, kwargs)
    else:
        make = _user_factory(name, kwargs)
    env = make()
    for method in ("reset", "step"):
        if not callable(getattr(env, method, None)):
            raise ConfigError(
                f"env={name!r} made a {type(env).__name__}, which has no {method} method: a text environment has "
                "reset(row) -> observation and step(model_turn) -> (observation, reward, terminated, truncated, info)"
            )
    return lambda: CheckedEnv(name, make())


def _user_factory(name: str, kwargs: dict[str, Any]) -> Callable[[], Any]:
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ConfigError(
            f"env={name!r} is not allowed: a text environment is 'package.module:factory', "
            f"reasoning_gym/<task> or textarena/<EnvId>"
        )
    factory = import_attr("env", name)
    if not callable(factory):
        raise ConfigError(
            f"env={name!r} is a {type(factory).__name__}, not a function: must be a factory(**env_kwargs) "
            "returning a text environment"
        )
    try:
        inspect.signature(factory).bind(**kwargs)
    except ValueError:  # no signature to read: the call will say
        pass
    except TypeError as exc:
        raise ConfigError(f"env_kwargs={kwargs!r} is not allowed for env={name!r}: {exc}") from None
    return lambda: factory(**kwargs)


# ---- rows ----


class EnvRows(JsonlRows):
    """The lines of a JSONL file of rows (JSON objects) that ``reset`` reads, in the run's order of positions."""

    what = "rows (JSON objects)"

    def check(self, where: str, row: dict[str, Any]) -> dict[str, Any]:
        taken = [name for name in SET_FIELDS if name in row]
        if taken:
            raise ConfigError(
                f"{where} has a field {taken[0]!r}, which distrl sets for reset (the episode's seed and the "
                "rollout's place in its group): rename it"
            )
        return row


def episode_seeds(seed: int, positions: np.ndarray) -> list[int]:
    """Each prompt position's episode seed, keyed by (run seed, position): shared by the rollouts of a group."""
    streams = KeyedStreams(seed, SEED_TAG)
    return [int(streams.at(int(p)).integers(2**31 - 1)) for p in positions]


# ---- the task ----


class TextEnvTask:
    """GRPO's task on a text environment: rows by position, one environment per rollout, the episodes' returns
    (and the ``--reward`` functions on the transcripts) as rewards."""

    def __init__(
        self,
        name: str,
        env_kwargs: dict[str, Any],
        seed: int = 0,
        dataset: str = "",
        functions: RewardSet | None = None,
        max_turns: int = 8,
        max_turn_tokens: int = 0,
    ):
        """``functions``: the ``--reward`` functions, if any, scoring the transcripts."""
        self.name, self.seed = name, seed
        self.max_turns, self.max_turn_tokens = max_turns, max_turn_tokens
        self.rows = EnvRows(dataset, seed) if dataset else None
        self.functions = functions
        self.reward_names: tuple[str, ...] = (ENV_REWARD, *(functions.names if functions else ()))
        self.reward_weights = np.concatenate(
            [np.ones(1, dtype=np.float32), functions.weights if functions else np.zeros(0, np.float32)]
        )
        self._check_fields()
        self.make_env = load_env_factory(name, env_kwargs, seed)

    def _check_fields(self) -> None:
        if self.functions is None:
            return
        for reward, fields in self.functions.needs().items():
            rows = self.rows.rows if self.rows is not None else [{"index": 0}]
            for i, row in enumerate(rows):
                missing = [f for f in fields if f not in row]
                if missing:
                    where = (
                        f"dataset={self.rows.path!r} line {self.rows.lines[i]}" if self.rows else f"env={self.name!r}"
                    )
                    without = "" if self.rows else " (without --dataset a row is {'index': position})"
                    raise ConfigError(f"{where} has no field {missing[0]!r}, which reward {reward!r} needs{without}")

    def prompts(self, positions: np.ndarray) -> list[dict[str, Any]]:
        """The rows at these positions (what ``reset`` reads, less the seed and member)."""
        if self.rows is not None:
            return [self.rows.rows[i] for i in self.rows.row_indices(positions)]
        return [{"index": int(p)} for p in positions]

    def eval_positions(self, most: int) -> np.ndarray:
        """The positions a greedy evaluation plays: the run's first ``most`` (at most one epoch of a dataset)."""
        return np.arange(min(most, len(self.rows)) if self.rows is not None else most, dtype=np.int64)

    def start(self, positions: np.ndarray, group_size: int) -> tuple[list[CheckedEnv], list[Observation]]:
        """``B * G`` fresh environments (rows grouped by prompt) and their first observations."""
        envs, first = [], []
        for row, seed in zip(self.prompts(positions), episode_seeds(self.seed, positions)):
            for member in range(group_size):
                env = self.make_env()
                first.append(env.reset({**row, "seed": seed, "member": member}))
                envs.append(env)
        return envs, first

    def rewards(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """``[n, K - 1]``: the ``--reward`` functions' scores of the transcripts ``texts``; the first reward, ``env``,
        is the episodes' return, which the draw recorded (:attr:`distrl.data.groups.GroupSamples.env_return`)."""
        return self.score(positions, group_size, tokens, texts).scores

    def score(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> RewardScores:
        """:meth:`rewards`, with the seconds each function took and the calls that failed but were scored."""
        if self.functions is None:
            return RewardScores(np.zeros((len(texts), 0), dtype=np.float32))
        rows = [row for row in self.prompts(positions) for _ in range(group_size)]
        if self.rows is not None:
            lines = [f"dataset line {self.rows.lines[i]}" for i in self.rows.row_indices(positions)]
        else:
            lines = [f"row {int(p)}" for p in positions]
        labels = [f"{line} (episode {j + 1} of {group_size})" for line in lines for j in range(group_size)]
        names = sorted({key for row in rows for key in row} - {"prompt"})
        fields = {name: [row.get(name) for row in rows] for name in names}
        return self.functions.score([row.get("prompt", "") for row in rows], list(texts), fields, labels)

    def close(self) -> None:
        """Stop the reward worker processes, if scoring started any."""
        if self.functions is not None:
            self.functions.close()
