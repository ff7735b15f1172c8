"""Configuration of the offline algorithms, which learn from a fixed dataset: BC, TD3+BC, IQL and CQL; and of
their online fine-tuning (``init_from``) and TD3, which share their networks and updates.

Each names its dataset (``--dataset``: a Minari dataset id or path, read from local storage only) and counts its
run in gradient steps: ``--total-steps`` is the number of gradient steps, not of environment steps (none are
taken, but those of the evaluation episodes). Defaults follow the papers and their reference implementations
(CORL's, d3rlpy's where they agree).
"""

from __future__ import annotations

from dataclasses import dataclass

from distrl.config.base import Activation, require, require_fraction, require_positive


@dataclass(frozen=True)
class OfflineConfig:
    """What every offline algorithm shares: the dataset, the batches, the networks and Adam."""

    dataset: str = ""
    """The Minari dataset: an id (cartpole/expert-v0) under --datasets-dir, MINARI_DATASETS_PATH or Minari's default
    directory, or a dataset directory's path. Nothing is downloaded."""
    datasets_dir: str = ""
    """Where Minari datasets live; empty: MINARI_DATASETS_PATH, else Minari's default (~/.minari/datasets)."""
    episodes_per_chunk: int = 0
    """Read the dataset this many episodes at a time; 0: as many as hold about 64 MiB decoded."""
    dataset_on_disk: bool = False
    """Decode the dataset once into files (numpy memory maps) in the run directory, removed when the run ends,
    and draw the batches from them: memory then holds what the batches touch, not the dataset, which may be
    larger than memory (it takes that much disk). The same batches and numbers as in memory."""
    n_envs: int = 1
    """Environments of the evaluation episodes (the only environment steps an offline run takes)."""
    batch_size: int = 256
    """Transitions per gradient step, over all workers together."""
    learning_rate: float = 3e-4
    """Adam step size."""
    net_arch: tuple[int, ...] = (256, 256)
    """Hidden layers of every network."""
    activation: Activation = "relu"
    """Hidden activation."""
    normalize_obs: bool = False
    """Standardise observations by the dataset's mean and standard deviation (TD3+BC's state normalisation);
    evaluation applies the same statistics."""
    init_from: str = ""
    """Go on online from this offline run (its directory or a checkpoint): its weights, optimizer state and
    observation statistics, then this run steps the env (td3bc, iql, cql; td3 from a td3bc run). --total-steps then
    counts environment steps, each followed by one gradient step on a replay buffer of what the run has seen."""
    keep_dataset: bool = False
    """With init_from: the replay buffer starts with the dataset's transitions (--dataset), as IQL's fine-tuning
    does; without it, with the run's own experience alone."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions, online."""
    exploration_noise: float = 0.1
    """Online, a deterministic policy's (TD3's) Gaussian exploration noise, actions in [-1, 1]; the stochastic
    policies (IQL's, CQL's) sample themselves."""
    save_replay: bool = False
    """Online: store the replay buffer with each checkpoint (safetensors), so that --resume goes on exactly."""

    @property
    def online(self) -> bool:
        """Whether the run steps the env (and its --total-steps counts environment steps)."""
        return bool(self.init_from)

    def __post_init__(self) -> None:
        require_positive(self, "n_envs", "batch_size", "learning_rate", "buffer_size")
        require(self.exploration_noise >= 0, "exploration_noise", self.exploration_noise, ">= 0")
        require(
            not self.keep_dataset or bool(self.init_from),
            "keep_dataset",
            self.keep_dataset,
            "False without init_from",
            "it keeps the dataset in an online run's replay",
        )
        require(self.episodes_per_chunk >= 0, "episodes_per_chunk", self.episodes_per_chunk, ">= 0")
        require(
            len(self.net_arch) > 0 and all(h > 0 for h in self.net_arch),
            "net_arch",
            self.net_arch,
            "one or more positive layer sizes",
        )


@dataclass(frozen=True)
class BCConfig(OfflineConfig):
    """Behaviour cloning: the dataset's actions regressed on its observations (a deterministic tanh policy, mean
    squared error, for Box actions; a categorical policy, cross-entropy, for Discrete ones)."""


