"""``distrl tune ALGO ENV --scheduler pbt``: population-based training (Jaderberg et al. 2017,
arXiv:1711.09846) with Ray Tune's ``PopulationBasedTraining`` as the engine.

The population is ``--population`` members, each a distrl run directory ``STUDY_DIR/members/member-NNN``
trained by a :class:`~distrl.tune.ray_tune.Member` (a Tune trial), ``--parallel`` at a time on this machine
(Tune pauses and resumes members from their checkpoints to share the cores) or on the cluster of
``--ray-address``. Every member trains from the same ``--seed``, as Optuna trials do, so members differ only
in their hyperparameters and their history. Their first hyperparameters are drawn from the search space
(``--space``, as for Optuna, less what would change a network's shape) with ``--seed``.

After each interval of ``--perturbation-interval`` steps a member evaluates; Tune's PBT then ranks the
population's last evaluations, and a member in the worst ``--quantile`` copies the checkpoint of one in the
best (truncation selection) and goes on with that member's hyperparameters perturbed. This driver records the
lineage (``lineage.jsonl``: starts, evaluations, exploits, restarts) from the members' results, prints a line
for each, and at the end writes the results (:mod:`distrl.tune.pbt_report`). Ray Tune's own files stay in
``STUDY_DIR/ray``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from distrl.config import OFFLINE_CONFIGS, ConfigError
from distrl.envs.names import resolve_env_id
from distrl.run import checkpoint
from distrl.training.presets import algo_configs, resolve_preset
from distrl.tune.args import TuneArgs
from distrl.tune.budget import fit_interval, fit_space
from distrl.tune.lineage import LINEAGE_FILE, append_event
from distrl.tune.member import SPEC_FILE, PBTSpec
from distrl.tune.space import ONE_MINUS, Space, build_space

CANNOT_MUTATE = (
    "net_arch",
    "activation",
    "n_envs",
    "buffer_size",
    "optimize_memory_usage",
    "normalize_obs",
    "normalize_reward",
    "log_std_init",
    "ortho_init",
    "baseline",
)
"""Fields a member cannot change midway: they shape its networks, environments, statistics or replay buffer,
so another member's checkpoint would not fit (or would mean something else). The default space leaves them
out; a --space that gives them a range is refused (a fixed value is fine)."""
TUNE_EXPERIMENT = "pbt"
"""Ray Tune's experiment: its files in STUDY_DIR/ray/pbt, a folder per member."""
PERTURBATION_FACTORS = (1.2, 0.8)
"""Ray Tune's (and the paper's) perturbation of a continuous value."""


def import_tune() -> Any:
    try:
        from ray import tune
    except ImportError:
        raise ConfigError("Ray Tune is not installed: pip install 'distrl[pbt]'") from None
    return tune


