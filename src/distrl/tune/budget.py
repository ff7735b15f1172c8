"""What a trial's budget (``--budget-steps``) means for each algorithm, and the space that keeps to it.

A trainer runs whole iterations and stops after the first one that reaches its ``total_steps``; a
trial's ``total_steps`` is set so that it never trains past the budget:

* ppo: an iteration is a rollout of ``n_steps × n_envs`` steps. The space keeps the ``n_steps`` whose
  rollout fits in ``budget_steps / evaluations`` (every evaluation follows an update of its own), and
  a trial trains the most whole rollouts the budget holds: at least ``budget_steps × (1 - 1 /
  evaluations)`` steps, at most ``budget_steps``.
* sac and dqn: an iteration is ``train_freq × n_envs`` steps, kept like ppo's rollout. The budget counts the
  ``learning_starts`` steps of random actions too, and the space keeps the ``learning_starts`` below
  half of it: a trial learns for half its budget or more.
* the offline algorithms (bc, td3bc, iql, cql): an iteration is one gradient step, and the budget counts them.
* reinforce: an iteration is ``episodes_per_iter`` whole episodes, whose length is known only once
  they end. A trial starts iterations while it is under the budget, so its last one may end past it,
  by less than one iteration; the steps it trained are in its ``summary.json``.

A budget that leaves a parameter no value is refused with the smallest budget that would do.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from distrl.config import ALGO_CONFIGS, ConfigError
from distrl.tune.space import Space

ITERATION_FIELD = {"ppo": "n_steps", "sac": "train_freq", "dqn": "train_freq"}
"""The field that, times ``n_envs``, is the steps of one iteration, for the algorithms whose iterations
have a fixed length."""


def fit_space(algo: str, space: Space, base: dict[str, Any], budget: int, evaluations: int) -> Space:
    """``space`` without the values no trial could keep to ``budget``; a ConfigError where none is left."""
    distributions = dict(space.distributions)
    if algo in ITERATION_FIELD:
        iteration = "rollout" if algo == "ppo" else "iteration"
        _keep_iterations_within(
            algo,
            space,
            base,
            budget // evaluations,
            distributions,
            lambda field, least, n_envs: (
                f"budget_steps={budget} is not allowed: must be >= {least * n_envs * evaluations}, one {iteration} "
                f"({field}={least} × n_envs={n_envs} = {least * n_envs} steps) per evaluation "
                f"(evaluations={evaluations}); or give fewer --evaluations"
            ),
        )
    if algo in ("sac", "dqn"):
        least = _smallest("learning_starts", space, base, algo)
        _keep_below(
            "learning_starts",
            (budget - 1) // 2,
            distributions,
            space.fixed.get("learning_starts", _value("learning_starts", base, algo)),
            f"budget_steps={budget} is not allowed: must be >= {2 * least + 1}, more than twice learning_starts="
            f"{least}, so that a trial learns for half its budget or more",
        )
    return dataclasses.replace(space, distributions=distributions)


def fit_interval(algo: str, space: Space, base: dict[str, Any], interval: int) -> Space:
    """``space`` without the values whose iteration is longer than a population-based training study's
    perturbation ``interval`` (every interval then ends after an update of its own); a ConfigError where none
    is left."""
    if algo not in ITERATION_FIELD:
        return space
    distributions = dict(space.distributions)
    _keep_iterations_within(
        algo,
        space,
        base,
        interval,
        distributions,
        lambda field, least, n_envs: (
            f"perturbation_interval={interval} is not allowed: must be >= {least * n_envs}, one iteration "
            f"({field}={least} × n_envs={n_envs} = {least * n_envs} steps)"
        ),
    )
    return dataclasses.replace(space, distributions=distributions)


def _keep_iterations_within(
    algo: str,
    space: Space,
    base: dict[str, Any],
    steps: int,
    distributions: dict[str, Any],
    refusal: Callable[[str, int, int], str],
) -> None:
    """Narrow ``algo``'s iteration field (n_steps or train_freq) in ``distributions`` to the values whose iteration
    (times n_envs) fits in ``steps``; where none does, a ConfigError saying ``refusal(field, least, n_envs)``."""
    field = ITERATION_FIELD[algo]
    n_envs, least = _smallest("n_envs", space, base, algo), _smallest(field, space, base, algo)
    fixed = space.fixed.get(field, _value(field, base, algo))
    _keep_below(field, steps // n_envs, distributions, fixed, refusal(field, least, n_envs))


def trial_steps(algo: str, values: dict[str, Any], budget: int, evaluations: int) -> int:
    """The ``total_steps`` of a trial with these config values: the budget rounded down to whole iterations.

    Raises ConfigError for values whose iteration is longer than an evaluation's share of the budget (a
    space that samples ``n_envs`` too can combine such values).
    """
    if algo not in ITERATION_FIELD:
        return budget
    field = ITERATION_FIELD[algo]
    n_envs, length = _value("n_envs", values, algo), _value(field, values, algo)
    iteration = n_envs * length
    if iteration > budget // evaluations:
        raise ConfigError(
            f"{field}={length} × n_envs={n_envs} = {iteration} steps is not allowed with budget_steps={budget}: "
            f"must be <= {budget // evaluations} (budget_steps / evaluations)"
        )
    return budget // iteration * iteration


def _value(name: str, values: dict[str, Any], algo: str) -> Any:
    """A trial's value of ``name``: as sampled or preset, else the config's default."""
    return values[name] if name in values else _default(algo, name)


def _default(algo: str, name: str) -> Any:
    return next(f.default for f in dataclasses.fields(ALGO_CONFIGS[algo]) if f.name == name)


def _smallest(name: str, space: Space, base: dict[str, Any], algo: str) -> int:
    """The smallest value of ``name`` a trial can have: its space's, its fixed or preset value, or the default."""
    if name in space.distributions:
        numbers = [v for v in _values(space.distributions[name]) if isinstance(v, int | float)]
        return int(min(numbers)) if numbers else 1
    return int(space.fixed.get(name, _value(name, base, algo)))


def _values(dist: Any) -> list[Any]:
    """A categorical distribution's choices, a range's ends."""
    import optuna

    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return list(dist.choices)
    return [dist.low, dist.high]


def _keep_below(name: str, limit: int, distributions: dict[str, Any], value: Any, refusal: str) -> None:
    """Narrow ``name``'s distribution to values <= ``limit`` (or check its one ``value``, where it is not
    sampled); raise ConfigError(``refusal``) where no value is left."""
    import optuna

    if name not in distributions:
        if isinstance(value, int | float) and value > limit:
            raise ConfigError(refusal)
        return
    dist = distributions[name]
    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        kept = [c for c in dist.choices if not isinstance(c, int | float) or c <= limit]
        if not kept:
            raise ConfigError(refusal)
        distributions[name] = optuna.distributions.CategoricalDistribution(kept)
    elif dist.low > limit:
        raise ConfigError(refusal)
    elif dist.high > limit:
        if isinstance(dist, optuna.distributions.IntDistribution):
            high = dist.low + (limit - dist.low) // dist.step * dist.step
            distributions[name] = optuna.distributions.IntDistribution(dist.low, high, log=dist.log, step=dist.step)
        else:
            distributions[name] = optuna.distributions.FloatDistribution(dist.low, limit, log=dist.log, step=dist.step)