@dataclass(frozen=True)
class TD3BCConfig(OfflineConfig):
    """TD3+BC (Fujimoto and Gu 2021, arXiv:2106.06860): TD3 whose actor also regresses on the dataset's actions,
    ``alpha`` weighing the Q term against it."""

    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak coefficient of the target networks."""
    policy_noise: float = 0.2
    """Standard deviation of the target policy's smoothing noise (actions in [-1, 1])."""
    noise_clip: float = 0.5
    """The smoothing noise is clipped to +- this."""
    policy_freq: int = 2
    """Critic steps per actor (and target) step."""
    alpha: float = 2.5
    """Weight of the Q term: lambda = alpha / mean |Q| of the batch."""
    normalize_obs: bool = True

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "policy_freq", "alpha")
        require_fraction(self, "gamma")
        require_fraction(self, "tau", inclusive_zero=False)
        require(self.policy_noise >= 0, "policy_noise", self.policy_noise, ">= 0")
        require(self.noise_clip >= 0, "noise_clip", self.noise_clip, ">= 0")


@dataclass(frozen=True)
class TD3Config(TD3BCConfig):
    """TD3 (Fujimoto, van Hoof and Meger 2018, arXiv:1802.09477), online: clipped double Q, delayed policy updates,
    target policy smoothing, Gaussian exploration. From scratch it plays uniformly random actions for
    ``learning_starts`` steps first; with --init-from a TD3+BC run it goes on from that run's networks."""

    learning_rate: float = 1e-3
    normalize_obs: bool = False
    learning_starts: int = 10_000
    """Environment steps of uniformly random actions before learning starts (none with --init-from)."""

    @property
    def online(self) -> bool:
        return True

    def __post_init__(self) -> None:
        super().__post_init__()
        require(self.learning_starts >= 0, "learning_starts", self.learning_starts, ">= 0")


@dataclass(frozen=True)
class IQLConfig(OfflineConfig):
    """Implicit Q-learning (Kostrikov, Nair and Levine 2021, arXiv:2110.06169): an expectile value function, twin
    critics that bootstrap from it, and an advantage-weighted Gaussian policy."""

    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak coefficient of the target critics."""
    expectile: float = 0.7
    """The value function's expectile of the target critics' Q (0.5: their mean; towards 1: their maximum)."""
    beta: float = 3.0
    """Inverse temperature of the advantage weights exp(beta (Q - V))."""
    max_weight: float = 100.0
    """The advantage weights are clipped to at most this."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "beta", "max_weight")
        require_fraction(self, "gamma")
        require_fraction(self, "tau", inclusive_zero=False)
        require(0.0 < self.expectile < 1.0, "expectile", self.expectile, "in (0, 1)")


@dataclass(frozen=True)
class CQLConfig(OfflineConfig):
    """Conservative Q-learning (Kumar et al. 2020, arXiv:2006.04779), CQL(H): for Box actions SAC (its entropy
    coefficient tuned automatically) whose critics also push down a soft maximum of Q over sampled actions and push
    up Q of the dataset's; for Discrete actions double DQN with the same penalty, exact over the actions."""

    gamma: float = 0.99
    """Discount factor."""
    tau: float = 0.005
    """Polyak coefficient of the target networks."""
    conservative_weight: float = 5.0
    """The penalty's weight (the paper's alpha; its MuJoCo runs used 5); with target_action_gap, the fixed factor
    on the learned one."""
    n_action_samples: int = 10
    """Actions sampled per state, from each of the uniform distribution, the policy at s and the policy at s', for
    the soft maximum (Box actions)."""
    target_action_gap: float | None = None
    """With a value: learn the penalty's weight alpha' by the paper's Lagrangian, so that the penalty approaches
    this gap (the paper's tau); None keeps the weight fixed."""
    actor_learning_rate: float = 1e-4
    """Adam step size of the policy (Box actions); learning_rate is the critics', the entropy coefficient's and
    alpha''s."""
    temperature: float = 1.0
    """The soft maximum's temperature."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "n_action_samples", "actor_learning_rate", "temperature")
        require(self.conservative_weight >= 0, "conservative_weight", self.conservative_weight, ">= 0")
        require_fraction(self, "gamma")
        require_fraction(self, "tau", inclusive_zero=False)


ONLINE_ONLY = ("td3",)
"""The algorithms of this family that learn online only (from scratch, or --init-from an offline run)."""
OFFLINE_CONFIGS: dict[str, type[OfflineConfig]] = {
    "bc": BCConfig,
    "td3bc": TD3BCConfig,
    "iql": IQLConfig,
    "cql": CQLConfig,
    "td3": TD3Config,
}
"""The offline algorithms, by name."""
