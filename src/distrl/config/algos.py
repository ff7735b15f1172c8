"""Algorithm configuration: one frozen dataclass per algorithm, validated at construction."""

from __future__ import annotations

from dataclasses import dataclass

from distrl.config.base import (
    Activation,
    ConfigError,
    Core,
    Encoder,
    Schedule,
    nearest_divisor,
    require,
    require_fraction,
    require_positive,
)
from distrl.config.dqn import DQNConfig
from distrl.config.grpo import GRPOConfig


@dataclass(frozen=True)
class ActorCriticNet:
    """The actor-critic network of PPO and REINFORCE (``nets.make_agent`` builds it): an encoder, an
    optional recurrent core, then a policy and a critic (REINFORCE's baseline) of ``net_arch`` each."""

    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the policy and of the critic (separate networks; after the encoder's
    features for images and Dict observations, where () gives linear heads)."""
    activation: Activation = "tanh"
    """Hidden activation."""
    encoder: Encoder = "auto"
    """Observation encoder: auto picks the Nature CNN for images of at least 36x36, a small CNN for
    smaller ones, one encoder per key for Dict observations, and the closed-form MLPs for flat vectors;
    nature, small or impala (the IMPALA ResNet) ask for that CNN; mlp flattens images too."""
    core: Core = "none"
    """A recurrent core between the encoder and the heads, for partially observed tasks: lstm or gru,
    or none for a feed-forward policy. The policy then carries a state through each episode and trains
    on whole sequences."""
    core_size: int = 128
    """Hidden units of the recurrent core."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian policies (the std is learned)."""
    ortho_init: bool = True
    """Orthogonal initialisation (gain sqrt(2) hidden, 0.01 policy output, 1 value output)."""

    def __post_init__(self) -> None:
        require(
            all(h > 0 for h in self.net_arch), "net_arch", self.net_arch, "positive layer sizes (none: linear heads)"
        )
        require_positive(self, "core_size")


