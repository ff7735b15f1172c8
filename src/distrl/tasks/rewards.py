"""Reward functions of text tasks: the built-ins (:mod:`distrl.tasks.builtin_rewards`), a user's own, and calling them
so that none can stall a run.

A reward function scores a batch of completions: ``fn(prompts, completions, **fields) -> list[float]``,
one float per completion. ``prompts`` are the dataset's prompts (a string, or a list of chat messages)
and ``completions`` the decoded completions, both aligned (a prompt is repeated for each of its G
completions); every other field of the dataset's lines arrives as a keyword argument, a list aligned
the same way (``answer=[...]``). This is TRL's convention, so its users' functions work unchanged. A
function that lists a field in its signature without a default needs it: every dataset line must
have it (checked before the run starts). ``None`` (or NaN) means "does not apply" and counts 0.

Several functions are combined with weights; each one's score is logged. No reward can stall or kill a
run: by default each completion is scored by a call of its own in a reward worker process
(:mod:`distrl.tasks.reward_workers`), with a timeout; a call past it is killed with whatever it started, and
the completion scores ``reward_timeout_score`` (or the run ends naming the reward, as the policy says).
With ``reward_workers=0`` each function is called on the whole batch in this process, on a thread with
the timeout: a hung thread cannot be stopped, so the run ends with the reward's name instead of
stalling. Either way a reward that raises or returns the wrong number of values is reported by name.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distrl.config import ConfigError
from distrl.tasks.builtin_rewards import BUILTINS
from distrl.tasks.reward_workers import Outcome, WorkerPool, WorkersFailed


class RewardError(RuntimeError):
    """A reward function raised, returned something other than one number per completion, or did not
    return in time; the message names it."""


@dataclass(frozen=True)
class RewardFunction:
    name: str
    """As the user named it: a built-in's name or 'package.module:function'."""
    fn: Callable[..., Any]
    weight: float
    needs: tuple[str, ...]
    """Dataset fields its signature requires."""
    accepts_any: bool
    """Whether it takes ``**fields`` (else it is passed only the fields it names)."""
    accepts: tuple[str, ...]


def load_reward(name: str, weight: float) -> RewardFunction:
    """A built-in by name or a function by 'package.module:function' (imported: the user named it)."""
    if ":" not in name:
        if name not in BUILTINS:
            raise ConfigError(
                f"rewards={name!r} is not known: must be a built-in ({', '.join(BUILTINS)}) or "
                "'package.module:function'"
            )
        fn = BUILTINS[name]
    else:
        from distrl.envs.names import import_attr  # only a user's own reward needs importing

        fn = import_attr("rewards", name)
    if not callable(fn):
        raise ConfigError(
            f"rewards={name!r} is a {type(fn).__name__}, not a function "
            "fn(prompts, completions, **fields) -> list[float]"
        )
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # a builtin without a signature: pass it everything
        return RewardFunction(name, fn, weight, (), True, ())
    params = signature.parameters.values()
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params)
    if not {"prompts", "completions"} <= named and not accepts_any:
        raise ConfigError(
            f"rewards={name!r} has the signature {signature}: a reward function takes "
            "(prompts, completions, **fields) by those names"
        )
    needs = tuple(
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.default is p.empty
        and p.name not in ("prompts", "completions")
    )
    return RewardFunction(name, fn, weight, needs, accepts_any, tuple(sorted(named)))


def load_function(name: str) -> Callable[..., Any]:
    """The function a reward's name stands for: what a reward worker process imports and calls."""
    return load_reward(name, 1.0).fn


POLICIES = ("score", "fail")
"""What a reward call that times out (``reward_timeout_policy``) or raises (``reward_error_policy``) does."""


@dataclass(frozen=True)
class RewardFailure:
    """A reward call that timed out or failed, and whose completion scored ``reward_timeout_score``."""

    reward: str
    index: int
    """The completion's row in its batch."""
    timed_out: bool
    """Timed out; else raised, returned something other than a float, or ended its worker process."""
    text: str
    """One line naming the completion (its dataset line), the reward, what happened and the score given."""

    def moved(self, offset: int) -> RewardFailure:
        """The same failure, its row ``offset`` further (batches joined or cut)."""
        return dataclasses.replace(self, index=self.index + offset)


