"""Search spaces of ``distrl tune``: what each algorithm's study samples, and how a file changes it.

The default spaces are rl-baselines3-zoo's (``rl_zoo3/hyperparams_opt.py`` at commit 0a9df503,
``sample_ppo_params`` and ``sample_sac_params``) in distrl's field names. The zoo has no REINFORCE
sampler; distrl's REINFORCE space is its own, on the same scales, and so are the offline algorithms' (BC,
TD3+BC, IQL, CQL: each paper's setting inside the range). Where distrl has no such field (the zoo's SAC
``log_std_init`` belongs to gSDE), the parameter is left out.

A space maps parameter names to specs:

* ``{"type": "float", "low": 1e-5, "high": 2e-3, "log": true}`` or ``"type": "int"`` (with ``log``
  or ``step``);
* ``{"type": "categorical", "choices": [...]}``, or the list of choices itself;
* ``{"same_as": "train_freq"}``: the value sampled for another parameter (SAC's gradient_steps);
* anything else is a fixed value, not searched.

A parameter is a field of the algorithm's config, or ``one_minus_<field>`` for a field sampled as
``1 - value`` on a log scale (the zoo's gamma and gae_lambda). ``net_arch`` choices are the zoo's
names (tiny, small, medium, big) or lists of layer sizes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from distrl.config import ALGO_CONFIGS, ConfigError, check_types
from distrl.training.preset_files import read_mapping

NET_ARCHS: dict[str, tuple[int, ...]] = {"tiny": (64,), "small": (64, 64), "medium": (256, 256), "big": (400, 300)}
ONE_MINUS = "one_minus_"


def _log(low: float, high: float) -> dict[str, Any]:
    return {"type": "float", "low": low, "high": high, "log": True}


DEFAULT_SPACES: dict[str, dict[str, Any]] = {
    "ppo": {
        "batch_size": [32, 64, 128, 256, 512],
        "n_steps": [32, 64, 128, 256, 512, 1024, 2048],
        "one_minus_gamma": _log(0.0001, 0.03),
        "one_minus_gae_lambda": _log(0.0001, 0.1),
        "learning_rate": _log(1e-5, 0.002),
        "ent_coef": _log(1e-8, 0.1),
        "clip_range": [0.1, 0.2, 0.3, 0.4],
        "n_epochs": [1, 5, 10, 20],
        "max_grad_norm": {"type": "float", "low": 0.3, "high": 2.0},
        "net_arch": ["tiny", "small", "medium"],
        "activation": ["tanh", "relu"],
    },
    "sac": {
        "gamma": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999, 0.9999],
        "learning_rate": _log(1e-5, 1.0),
        "batch_size": [16, 32, 64, 128, 256, 512, 1024, 2048],
        "buffer_size": [10_000, 100_000, 1_000_000],
        "learning_starts": [0, 1000, 10_000, 20_000],
        "train_freq": [1, 4, 8, 16, 32, 64, 128, 256, 512],
        "gradient_steps": {"same_as": "train_freq"},
        "tau": [0.001, 0.005, 0.01, 0.02, 0.05, 0.08],
        "net_arch": ["small", "medium", "big"],
    },
    # rl-baselines3-zoo's DQN sampler's ranges
    "dqn": {
        "gamma": [0.9, 0.99, 0.995, 0.999, 0.9999],
        "learning_rate": _log(1e-5, 0.1),
        "batch_size": [16, 32, 64, 100, 128, 256, 512],
        "buffer_size": [10_000, 50_000, 100_000, 1_000_000],
        "exploration_final_eps": {"type": "float", "low": 0.0, "high": 0.2},
        "exploration_fraction": {"type": "float", "low": 0.0, "high": 0.5},
        "target_update_interval": [1, 1000, 5000, 10_000, 15_000, 20_000],
        "learning_starts": [0, 1000, 5000, 10_000, 20_000],
        "train_freq": [1, 4, 8, 16, 128, 256, 1000],
        "gradient_steps": {"same_as": "train_freq"},
        "net_arch": ["tiny", "small", "medium"],
    },
    "reinforce": {
        "learning_rate": _log(1e-4, 0.01),
        "gamma": [0.9, 0.95, 0.98, 0.99, 0.995, 0.999],
        "episodes_per_iter": [4, 8, 16, 32],
        "baseline": [True, False],
        "ent_coef": _log(1e-8, 0.1),
        "net_arch": ["tiny", "small", "medium"],
        "activation": ["tanh", "relu"],
    },
    # The offline algorithms' spaces are distrl's own: each paper's setting inside a range on its own scale, the
    # learning rate, the batch and the networks as for the online algorithms. A trial reads the study's --dataset.
    "bc": {
        "learning_rate": _log(1e-5, 3e-3),
        "batch_size": [64, 128, 256, 512],
        "net_arch": ["small", "medium", "big"],
    },
    "td3bc": {
        "alpha": _log(0.5, 10.0),
        "learning_rate": _log(1e-5, 1e-3),
        "batch_size": [128, 256, 512],
        "one_minus_gamma": _log(0.001, 0.05),
        "tau": [0.001, 0.005, 0.01, 0.02],
        "policy_noise": [0.1, 0.2, 0.3],
        "net_arch": ["medium", "big"],
    },
    "iql": {
        "expectile": {"type": "float", "low": 0.5, "high": 0.95},
        "beta": _log(0.3, 10.0),
        "learning_rate": _log(1e-5, 1e-3),
        "batch_size": [128, 256, 512],
        "one_minus_gamma": _log(0.001, 0.05),
        "tau": [0.001, 0.005, 0.01, 0.02],
        "net_arch": ["medium", "big"],
    },
    "cql": {
        "conservative_weight": _log(0.5, 20.0),
        "learning_rate": _log(1e-5, 1e-3),
        "actor_learning_rate": _log(1e-5, 1e-3),
        "batch_size": [128, 256, 512],
        "one_minus_gamma": _log(0.001, 0.05),
        "tau": [0.001, 0.005, 0.01, 0.02],
        "net_arch": ["medium", "big"],
    },
}


@dataclasses.dataclass(frozen=True)
class Space:
    """The parameters a study samples (Optuna distributions by parameter name), the ones tied to another,
    and the fixed values every trial gets."""

    distributions: dict[str, Any]
    tied: dict[str, str]
    fixed: dict[str, Any]

    def values(self, params: dict[str, Any]) -> dict[str, Any]:
        """The config fields of a trial's sampled parameters (and the fixed values)."""
        values = dict(self.fixed)
        for name, value in params.items():
            if name.startswith(ONE_MINUS):
                values[name[len(ONE_MINUS) :]] = 1.0 - value
            elif name == "net_arch":
                values[name] = decode_arch(value)
            else:
                values[name] = value
        for name, source in self.tied.items():
            values[name] = values[source]
        return values


