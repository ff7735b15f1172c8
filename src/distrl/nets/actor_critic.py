"""The PPO actor-critic: separate policy and critic MLPs over one parameter buffer."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from gymnasium import spaces

from distrl.envs.spaces import action_spec
from distrl.nets.agent import ActStep, State
from distrl.nets.core import MLP, ParamBuffer, mlp_shapes
from distrl.nets.distributions import (
    CategoricalTerms,
    GaussianTerms,
    categorical_grad,
    categorical_terms,
    gaussian_grad,
    gaussian_terms,
    inverse_cdf_sample,
    sample_actions,
)


@dataclass
class TrainForward:
    """A training forward pass: head outputs and the trunk caches for the backward pass."""

    head: torch.Tensor
    """Logits [B, K] or Gaussian means [B, A]."""
    values: torch.Tensor
    """Critic values [B]."""
    policy_inputs: list[torch.Tensor]
    critic_inputs: list[torch.Tensor]


class ActorCritic:
    """Separate policy and critic MLPs; a categorical or state-independent-std Gaussian policy."""

    recurrent = False
    records_while_acting = False
    """Acting runs the policy alone, as numpy; a rollout's values and log-probs come afterwards in one batched
    pass, which is cheaper for these small networks than one per step."""

    def __init__(
        self,
        obs_dim: int,
        action_space: spaces.Space,
        net_arch: tuple[int, ...] = (64, 64),
        activation: str = "tanh",
        log_std_init: float = 0.0,
        ortho_init: bool = True,
        device: torch.device | str = "cpu",
        seed: int = 0,
    ):
        self.spec = action_spec(action_space)
        if self.spec.kind == "multi_categorical":
            raise ValueError("ActorCritic takes Discrete or Box actions; the module path takes MultiDiscrete")
        self.discrete = self.spec.discrete
        self.action_dim = self.spec.action_dim
        self.obs_dim = obs_dim
        self.device = torch.device(device)
        policy_sizes = (obs_dim, *net_arch, self.action_dim)
        critic_sizes = (obs_dim, *net_arch, 1)
        shapes = {**mlp_shapes("policy", policy_sizes), **mlp_shapes("critic", critic_sizes)}
        if not self.discrete:
            shapes["policy.log_std"] = (self.action_dim,)
        self.params = ParamBuffer(shapes, self.device)
        self.policy = MLP(self.params, "policy", policy_sizes, activation)
        self.critic = MLP(self.params, "critic", critic_sizes, activation)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            if ortho_init:
                self.policy.init_orthogonal(math.sqrt(2), 0.01, generator)
                self.critic.init_orthogonal(math.sqrt(2), 1.0, generator)
            else:
                self.policy.init_uniform(generator)
                self.critic.init_uniform(generator)
            if not self.discrete:
                self.params.view("policy.log_std").fill_(log_std_init)
        # views of the buffer (they follow its in-place updates), not looked up at every gradient step
        self._log_std = None if self.discrete else self.params.view("policy.log_std")
        self._log_std_grad = None if self.discrete else self.params.grad_view("policy.log_std")
        # Acting reads the weights through numpy views of a CPU buffer: the parameter buffer
        # itself on the CPU, a copy refreshed after each update otherwise.
        self._acting: ParamBuffer = self.params
        if self.device.type != "cpu":
            self._acting = ParamBuffer(self.params.shapes, "cpu")
            self.refresh_acting_copy()
        self._acting_policy = MLP(self._acting, "policy", policy_sizes, activation).numpy_forward()
        self._acting_log_std = None if self.discrete else self._acting.view("policy.log_std").numpy()

    def refresh_acting_copy(self) -> None:
        """Copy updated weights to the CPU acting copy (no-op when training on the CPU)."""
        if self._acting is not self.params:
            self._acting.data.copy_(self.params.data)

    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        """Actions for a batch of (normalised) observations.

        ``noise`` is the randomness of sampling, drawn by the caller so that it depends on
        the environment and not on how environments are split over workers: uniforms [B]
        for a categorical policy (inverse-CDF sampling), standard normals [B, A] for a
        Gaussian policy. ``None`` acts deterministically (argmax or mean). Gaussian
        actions are returned unclipped; :meth:`env_action` clips them to the bounds.
        """
        out = self._acting_policy(obs if obs.ndim == 2 else obs.reshape(len(obs), -1))
        if self.discrete:  # called every step: the choice is drawn here, without sample_actions' dispatch
            return inverse_cdf_sample(out, noise)
        return sample_actions("gaussian", out, np.exp(self._acting_log_std), noise)

    def act_step(
        self, obs: np.ndarray, noise: np.ndarray | None, state: State | None = None, starts: np.ndarray | None = None
    ) -> ActStep:
        return ActStep(self.act(obs, noise), None, None, None)

    def env_action(self, action: np.ndarray) -> np.ndarray:
        """The action to send to the env: Gaussian samples clipped to the action bounds."""
        return action if self.discrete else self.spec.env_action(action)

    def noise_shape(self) -> tuple[int, ...]:
        """Shape of the per-step sampling noise of one environment (see :meth:`act`)."""
        return self.spec.noise_shape

    def _flat(self, obs: torch.Tensor) -> torch.Tensor:
        """[B, obs_dim] float32 (a no-op for the vectors rollouts store; called every gradient step)."""
        if obs.dim() != 2:
            obs = obs.reshape(obs.shape[0], self.obs_dim)
        return obs if obs.dtype == torch.float32 else obs.float()

    @torch.no_grad()
    def values(self, obs: torch.Tensor) -> torch.Tensor:
        return self.critic(self._flat(obs)).squeeze(-1)

    @torch.no_grad()
    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        return self._terms(self.policy(self._flat(obs)), actions).log_prob

    def dist_terms(self, fwd: TrainForward, actions: torch.Tensor) -> CategoricalTerms | GaussianTerms:
        """Log-probabilities and entropies of ``actions`` under a forward pass's head outputs."""
        return self._terms(fwd.head, actions)

    def _terms(self, head: torch.Tensor, actions: torch.Tensor) -> CategoricalTerms | GaussianTerms:
        if self.discrete:
            return categorical_terms(head, actions)
        return gaussian_terms(head, self._log_std, actions)

    def forward_train(self, obs: torch.Tensor) -> TrainForward:
        """Both trunks, keeping what :meth:`backward` needs."""
        obs = self._flat(obs)
        head, policy_inputs = self.policy.forward_cached(obs)
        values, critic_inputs = self.critic.forward_cached(obs)
        return TrainForward(head, values.squeeze(-1), policy_inputs, critic_inputs)

    def backward(
        self,
        fwd: TrainForward,
        terms: CategoricalTerms | GaussianTerms,
        actions: torch.Tensor,
        d_log_prob: torch.Tensor,
        d_entropy: torch.Tensor | None,
        d_values: torch.Tensor | None,
    ) -> None:
        """Write the parameter gradients given d(loss)/d(log_prob, entropy, value) per sample (None: the loss
        does not use that output).

        Every parameter receives exactly one contribution, so the buffer is overwritten
        rather than accumulated into (no zeroing pass needed).
        """
        if isinstance(terms, CategoricalTerms):
            d_head = categorical_grad(terms, actions, d_log_prob, d_entropy)
        else:
            d_head, d_log_std = gaussian_grad(terms, d_log_prob, d_entropy)
            self._log_std_grad.copy_(d_log_std)
        self.policy.backward(fwd.policy_inputs, d_head, accumulate=False)
        if d_values is None:  # a loss without the critic (REINFORCE without a baseline)
            for grad in (*self.critic.weight_grads, *self.critic.bias_grads):
                grad.zero_()
        else:
            self.critic.backward(fwd.critic_inputs, d_values.unsqueeze(1), accumulate=False)