@dataclass(frozen=True)
class RewardScores:
    """What scoring a batch of ``n`` completions by K reward functions came to."""

    scores: np.ndarray
    """[n, K] float32: each function's score of each completion."""
    seconds: np.ndarray | None = None
    """[n, K] float32: seconds each function took per completion: its call on that completion in a reward
    worker, or its call on the whole batch divided among the batch with reward_workers=0."""
    failures: tuple[RewardFailure, ...] = ()
    """The calls that timed out or failed and were scored ``reward_timeout_score``, by row."""


class RewardSet:
    """Weighted reward functions, and calling them so that none can stall or kill a run.

    With ``workers`` > 0 every completion is scored by a call of its own, ``workers`` calls at a time in
    reward worker processes (started on the first call), each with ``timeout_s``. A call past it is killed
    with whatever it started; ``timeout_policy="score"`` gives the completion ``timeout_score`` and goes on,
    ``"fail"`` raises :class:`RewardError`. A reward that raises (or returns no float, or ends its worker)
    raises :class:`RewardError` under ``error_policy="fail"``, or scores ``timeout_score`` under ``"score"``.
    With ``workers=0`` each function is called once on the whole batch, in this process, on a thread with
    ``timeout_s``; a thread cannot be stopped, so a call past it raises whatever the policy. Close the set
    when done (it stops its worker processes).
    """

    def __init__(
        self,
        names: Sequence[str],
        weights: Sequence[float] = (),
        timeout_s: float = 60.0,
        workers: int = 0,
        timeout_policy: str = "score",
        error_policy: str = "fail",
        timeout_score: float = 0.0,
    ):
        if not names:
            raise ConfigError(
                "rewards=() is not allowed: must name at least one reward function "
                f"(--reward NAME, a built-in ({', '.join(BUILTINS)}) or package.module:function)"
            )
        if weights and len(weights) != len(names):
            raise ConfigError(
                f"reward_weights={tuple(weights)!r} is not allowed: must give one weight per reward "
                f"({len(names)}: {', '.join(names)}), or none for weight 1 each"
            )
        for field, value in (("reward_timeout_policy", timeout_policy), ("reward_error_policy", error_policy)):
            if value not in POLICIES:
                raise ConfigError(f"{field}={value!r} is not allowed: must be one of {', '.join(POLICIES)}")
        if workers < 0:
            raise ConfigError(f"reward_workers={workers} is not allowed: must be >= 0 (0: in this process)")
        if not timeout_s > 0:
            raise ConfigError(f"reward_timeout_s={timeout_s} is not allowed: must be > 0")
        self.functions = [load_reward(name, float(w)) for name, w in zip(names, weights or [1.0] * len(names))]
        self.timeout_s = timeout_s
        self.workers = workers
        self.timeout_policy, self.error_policy, self.timeout_score = timeout_policy, error_policy, timeout_score
        self._pool: WorkerPool | None = None

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.functions)

    @property
    def weights(self) -> np.ndarray:
        return np.array([f.weight for f in self.functions], dtype=np.float32)

    def needs(self) -> dict[str, tuple[str, ...]]:
        """Reward name → the dataset fields it requires."""
        return {f.name: f.needs for f in self.functions if f.needs}

    def __call__(self, prompts: list[Any], completions: list[str], fields: dict[str, list[Any]]) -> np.ndarray:
        """``[n, K]`` scores of ``n`` completions by the K functions; raises :class:`RewardError` naming the culprit."""
        return self.score(prompts, completions, fields).scores

    def score(
        self,
        prompts: list[Any],
        completions: list[str],
        fields: dict[str, list[Any]],
        labels: Sequence[str] | None = None,
    ) -> RewardScores:
        """The scores of ``n`` completions, the seconds they took and the calls that failed but were scored;
        ``labels[i]`` says where completion ``i`` comes from in messages (its dataset line)."""
        n = len(completions)
        labels = labels or [f"completion {i + 1} of {n}" for i in range(n)]
        if self.workers == 0:
            return self._score_in_process(prompts, completions, fields, labels)
        return self._score_in_workers(prompts, completions, fields, labels)

    def close(self) -> None:
        """Stop the reward worker processes, and whatever their calls started."""
        if self._pool is not None:
            self._pool.close()

    def _given(self, f: RewardFunction, fields: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return fields if f.accepts_any else {key: v for key, v in fields.items() if key in f.accepts}

    def _score_in_workers(
        self, prompts: list[Any], completions: list[str], fields: dict[str, list[Any]], labels: Sequence[str]
    ) -> RewardScores:
        n = len(completions)
        jobs = []
        for k, f in enumerate(self.functions):
            given = self._given(f, fields)
            for i in range(n):
                one = {key: [values[i]] for key, values in given.items()}
                jobs.append((k, {"prompts": [prompts[i]], "completions": [completions[i]], **one}))
        scores = np.zeros((n, len(self.functions)), dtype=np.float32)
        seconds = np.zeros_like(scores)
        failures: list[RewardFailure] = []

        def take(j: int, outcome: Outcome) -> None:
            k, i = divmod(j, n)
            f = self.functions[k]
            value, problem = self._judge(f, outcome, 1, labels[i])
            scores[i, k] = self.timeout_score if value is None else value[0]
            seconds[i, k] = outcome.seconds
            if problem:
                failures.append(RewardFailure(f.name, i, outcome.timed_out, self._failure_text(labels[i], problem)))

        if self._pool is None:
            self._pool = WorkerPool(load_function, self.names, self.workers, self.timeout_s)
        try:
            self._pool.run(jobs, take)
        except WorkersFailed as exc:
            raise RewardError(str(exc)) from None
        order = {name: k for k, name in enumerate(self.names)}
        failures.sort(key=lambda failure: (failure.index, order[failure.reward]))
        return RewardScores(scores, seconds, tuple(failures))

    def _score_in_process(
        self, prompts: list[Any], completions: list[str], fields: dict[str, list[Any]], labels: Sequence[str]
    ) -> RewardScores:
        n = len(completions)
        scores = np.zeros((n, len(self.functions)), dtype=np.float32)
        seconds = np.zeros_like(scores)
        failures = []
        for k, f in enumerate(self.functions):
            start = time.perf_counter()
            value, problem = self._judge(f, self._call(f, prompts, completions, self._given(f, fields)), n, "")
            seconds[:, k] = (time.perf_counter() - start) / max(n, 1)
            scores[:, k] = self.timeout_score if value is None else value
            if problem:  # the call was the whole batch's: every completion in it scored the timeout score
                text = [self._failure_text(label, problem) for label in labels]
                failures += [RewardFailure(f.name, i, False, text[i]) for i in range(n)]
        return RewardScores(scores, seconds, tuple(sorted(failures, key=lambda failure: failure.index)))

    def _judge(self, f: RewardFunction, outcome: Outcome, n: int, where: str) -> tuple[np.ndarray | None, str]:
        """A call's ``n`` scores, or (None, what went wrong) where the policy scores it instead; raises
        :class:`RewardError` where the policy ends the run."""
        if outcome.timed_out:
            problem = f"reward {f.name!r} did not return within reward_timeout_s={self.timeout_s:g} s"
            if self.timeout_policy == "fail":
                raise RewardError(f"{problem} on {where}")
            return None, problem
        try:
            if outcome.error:
                raise RewardError(f"reward {f.name!r} {outcome.error}")
            return _as_scores(f.name, outcome.value, n), ""
        except RewardError as exc:
            if self.error_policy == "fail":
                raise
            return None, str(exc)

    def _failure_text(self, label: str, problem: str) -> str:
        return f"{label}: {problem}; scored {self.timeout_score:g}"

    def _call(
        self, f: RewardFunction, prompts: list[Any], completions: list[str], fields: dict[str, list[Any]]
    ) -> Outcome:
        box: dict[str, Any] = {}

        def run() -> None:
            try:
                box["value"] = f.fn(prompts=prompts, completions=completions, **fields)
            except BaseException as exc:  # noqa: BLE001 - reported by name
                box["error"] = exc

        # a daemon thread, not an executor: a hung reward must not keep the process from exiting
        thread = threading.Thread(target=run, name=f"reward {f.name}", daemon=True)
        thread.start()
        thread.join(self.timeout_s)
        if thread.is_alive():  # it cannot be stopped: the run ends, whatever the timeout policy
            raise RewardError(
                f"reward {f.name!r} did not return within reward_timeout_s={self.timeout_s:g} s "
                f"(scoring {len(completions)} completions)"
            )
        if "error" in box:
            exc = box["error"]
            return Outcome(error=f"raised {type(exc).__name__}: {exc}")
        return Outcome(value=box["value"])


class RewardLog:
    """Over a run: the reward calls that failed and were scored anyway, and the time each function takes."""

    KEPT = 20
    """Failures summary.json names (events.log names every one)."""
    RECENT = 10_000
    """Completions per function the run's p95 time is taken over (the latest)."""

    def __init__(self, names: Sequence[str]):
        self.names = tuple(names)
        self.timeouts = self.errors = 0
        self.first: list[str] = []
        self.time_sum = np.zeros(len(self.names))
        self.timed = 0
        self.recent: list[deque[float]] = [deque(maxlen=self.RECENT) for _ in self.names]
        self.since: list[np.ndarray] = []
        """The seconds recorded since the last :meth:`figures`."""

    def add(self, seconds: np.ndarray | None, failures: Sequence[RewardFailure]) -> None:
        """Record a scored batch's ``seconds [n, K]`` (None: not timed) and failed calls."""
        for failure in failures:
            self.timeouts += failure.timed_out
            self.errors += not failure.timed_out
            if len(self.first) < self.KEPT:
                self.first.append(failure.text)
        if seconds is None or not len(seconds):
            return
        self.since.append(seconds)
        self.timed += len(seconds)
        self.time_sum += seconds.sum(axis=0)
        for k in range(len(self.names)):
            self.recent[k].extend(seconds[:, k].tolist())

    def figures(self) -> dict[str, float]:
        """For TensorBoard: per function the mean and p95 seconds per completion since the last call, and the
        failed calls of the run so far (nothing when no batch was timed since)."""
        if not self.since:
            return {}
        seconds, self.since = np.concatenate(self.since), []
        out = {"rewards/timeouts": float(self.timeouts), "rewards/errors": float(self.errors)}
        for k, name in enumerate(self.names):
            out[f"rewards/{name}/time_mean_s"] = float(seconds[:, k].mean())
            out[f"rewards/{name}/time_p95_s"] = float(np.quantile(seconds[:, k], 0.95))
        return out

    def summary(self) -> dict[str, Any]:
        """summary.json's figures: failed calls counted, the first :attr:`KEPT` named, and per function the mean
        seconds per completion over the run and the p95 over its latest :attr:`RECENT` completions."""
        times = {
            name: {"mean": float(self.time_sum[k] / self.timed), "p95": float(np.quantile(self.recent[k], 0.95))}
            for k, name in enumerate(self.names)
            if self.timed
        }
        return {
            "reward_timeouts": self.timeouts,
            "reward_errors": self.errors,
            "reward_failures": list(self.first),
            "reward_time_s": times,
        }


def _as_scores(name: str, values: Any, n: int) -> np.ndarray:
    """A reward's return value as ``n`` floats (None and NaN as 0), or a RewardError saying what is wrong."""
    if hasattr(values, "tolist"):  # numpy arrays, torch tensors
        values = values.tolist()
    if not isinstance(values, (list, tuple)):
        raise RewardError(
            f"reward {name!r} returned a {type(values).__name__}: must return a list of {n} floats, one per completion"
        )
    if len(values) != n:
        raise RewardError(
            f"reward {name!r} returned {len(values)} values for {n} completions: must return one float per completion"
        )
    out = np.zeros(n, dtype=np.float32)
    for i, v in enumerate(values):
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise RewardError(f"reward {name!r} returned {v!r} at index {i}: must return floats (or None)")
        if math.isinf(v):
            raise RewardError(f"reward {name!r} returned {v!r} at index {i}: must return finite floats")
        out[i] = 0.0 if math.isnan(v) else v
    return out