class PBTStudy:
    """One PBT study: its space and members' settings checked before anything starts, then Tune's run."""

    def __init__(self, algo: str, env: str, args: TuneArgs):
        if algo in OFFLINE_CONFIGS:
            raise ConfigError(
                f"scheduler='pbt' is not available for {algo}: an offline algorithm is tuned by the Optuna study "
                "(--scheduler optuna)"
            )
        self.tune = import_tune()
        self.algo, self.env, self.args = algo, env, args
        self.env_id = resolve_env_id(env)
        self.interval = args.perturbation_interval or max(1, args.budget_steps // 10)
        space = mutable_space(algo, args.space, not args.no_default_space)
        run = {
            "env_kwargs": list(args.env_kwargs),
            "wrappers": list(args.wrappers),
            "policy": args.policy,
            "device": args.device,
            "threads": args.threads,
            "seed": args.seed,
            "eval_episodes": args.eval_episodes,
            "eval_max_steps": 0,  # a member's score is its whole evaluation: no cap that ends it early
        }
        algo_configs(algo, env, args.preset, run=run)  # the env, preset and flags, checked once
        _, base = resolve_preset(algo, self.env_id, args.preset)
        base.pop("total_steps", None)
        base = {k: list(v) if isinstance(v, tuple) else v for k, v in base.items()}
        base.update({k: list(v) if isinstance(v, tuple) else v for k, v in space.fixed.items()})
        if algo in (
            "sac",
            "dqn",
        ):  # a copy takes the source's replay buffer too (space file: save_replay: false saves disk)
            base.setdefault("save_replay", True)
        space = fit_interval(algo, fit_space(algo, space, base, args.budget_steps, 1), base, self.interval)
        space = one_choice_fixed(space, base)
        name = args.study or f"{algo}-{env.replace('/', '_').replace(':', '_')}"
        self.name = name
        self.dir = Path(args.study_dir or Path("tune") / name).resolve()
        if (self.dir / LINEAGE_FILE).exists():
            raise ConfigError(
                f"study_dir={str(self.dir)!r} holds a PBT study already: give another --study-dir, or draw its "
                f"results with distrl tune report {self.dir}"
            )
        checkpoint.check_writable_dir("study_dir", self.dir)
        self.spec = PBTSpec(
            algo=algo,
            env=env,
            env_id=self.env_id,
            base=base,
            tied=dict(space.tied),
            run=run,
            budget_steps=args.budget_steps,
            interval=self.interval,
            study_dir=str(self.dir),
            mutations={name: describe(dist) for name, dist in space.distributions.items()},
            synchronous=args.synchronous,
        )
        self.rng = np.random.default_rng(args.seed)
        self.initial = [self._accepted(self._sample_all()) for _ in range(args.population)]

    def _sample_all(self) -> dict[str, Any]:
        return {name: sample(mutation, self.rng) for name, mutation in self.spec.mutations.items()}

    def _accepted(self, values: dict[str, Any], tries: int = 100) -> dict[str, Any]:
        """``values``, or where the algorithm's config refuses them (a batch size that does not divide a sampled
        rollout) values drawn afresh until it accepts some: a member must be able to start."""
        refusal = ""
        for _ in range(tries):
            try:
                algo_configs(self.algo, self.env, "none", run=self.spec.run, params=self.spec.values(values))
                return values
            except ConfigError as exc:
                refusal = str(exc)
                values = self._sample_all()
        raise ConfigError(f"space: no values of {tries} drawn make a config {self.algo} accepts; the last: {refusal}")

    def _explore(self, config: dict[str, Any]) -> dict[str, Any]:
        """What PBT's perturbation gives, kept within the ranges and to configs the algorithm accepts."""
        config = keep_in_ranges(config, self.spec.mutations)
        values = self._accepted({name: config[name] for name in self.spec.mutations})
        return {**config, **values}

    def run(self) -> int:
        from distrl.strategies.ray_engine import ray_session
        from distrl.tune.pbt_report import write_pbt_results
        from distrl.tune.ray_tune import LineageRecorder, Member, SeededPBT

        tune, args = self.tune, self.args
        (self.dir / "members").mkdir(parents=True, exist_ok=True)
        (self.dir / SPEC_FILE).write_text(self.spec.to_json() + "\n")
        lineage = self.dir / LINEAGE_FILE
        for i, values in enumerate(self.initial):
            append_event(lineage, {"event": "start", "member": member_name(i), "hyperparameters": values})
        print(
            f"PBT study {self.name!r} in {self.dir}: {args.population} members, {args.budget_steps:,} steps each, "
            f"perturbed every {self.interval:,} steps; mutating {', '.join(self.spec.mutations)}",
            flush=True,
        )
        scheduler = SeededPBT(
            seed=args.seed,
            time_attr="env_steps",
            metric="eval_return",
            mode="max",
            # Each result ends an interval (Member.step trains one, to the next multiple of the interval). Ranked
            # at once, the population waits until every member has passed the next multiple; asynchronously,
            # every result is considered (an interval that ends past its multiple is followed by a shorter one).
            perturbation_interval=self.interval if args.synchronous else 1,
            hyperparam_mutations={n: mutation_for_tune(m, self.rng) for n, m in self.spec.mutations.items()},
            quantile_fraction=args.quantile,
            resample_probability=args.resample_probability,
            perturbation_factors=PERTURBATION_FACTORS,
            custom_explore_fn=self._explore,
            log_config=False,
            synch=args.synchronous,
        )
        initial = self.initial
        param_space: dict[str, Any] = {
            "member": tune.grid_search(list(range(args.population))),
            "study": self.spec.to_json(),
            **{n: tune.sample_from(lambda config, n=n: initial[config["member"]][n]) for n in self.spec.mutations},
        }
        resources = {"cpu": args.threads, "gpu": 1 / args.parallel if args.device == "cuda" else 0}
        tuner = tune.Tuner(
            tune.with_resources(Member, resources),
            param_space=param_space,
            tune_config=tune.TuneConfig(
                scheduler=scheduler,
                reuse_actors=True,  # a member paused for another hands over its process: no new one each interval
                trial_name_creator=_trial_name,
                trial_dirname_creator=_trial_name,
            ),
            run_config=tune.RunConfig(
                name=TUNE_EXPERIMENT,
                storage_path=str(self.dir / "ray"),
                verbose=0,
                callbacks=[LineageRecorder(lineage, sys.stdout, self.dir / "ray" / TUNE_EXPERIMENT)],
                failure_config=tune.FailureConfig(max_failures=args.max_failures),
                # Every interval's checkpoint: a member that fails goes on from its last one; PBT copies the
                # newest of the best. Each is a distrl checkpoint of a few files (see Member.save_checkpoint).
                checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
            ),
        )
        num_cpus = args.parallel * args.threads
        with (
            ray_session(args.ray_address, self.dir, num_cpus=num_cpus, debug=args.debug),
            quiet_tune(self.dir / "ray", args.debug),
        ):
            tuner.fit()
        return write_pbt_results(self.dir)


def member_name(index: int) -> str:
    return f"member-{index:03d}"


def _trial_name(trial: Any) -> str:
    """A Tune trial's name, and the name of its member: fixed when the study made it, kept through exploits."""
    return member_name(int(trial.config["member"]))


def mutable_space(algo: str, path: str, defaults: bool) -> Space:
    """The search space a PBT study mutates: ``build_space``'s, without the fields of :data:`CANNOT_MUTATE`
    (left out of the default space; refused where ``path`` gives them a range)."""
    space = build_space(algo, path, defaults=defaults)
    given = build_space(algo, path, defaults=False).distributions if path else {}
    distributions = {}
    for name, dist in space.distributions.items():
        field = name.removeprefix(ONE_MINUS)
        if field not in CANNOT_MUTATE:
            distributions[name] = dist
        elif name in given:
            raise ConfigError(
                f"space={path!r}: {name} cannot be mutated by population-based training (another member's "
                f"checkpoint would not fit): give it one value, or leave it out; fields that cannot be mutated: "
                f"{', '.join(CANNOT_MUTATE)}"
            )
    if not distributions:
        raise ConfigError(f"space={path!r} has no parameter that can be mutated: give at least one range or list")
    tied = {name: source for name, source in space.tied.items() if source in distributions}
    return Space(distributions, tied, space.fixed)


def one_choice_fixed(space: Space, base: dict[str, Any]) -> Space:
    """``space`` with the lists the budget and interval narrowed to one choice moved into ``base``: nothing
    left to mutate (PPO's n_steps where one rollout fills an interval)."""
    import optuna

    distributions = {}
    for name, dist in space.distributions.items():
        if isinstance(dist, optuna.distributions.CategoricalDistribution) and len(dist.choices) == 1:
            base.update(space.values({name: dist.choices[0]}))
        else:
            distributions[name] = dist
    if not distributions:
        raise ConfigError("space: the budget and interval leave no parameter more than one value to mutate")
    return Space(distributions, space.tied, space.fixed)


def describe(dist: Any) -> dict[str, Any]:
    """An Optuna distribution as a JSON range ({type, low, high, log[, step]}) or choices ({choices})."""
    import optuna

    if isinstance(dist, optuna.distributions.CategoricalDistribution):
        return {"choices": list(dist.choices)}
    kind = "int" if isinstance(dist, optuna.distributions.IntDistribution) else "float"
    out = {"type": kind, "low": dist.low, "high": dist.high, "log": bool(dist.log)}
    if dist.step is not None:
        out["step"] = dist.step
    return out


def sample(mutation: dict[str, Any], rng: np.random.Generator) -> Any:
    """A value drawn from a range (uniformly, or uniformly in its logarithm) or from choices."""
    if "choices" in mutation:
        return mutation["choices"][int(rng.integers(len(mutation["choices"])))]
    low, high = mutation["low"], mutation["high"]
    value = math.exp(rng.uniform(math.log(low), math.log(high))) if mutation["log"] else rng.uniform(low, high)
    return snap(value, mutation)


def snap(value: float, mutation: dict[str, Any]) -> Any:
    """``value`` kept within its range, on its step, an int where the range is of ints."""
    low, high = mutation["low"], mutation["high"]
    value = min(max(value, low), high)
    if mutation.get("step"):
        value = low + round((value - low) / mutation["step"]) * mutation["step"]
        value = min(value, high)
    return int(round(value)) if mutation["type"] == "int" else float(value)


def mutation_for_tune(mutation: dict[str, Any], rng: np.random.Generator) -> Any:
    """What Tune's PBT takes for one parameter: the list of choices (an exploit moves to a neighbour), or a
    function drawing a fresh value (an exploit multiplies the value by 0.8 or 1.2 instead, most of the time)."""
    if "choices" in mutation:
        return list(mutation["choices"])
    return lambda: sample(mutation, rng)


def keep_in_ranges(config: dict[str, Any], mutations: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """PBT's perturbed config with every range's value put back within its range (a value times 1.2 may leave
    it) and on its step."""
    for name, mutation in mutations.items():
        if "choices" not in mutation:
            config[name] = snap(config[name], mutation)
    return config


@contextlib.contextmanager
def quiet_tune(folder: Path, debug: bool) -> Any:
    """Ray Tune's terminal output (its experiment table, paths, warnings, members' tracebacks) in
    ``folder/tune.log`` or nowhere, unless ``debug``; its result files (CSV, JSON, TensorBoard per trial) left
    out: the members' run directories and the lineage hold what a study writes."""
    saved = os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS")
    os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = "1"
    tune_logger = logging.getLogger("ray.tune")
    level = tune_logger.level
    try:
        if debug:
            yield
            return
        folder.mkdir(parents=True, exist_ok=True)
        with (folder / "tune.log").open("a") as log, contextlib.redirect_stdout(log):
            tune_logger.setLevel(logging.CRITICAL)  # a member's failure: one line of the recorder's instead
            yield
    finally:
        tune_logger.setLevel(level)
        if saved is None:
            os.environ.pop("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", None)
        else:
            os.environ["TUNE_DISABLE_AUTO_CALLBACK_LOGGERS"] = saved
