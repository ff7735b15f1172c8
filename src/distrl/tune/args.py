"""The flags of ``distrl tune ALGO ENV``: an Optuna study's (:mod:`distrl.tune.study`) and a population-based
training study's (:mod:`distrl.tune.pbt`), each refused where it means nothing for the other."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from distrl.config import ConfigError, require


@dataclass(frozen=True)
class TuneArgs:
    """Search hyperparameters with Optuna: TPE sampling, pruning on periodic evaluations; the objective is
    the mean evaluation return at the end of the budget. Writes the study database, every trial's run
    directory, best.json (a preset: distrl train ALGO ENV --preset best.json), top_trials.md and plots.
    With --scheduler pbt: population-based training on Ray Tune (see distrl.tune.pbt)."""

    scheduler: Literal["optuna", "pbt"] = "optuna"
    """optuna: independent trials, sampled by TPE and pruned. pbt: population-based training (Jaderberg et
    al. 2017, arXiv:1711.09846) on Ray Tune: the members of --population train side by side; after each
    perturbation interval a member in the worst quantile copies the checkpoint of one in the best and trains
    on with its hyperparameters perturbed. Writes lineage.jsonl, best.json, best_schedule.json (which distrl
    tune replay STUDY_DIR trains as one run) and plots."""
    trials: int = 20
    """Trials in the study, counting those an earlier run of the command finished (complete, pruned or
    failed); a study that has them all only writes its results again."""
    budget_steps: int = 50_000
    """Environment steps of each trial (pbt: of each member); gradient steps for an offline algorithm's. A PPO or
    SAC trial trains the whole iterations (n_steps or train_freq times n_envs steps) that fit in it, and never
    more; a REINFORCE trial ends with the iteration (of whole episodes) that reaches it. Too small a budget for
    one iteration per evaluation is refused (see distrl.tune.budget)."""
    parallel: int = 1
    """Trials running at once (a process each, or a Ray task each)."""
    storage: str = ""
    """Where the study lives: an SQLAlchemy URL such as postgresql://... or mysql://... to share it
    between machines; empty: sqlite:///STUDY_DIR/study.db."""
    study: str = ""
    """Study name in the storage; empty: ALGO-ENV."""
    study_dir: str = ""
    """Directory of the study's trials and results; empty: tune/STUDY."""
    space: str = ""
    """A JSON or YAML file changing the search space: for each name a range {type: float|int, low, high,
    log}, a list of choices, or a fixed value (see distrl.tune.space)."""
    no_default_space: bool = False
    """Search only the parameters of --space, not the algorithm's default space."""
    preset: str = "auto"
    """Values every trial starts from (a preset name or file); the sampled parameters override them."""
    pruner: Literal["median", "halving", "none"] = "median"
    """Stop trials early: median (below the median of earlier trials at the same step, after a third
    of the budget), halving (successive halving), none."""
    evaluations: int = 5
    """Evaluations per trial, evenly spaced over the budget: the pruner's checkpoints; the last is the
    trial's value."""
    eval_episodes: int = 10
    """Episodes per evaluation."""
    startup_trials: int = 10
    """Trials sampled at random before TPE models the results, and before the median pruner prunes."""
    seed: int = 0
    """Seed of every trial's run (so trials differ only in their hyperparameters) and of the sampler."""
    engine: Literal["process", "ray"] = "process"
    """process: a local process per trial; ray: a Ray task per trial, on a local instance or on the cluster
    that --ray-address names."""
    ray_address: str = ""
    """Run the trials as tasks on this Ray cluster (implies --engine ray); the storage must then be
    reachable from its nodes (a database server), and the study directory shared for the run dirs."""
    trial_timeout_s: float = 21_600.0
    """A trial still running after this long is stopped and recorded as failed."""
    dataset: str = ""
    """The offline algorithms (bc, td3bc, iql, cql): the Minari dataset every trial trains on, as for train; the
    budget then counts gradient steps."""
    datasets_dir: str = ""
    """Where the dataset lives, as for train."""
    env_kwargs: tuple[str, ...] = ()
    """key=value arguments for the env's constructor, as for train."""
    wrappers: tuple[str, ...] = ()
    """'package.module:function' wrappers, as for train."""
    policy: str = ""
    """'package.module:function' building the network, as for train."""
    device: Literal["auto", "cpu", "cuda"] = "cpu"
    """Device of each trial's update."""
    threads: int = 1
    """Torch threads per trial."""
    debug: bool = False
    """Show full tracebacks for errors."""
    population: int = 8
    """pbt: members of the population (Ray Tune trials), each a run directory STUDY_DIR/members/member-NNN
    trained for --budget-steps."""
    perturbation_interval: int = 0
    """pbt: environment steps between a member's evaluations, each followed by PBT's exploit and explore, in
    whole iterations (an interval ends with the iteration that reaches it); 0: a tenth of --budget-steps."""
    quantile: float = 0.25
    """pbt: truncation selection: a member in the worst quantile of the population's last evaluations copies
    the checkpoint of one in the best quantile, and its hyperparameters perturbed."""
    resample_probability: float = 0.25
    """pbt: the chance that an exploit draws a hyperparameter afresh from its range instead of perturbing it:
    a range's value times 0.8 or 1.2, kept within the range; a list's neighbouring choice."""
    synchronous: bool = True
    """pbt: every member evaluates at the end of each interval, then the population is ranked and perturbed at
    once, so a study is reproducible (same seed, same lineage, whatever --parallel). --no-synchronous: each
    member is ranked against the others' last evaluations as soon as it reports: none waits for the slowest,
    and the study depends on their timing."""
    max_failures: int = 2
    """pbt: times a member that fails is started again from its last checkpoint before it is given up."""

    def __post_init__(self) -> None:
        for name in ("trials", "budget_steps", "parallel", "evaluations", "eval_episodes", "threads"):
            require(getattr(self, name) > 0, name, getattr(self, name), "> 0")
        require(self.startup_trials >= 0, "startup_trials", self.startup_trials, ">= 0")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        require(self.trial_timeout_s > 0, "trial_timeout_s", self.trial_timeout_s, "> 0")
        require(
            self.budget_steps >= self.evaluations,
            "budget_steps",
            self.budget_steps,
            f">= evaluations ({self.evaluations})",
        )
        if self.scheduler == "pbt":
            self._check_pbt()
        else:
            self._refuse_unless_default(PBT_ONLY, "--scheduler pbt")

    def _check_pbt(self) -> None:
        require(self.population >= 2, "population", self.population, ">= 2 (members copy the best of the others)")
        require(
            0 <= self.perturbation_interval <= self.budget_steps,
            "perturbation_interval",
            self.perturbation_interval,
            f"in [1, budget_steps={self.budget_steps}] (or 0: a tenth of the budget)",
        )
        require(0 < self.quantile <= 0.5, "quantile", self.quantile, "in (0, 0.5]")
        require(0 <= self.resample_probability <= 1, "resample_probability", self.resample_probability, "in [0, 1]")
        require(self.max_failures >= 0, "max_failures", self.max_failures, ">= 0")
        self._refuse_unless_default(OPTUNA_ONLY, "--scheduler optuna")

    def _refuse_unless_default(self, names: tuple[str, ...], meaning: str) -> None:
        """A flag of the other scheduler given a value of its own means nothing here: refused, not ignored."""
        for name in names:
            value, default = getattr(self, name), _DEFAULTS[name]
            if value != default:
                flag = "--" + name.replace("_", "-")
                raise ConfigError(
                    f"{name}={value!r} is not allowed with scheduler={self.scheduler!r}: {flag} means something "
                    f"only with {meaning}"
                )


OPTUNA_ONLY = ("trials", "storage", "pruner", "evaluations", "startup_trials", "engine", "trial_timeout_s")
"""Flags of the Optuna study alone: a PBT study has --population members, evaluates every interval, prunes
nothing, keeps no database and always runs on Ray."""
PBT_ONLY = ("population", "perturbation_interval", "quantile", "resample_probability", "synchronous", "max_failures")
_DEFAULTS = {f.name: f.default for f in dataclasses.fields(TuneArgs)}