@dataclass(frozen=True)
class PPOConfig(ActorCriticNet):
    """Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

    Names and defaults follow stable-baselines3, so its users can carry settings over.
    """

    n_envs: int = 1
    """Environments stepped together by each worker."""
    n_steps: int = 2048
    """Steps per environment per rollout; a rollout holds n_envs * n_steps transitions."""
    batch_size: int = 64
    """Minibatch size; must divide n_envs * n_steps."""
    n_epochs: int = 10
    """Passes over each rollout."""
    learning_rate: float = 3e-4
    """Adam step size (start value when lr_schedule is linear)."""
    lr_schedule: Schedule = "constant"
    """'linear' anneals the learning rate to 0 over total_steps."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE(lambda) bias/variance trade-off (Schulman et al. 2015, arXiv:1506.02438)."""
    clip_range: float = 0.2
    """Policy ratio clip (start value when clip_schedule is linear)."""
    clip_schedule: Schedule = "constant"
    """'linear' anneals clip_range to 0 over total_steps."""
    clip_range_vf: float | None = None
    """Clip the value update to this distance from the rollout's values; None disables."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient (the value loss is a mean squared error)."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm (after averaging across workers) to this value."""
    target_kl: float | None = None
    """Stop the epochs of an update once approx-KL exceeds 1.5 * target_kl; None disables."""
    normalize_advantage: bool = True
    """Normalise advantages with the mean and std of the whole rollout (all workers)."""
    recompute_advantage: bool = False
    """Before every epoch after the first, recompute the rollout's values, advantages and value targets
    with the current critic (Andrychowicz et al. 2021, arXiv:2006.05990, sec. 3.5); feed-forward only."""
    normalize_obs: bool = False
    """Normalise observations with running mean/std (saved with the model)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (saved with the model)."""
    clip_obs: float = 10.0
    """Clip normalised observations to [-clip_obs, clip_obs]."""
    normalize_value: bool = False
    """Train the critic in normalised units (MAPPO's value normalisation, Yu et al. 2022, arXiv:2103.01955):
    a running mean and variance of the value targets (decay 0.99999, debiased) normalise the returns the
    value loss compares with, and denormalise the critic's outputs wherever values bootstrap, as in GAE,
    V-trace and truncated episodes; value clipping acts in normalised units. Saved with the model."""
    fused_loss: bool = True
    """Compute the loss and its gradient with respect to the network's outputs in one closed-form pass, as
    algos/fused.py does it, held to the plain loss by tests; False runs the plain loss in algos/ppo.py through
    autograd, about 70 µs slower a minibatch. The same numbers either way, to float rounding. IMPALA's own loss
    always runs through autograd."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "n_envs", "n_steps", "batch_size", "n_epochs", "learning_rate")
        require_positive(self, "clip_range", "max_grad_norm", "clip_obs")
        require_fraction(self, "gamma")
        require_fraction(self, "gae_lambda")
        require(self.ent_coef >= 0, "ent_coef", self.ent_coef, ">= 0")
        require(self.vf_coef >= 0, "vf_coef", self.vf_coef, ">= 0")
        if self.clip_range_vf is not None:
            require(self.clip_range_vf > 0, "clip_range_vf", self.clip_range_vf, "> 0 or None")
        if self.target_kl is not None:
            require(self.target_kl > 0, "target_kl", self.target_kl, "> 0 or None")
        rollout = self.n_envs * self.n_steps
        require(
            rollout % self.batch_size == 0,
            "batch_size",
            self.batch_size,
            f"a divisor of n_envs * n_steps = {rollout}",
            f"e.g. --batch-size {nearest_divisor(rollout, self.batch_size)}",
        )
        require(
            not (self.recompute_advantage and self.core != "none"),
            "recompute_advantage",
            self.recompute_advantage,
            f"False with core={self.core!r} (feed-forward policies only)",
        )
        if self.core != "none":  # a minibatch is a set of whole environment sequences
            require(
                self.batch_size % self.n_steps == 0,
                "batch_size",
                self.batch_size,
                f"a multiple of n_steps = {self.n_steps} with core={self.core!r} (minibatches are whole "
                "environment sequences)",
                f"e.g. --batch-size {self.n_steps * nearest_divisor(self.n_envs, max(1, self.batch_size // self.n_steps))}",
            )

    @property
    def rollout_size(self) -> int:
        """Transitions collected per rollout by one worker."""
        return self.n_envs * self.n_steps


@dataclass(frozen=True)
class SACConfig:
    """Soft Actor-Critic (Haarnoja et al. 2018, arXiv:1801.01290 and arXiv:1812.05905).

    Names and defaults follow stable-baselines3.
    """

    n_envs: int = 1
    """Environments stepped together by each worker."""
    learning_rate: float = 3e-4
    """Adam step size for actor, critics and entropy coefficient."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (over all envs of a worker)."""
    learning_starts: int = 100
    """Steps of uniformly random actions before learning starts."""
    batch_size: int = 256
    """Transitions per gradient step."""
    tau: float = 0.005
    """Polyak coefficient of the target critics."""
    gamma: float = 0.99
    """Discount factor."""
    train_freq: int = 1
    """Vector steps between training phases."""
    gradient_steps: int = 1
    """Gradient steps per training phase."""
    ent_coef: str = "auto"
    """'auto' (learned, starting at 1.0), 'auto_0.1' (learned, starting at 0.1) or a fixed value like '0.2'."""
    target_entropy: float | None = None
    """Entropy target of the automatic tuning; None means -action_dim."""
    target_update_interval: int = 1
    """Gradient steps between target-critic updates."""
    net_arch: tuple[int, ...] = (256, 256)
    """Hidden layers of the actor and of each critic."""
    activation: Activation = "relu"
    """Hidden activation."""
    encoder: Encoder = "auto"
    """Observation encoder, as for PPO: the closed-form MLPs for flat vectors; for images and Dict
    observations the actor gets one and the critic another, which its two Q heads share (auto, nature,
    small or impala)."""
    save_replay: bool = False
    """Store the replay buffer with each checkpoint (safetensors) so --resume restores it."""
    optimize_memory_usage: bool = False
    """Keep each observation once in the replay buffer: a transition's next observation is the one the
    env's next transition starts from. Halves the buffer's memory for images; an episode takes one row
    more than its steps, so the buffer holds slightly fewer transitions than buffer_size."""
    fused_loss: bool = True
    """Compute the critic's, the entropy coefficient's and the actor's losses and their gradients with respect to
    the networks' outputs in closed form, as algos/fused_sac.py does it, held to the plain losses by tests; False
    runs the plain losses in algos/sac.py through autograd, about 10% fewer steps a second on Pendulum-v1. The same
    numbers either way, to float rounding."""
    init_from: str = ""
    """Start from a CQL run (its directory or a checkpoint): its policy, critics, target critics and entropy
    coefficient, with its observation standardisation taken into their first layers; Adam starts afresh, and the
    first learning_starts steps are played by that policy, not at random. The networks' sizes must be the run's."""
    keep_dataset: bool = False
    """With init_from: the replay buffer starts with the transitions of the dataset the CQL run trained on."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "n_envs",
            "learning_rate",
            "buffer_size",
            "batch_size",
            "train_freq",
            "gradient_steps",
            "target_update_interval",
        )
        require(self.learning_starts >= 0, "learning_starts", self.learning_starts, ">= 0")
        require_fraction(self, "tau", inclusive_zero=False)
        require_fraction(self, "gamma")
        require(
            self.buffer_size >= self.batch_size,
            "buffer_size",
            self.buffer_size,
            f">= batch_size ({self.batch_size})",
            "a buffer smaller than a batch cannot be sampled",
        )
        require(
            not self.optimize_memory_usage or self.buffer_size > 2 * self.n_envs,
            "buffer_size",
            self.buffer_size,
            f"> 2 * n_envs ({2 * self.n_envs}) with optimize_memory_usage",
            "each env holds up to two rows at once",
        )
        require(
            len(self.net_arch) > 0 and all(h > 0 for h in self.net_arch),
            "net_arch",
            self.net_arch,
            "one or more positive layer sizes",
        )
        require(
            not self.keep_dataset or bool(self.init_from),
            "keep_dataset",
            self.keep_dataset,
            "False without init_from",
            "it keeps a CQL run's dataset in the replay",
        )
        require(
            not (self.keep_dataset and self.optimize_memory_usage),
            "keep_dataset",
            self.keep_dataset,
            "False with optimize_memory_usage",
            "the compact buffer holds whole vector steps, not a dataset's transitions",
        )
        self.entropy_setting()  # validates ent_coef

    def gradient_steps_per_phase(self) -> int:
        """Gradient steps after each ``train_freq`` vector steps (as DQNConfig's)."""
        return self.gradient_steps

    def entropy_setting(self) -> tuple[bool, float]:
        """(learned?, initial or fixed value) parsed from ``ent_coef``."""
        text = self.ent_coef.strip()
        learned = text.startswith("auto")
        value_text = text[5:] if text.startswith("auto_") else ("1.0" if learned else text)
        try:
            value = float(value_text)
        except ValueError:
            value = -1.0
        require(value > 0, "ent_coef", self.ent_coef, "'auto', 'auto_<initial value>' or a positive number")
        return learned, value


@dataclass(frozen=True)
class REINFORCEConfig(ActorCriticNet):
    """REINFORCE (Williams 1992): the policy gradient of whole episodes' discounted returns."""

    n_envs: int = 1
    """Environments stepped together by each collector."""
    episodes_per_iter: int = 16
    """Whole episodes per update (over all workers)."""
    learning_rate: float = 1e-3
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor of the returns."""
    normalize_returns: bool = True
    """Standardise the returns (or advantages, with a baseline) over the batch."""
    baseline: bool = False
    """Learn a state-value baseline and use G - V(s) as the advantage."""
    vf_coef: float = 0.5
    """Weight of the baseline's squared error."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value."""
    max_episode_steps: int = 10_000
    """Steps after which an unfinished episode is cut (guards against envs that never end)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require_positive(self, "n_envs", "episodes_per_iter", "learning_rate", "max_grad_norm", "max_episode_steps")
        require_fraction(self, "gamma")
        require(self.vf_coef >= 0, "vf_coef", self.vf_coef, ">= 0")
        require(self.ent_coef >= 0, "ent_coef", self.ent_coef, ">= 0")


ALGO_CONFIGS: dict[str, type] = {
    "ppo": PPOConfig,
    "sac": SACConfig,
    "dqn": DQNConfig,
    "reinforce": REINFORCEConfig,
    "grpo": GRPOConfig,
}
"""Each algorithm's config; ``distrl.config`` adds the V-trace algorithms (appo, impala), whose configs extend PPO's."""

# What distrl has that comes closest to an algorithm it does not have, for the refusal to say.
_CLOSEST = {
    "a2c": "ppo with --n-epochs 1 --batch-size n_steps*n_envs (one synchronous actor-critic step per rollout)",
    "trpo": "ppo (a clipped surrogate in place of the trust region)",
    "mappo": "ppo on one agent's view (no multi-agent envs yet)",
    "ddpg": "td3 (a deterministic policy, off-policy, twin critics)",
    "apex": "dqn --strategy actor-learner (many exploring actors feeding one prioritised replay)",
    "ddqn": "dqn --double-q",
    "qrdqn": "dqn (expected values, not quantiles)",
    "c51": "dqn (expected values, not a distribution)",
    "rainbow": "dqn --double-q --dueling --n-steps 3 --prioritized-replay (no distributional head or noisy nets)",
    "rloo": "grpo (group-relative advantages, no critic)",
    "dapo": "grpo (group-relative advantages, clipped ratio)",
    "vpg": "reinforce",
}


def unknown_algo(algo: str) -> ConfigError:
    """The one-line refusal of an algorithm name, saying what distrl has that comes closest."""
    import difflib

    message = f"algo={algo!r} is not known: must be one of {', '.join(ALGO_CONFIGS)}"
    key = algo.lower().replace("-", "").replace("_", "")
    if key in _CLOSEST:
        return ConfigError(f"{message}; the closest distrl has: {_CLOSEST[key]}")
    close = difflib.get_close_matches(algo.lower(), ALGO_CONFIGS, n=1, cutoff=0.6)
    return ConfigError(f"{message}; did you mean {close[0]}?" if close else message)