def build_space(algo: str, path: str = "", defaults: bool = True) -> Space:
    """``algo``'s default space (unless ``defaults`` is False), changed by the file at ``path``."""
    import optuna

    if algo not in DEFAULT_SPACES:
        raise ConfigError(f"algo={algo!r} cannot be tuned: must be one of {', '.join(DEFAULT_SPACES)}")
    entries = dict(DEFAULT_SPACES[algo]) if defaults else {}
    if path:
        for name, spec in read_mapping(Path(path), "space").items():
            field = name.removeprefix(ONE_MINUS)  # gamma in the file replaces the default one_minus_gamma
            entries.pop(field, None)
            entries.pop(ONE_MINUS + field, None)
            entries[name] = spec
    if not entries:
        raise ConfigError(f"space={path!r} has no parameters: give at least one, or keep the default space")
    fields = {f.name for f in dataclasses.fields(ALGO_CONFIGS[algo])}
    distributions: dict[str, Any] = {}
    tied: dict[str, str] = {}
    fixed: dict[str, Any] = {}
    where = f"space={path!r}: " if path else ""
    for name, spec in entries.items():
        field = name.removeprefix(ONE_MINUS)
        if field not in fields:
            allowed = ", ".join(sorted(fields))
            raise ConfigError(f"{where}{name!r} is not a {algo} field: must be one of {allowed} (or one_minus_<field>)")
        if isinstance(spec, dict) and "same_as" in spec:
            if spec["same_as"] not in entries:
                raise ConfigError(f"{where}{name}: same_as={spec['same_as']!r} is not a parameter of the space")
            tied[name] = spec["same_as"]
        elif isinstance(spec, list) or isinstance(spec, dict) and "type" in spec:
            distributions[name] = _distribution(optuna, name, spec, where)
        else:
            check_types(ALGO_CONFIGS[algo], {name: spec})
            fixed[name] = tuple(spec) if isinstance(spec, list) else spec
    return Space(distributions, tied, fixed)


