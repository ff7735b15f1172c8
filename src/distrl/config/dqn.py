"""DQN's configuration (value-based RL over a replay buffer)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distrl.config.base import Activation, Encoder, require, require_fraction, require_positive

TDLoss = Literal["huber", "mse"]


@dataclass(frozen=True)
class DQNConfig:
    """Deep Q-Network (Mnih et al. 2015, doi:10.1038/nature14236), with the common extensions as options:
    Double DQN targets (van Hasselt et al. 2016, arXiv:1509.06461), dueling heads (Wang et al. 2016,
    arXiv:1511.06581), n-step returns and prioritised replay (Schaul et al. 2016, arXiv:1511.05952).

    Names and defaults follow stable-baselines3's DQN, so its users can carry settings over; the
    extensions it lacks are off by default.
    """

    n_envs: int = 1
    """Environments stepped together by each worker."""
    learning_rate: float = 1e-4
    """Adam step size."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (over all envs of a worker)."""
    learning_starts: int = 100
    """Steps of uniformly random actions before learning starts (per worker, as for SAC)."""
    batch_size: int = 32
    """Transitions per gradient step."""
    tau: float = 1.0
    """Target network update coefficient: 1.0 copies the Q network (a hard update), less is a Polyak average."""
    gamma: float = 0.99
    """Discount factor."""
    train_freq: int = 4
    """Vector steps between training phases."""
    gradient_steps: int = 1
    """Gradient steps per training phase; -1 takes one per env step of the phase (train_freq * n_envs)."""
    n_steps: int = 1
    """Steps per transition: the target bootstraps after n rewards (n-step returns, Sutton & Barto ch. 7)."""
    target_update_interval: int = 10_000
    """Env steps (over all envs and workers) between target network updates."""
    exploration_fraction: float = 0.1
    """Fraction of the run over which epsilon falls from its initial to its final value."""
    exploration_initial_eps: float = 1.0
    """Epsilon (the probability of a uniformly random action) at the start."""
    exploration_final_eps: float = 0.05
    """Epsilon after exploration_fraction of the run."""
    max_grad_norm: float = 10.0
    """Clip the gradient's global norm to this (after the sum over workers)."""
    double_q: bool = False
    """Double DQN: the Q network picks the next action, the target network values it."""
    dueling: bool = False
    """Dueling heads: a value stream and an advantage stream, Q = V + A - mean(A)."""
    loss: TDLoss = "huber"
    """TD loss: huber (smooth L1 with delta 1, as stable-baselines3 and the Nature paper's clipped error) or mse."""
    prioritized_replay: bool = False
    """Sample transitions in proportion to their TD error (proportional variant, a sum tree)."""
    prioritized_replay_alpha: float = 0.6
    """How much priorities count (0 is uniform)."""
    prioritized_replay_beta0: float = 0.4
    """Importance-sampling exponent at the start, annealed linearly to 1 over the run."""
    prioritized_replay_eps: float = 1e-6
    """Added to every |TD error| so that no transition's priority is 0."""
    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layers of the Q network (of each stream with dueling heads; after the encoder's features for
    images and Dict observations, where () gives linear heads)."""
    activation: Activation = "relu"
    """Hidden activation."""
    encoder: Encoder = "auto"
    """Observation encoder, as for PPO: the closed-form MLPs for flat vectors, a CNN for images, one encoder
    per key for Dict observations (auto, mlp, nature, small or impala)."""
    save_replay: bool = False
    """Store the replay buffer (and its priorities) with each checkpoint so --resume restores it."""
    optimize_memory_usage: bool = False
    """Keep each observation once in the replay buffer (one-step transitions only): halves its memory for images."""

    def __post_init__(self) -> None:
        require_positive(
            self, "n_envs", "learning_rate", "buffer_size", "batch_size", "train_freq", "n_steps", "max_grad_norm"
        )
        require_positive(self, "target_update_interval")
        require(
            self.gradient_steps >= 1 or self.gradient_steps == -1,
            "gradient_steps",
            self.gradient_steps,
            ">= 1, or -1 (one per env step collected)",
        )
        require(self.learning_starts >= 0, "learning_starts", self.learning_starts, ">= 0")
        require_fraction(self, "tau", inclusive_zero=False)
        require_fraction(self, "gamma")
        require_fraction(self, "exploration_fraction")
        require_fraction(self, "exploration_initial_eps")
        require_fraction(self, "exploration_final_eps")
        require_fraction(self, "prioritized_replay_beta0")
        require(self.prioritized_replay_alpha >= 0, "prioritized_replay_alpha", self.prioritized_replay_alpha, ">= 0")
        require_positive(self, "prioritized_replay_eps")
        require(
            self.buffer_size >= self.batch_size,
            "buffer_size",
            self.buffer_size,
            f">= batch_size ({self.batch_size})",
            "a buffer smaller than a batch cannot be sampled",
        )
        require(
            not self.optimize_memory_usage or self.n_steps == 1,
            "optimize_memory_usage",
            self.optimize_memory_usage,
            f"False with n_steps={self.n_steps}",
            "the compact buffer keeps one-step successors only",
        )
        require(
            not self.optimize_memory_usage or self.buffer_size > 2 * self.n_envs,
            "buffer_size",
            self.buffer_size,
            f"> 2 * n_envs ({2 * self.n_envs}) with optimize_memory_usage",
            "each env holds up to two rows at once",
        )
        require(all(h > 0 for h in self.net_arch), "net_arch", self.net_arch, "positive layer sizes (none: linear)")

    def gradient_steps_per_phase(self) -> int:
        """Gradient steps after each ``train_freq`` vector steps (one per env step for -1)."""
        return self.gradient_steps if self.gradient_steps > 0 else self.train_freq * self.n_envs

    def epsilon(self, progress: float) -> float:
        """Epsilon after ``progress`` (in [0, 1]) of the run: linear from the initial to the final value over
        ``exploration_fraction``, then constant (stable-baselines3's schedule)."""
        if self.exploration_fraction <= 0 or progress >= self.exploration_fraction:
            return self.exploration_final_eps
        start, end = self.exploration_initial_eps, self.exploration_final_eps
        return start + (end - start) * progress / self.exploration_fraction

    def beta(self, progress: float) -> float:
        """The prioritised replay's importance exponent after ``progress`` of the run."""
        start = self.prioritized_replay_beta0
        return start + (1.0 - start) * min(max(progress, 0.0), 1.0)