def with_dataset(space: Space, algo: str, env_id: str, dataset: str, datasets_dir: str) -> Space:
    """``space`` with an offline algorithm's dataset fixed for every trial (``--dataset``, opened and checked
    against the env's spaces now, before the study starts); a one-line ConfigError for a dataset given to an
    algorithm that takes none, or none given to one that does."""
    from distrl.config import OFFLINE_CONFIGS

    if algo not in OFFLINE_CONFIGS:
        if dataset or datasets_dir:
            raise ConfigError(
                f"dataset={dataset!r} is not allowed for {algo}: only bc, td3bc, iql and cql train on one"
            )
        return space
    if not dataset:
        raise ConfigError(f"dataset='' is not allowed: every {algo} trial trains on a dataset: give --dataset ID")
    from distrl.data.minari_store import check_spaces, open_dataset
    from distrl.envs.vector import make_env

    folder = str(Path(datasets_dir).absolute()) if datasets_dir else ""  # the trials run in other directories
    opened = open_dataset(dataset, folder or None)
    env = make_env(env_id, 1)
    try:
        check_spaces(opened, env.single_observation_space, env.single_action_space, env_id)
    finally:
        env.close()
    return dataclasses.replace(space, fixed={**space.fixed, "dataset": dataset, "datasets_dir": folder})


def _distribution(optuna: Any, name: str, spec: Any, where: str) -> Any:
    dist = optuna.distributions
    if isinstance(spec, list):
        spec = {"type": "categorical", "choices": spec}
    kind = spec.get("type")
    try:
        if kind == "categorical":
            choices = spec["choices"]
            if not isinstance(choices, list) or not choices:
                raise ValueError("choices must be a non-empty list")
            if name == "net_arch":
                choices = [encode_arch(c) for c in choices]
            return dist.CategoricalDistribution(choices)
        if kind in ("float", "int"):
            low, high = spec["low"], spec["high"]
            if name.startswith(ONE_MINUS) and not 0 < low <= high < 1:
                raise ValueError("one_minus_ ranges must lie in (0, 1)")
            cls = dist.FloatDistribution if kind == "float" else dist.IntDistribution
            extra = {"step": spec["step"]} if "step" in spec else {}
            return cls(low, high, log=bool(spec.get("log", False)), **extra)
    except (KeyError, ValueError, TypeError) as exc:
        raise ConfigError(f"{where}{name}={spec!r} is not a valid range: {exc}") from None
    raise ConfigError(f"{where}{name}={spec!r}: type must be float, int or categorical")


def encode_arch(choice: Any) -> str:
    """A net_arch choice as Optuna stores it: a zoo name, or layer sizes as '64x64'."""
    if isinstance(choice, str) and (choice in NET_ARCHS or decode_arch(choice)):
        return choice
    if isinstance(choice, list) and choice and all(isinstance(h, int) and h > 0 for h in choice):
        return "x".join(str(h) for h in choice)
    raise ValueError(f"net_arch choice {choice!r} must be one of {', '.join(NET_ARCHS)} or a list of layer sizes")


def decode_arch(choice: str) -> tuple[int, ...]:
    if choice in NET_ARCHS:
        return NET_ARCHS[choice]
    parts = choice.split("x")
    return tuple(int(p) for p in parts) if all(p.isdigit() and int(p) > 0 for p in parts) else ()
