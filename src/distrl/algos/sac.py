"""Soft Actor-Critic (Haarnoja et al. 2018, arXiv:1801.01290; automatic entropy tuning, arXiv:1812.05905).

One gradient step, in stable-baselines3's order:

1. entropy coefficient alpha = exp(log_alpha), fixed for this step;
2. critic target ``y = r + gamma (1 - terminated) (min_i Q'_i(s', a') - alpha log pi(a'|s'))``
   with ``a' ~ pi(.|s')`` and the target critics Q' (:func:`critic_target`);
3. :func:`critic_loss` and :func:`temperature_loss`: one sync, one Adam step (log_alpha lives in
   the critic's parameter buffer);
4. :func:`actor_loss` against the updated critics: one sync, one Adam step;
5. Polyak update of the target critics.

Losses are summed over samples; ``Sync.gradients`` sums gradients and sample counts over
workers and each gradient is divided by the global count, as in PPO.

The losses below are the definitions. By default :mod:`distrl.algos.fused_sac` computes the same values and their
gradients with respect to the networks' outputs in closed form; ``SACConfig.fused_loss=False`` takes those
gradients by autograd on the plain losses instead.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import torch

from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.fused_sac import fused_actor_loss, fused_critic_loss, fused_temperature_loss
from distrl.algos.optim import ClippedAdam
from distrl.algos.protocols import Sync
from distrl.config import SACConfig
from distrl.data.replay import Transitions
from distrl.nets.factory import SACNetworks


def critic_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    next_log_prob: torch.Tensor,
    alpha: float,
    gamma: float,
) -> torch.Tensor:
    """``r + gamma (1 - terminated) (min(Q'_1, Q'_2) - alpha log pi(a'|s'))`` per sample.

    Truncated episodes are not ``terminated``: they bootstrap from the stored true final
    observation.
    """
    soft_value = torch.minimum(next_q1, next_q2) - alpha * next_log_prob
    return rewards + gamma * (1.0 - terminated) * soft_value


def critic_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``1/2 sum_i (Q_i(s, a) - y)^2`` over both critics, summed over samples (``target`` y detached)."""
    return 0.5 * ((q1 - target).square() + (q2 - target).square()).sum()


def actor_loss(log_prob: torch.Tensor, q1: torch.Tensor, q2: torch.Tensor, alpha: float) -> torch.Tensor:
    """``alpha log pi(a~|s) - min_i Q_i(s, a~)`` with ``a~`` the reparameterised action, summed over samples."""
    return (alpha * log_prob - torch.min(q1, q2)).sum()


def temperature_loss(log_alpha: torch.Tensor, log_prob: torch.Tensor, target_entropy: float) -> torch.Tensor:
    """``-log_alpha (log pi(a~|s) + target_entropy)`` summed over samples (``log_prob`` detached): alpha
    rises while the policy's entropy is below the target and falls while it is above."""
    return -(log_alpha * (log_prob + target_entropy)).sum()


def polyak(target: torch.Tensor, source: torch.Tensor, tau: float) -> None:
    """``target <- (1 - tau) target + tau source``, in place."""
    target.lerp_(source, tau)


class SACAlgo:
    """SAC over a squashed Gaussian actor and twin critics with target copies.

    The losses are written on the networks' outputs (Q-values, log-probs); their closed forms in
    ``fused_sac`` (or autograd, with ``fused_loss=False``) give their gradients there, and the
    networks carry them to their parameters. The actor's loss reaches it through the critic: the
    critic turns d(loss)/dQ_i into d(loss)/d(action) (its ``action_grad``), and the actor turns
    that and d(loss)/d(log-prob) into its own gradient.
    """

    def __init__(self, cfg: SACConfig, networks: SACNetworks, device: torch.device, seed: int):
        """``networks`` come from ``nets.make_sac_networks`` (closed-form MLPs or modules, same interface)."""
        self.cfg = cfg
        self.device = device
        self.actor, self.critic, self.critic_target = networks
        self.action_dim = action_dim = self.actor.action_dim
        self.learn_alpha, alpha0 = cfg.entropy_setting()
        # views, looked up once: they follow every in-place write (Adam's, a broadcast, a checkpoint's load)
        self._log_alpha, self._log_alpha_grad = (
            self.critic.params.view("log_alpha"),
            self.critic.params.grad_view("log_alpha"),
        )
        self._log_alpha.fill_(math.log(alpha0))
        self.critic_target.params.data.copy_(self.critic.params.data)
        self.target_entropy = cfg.target_entropy if cfg.target_entropy is not None else -float(action_dim)
        # Adam's default eps, as stable-baselines3 uses for SAC; no gradient clipping.
        self.actor_optimizer = ClippedAdam(self.actor.params, cfg.learning_rate, eps=1e-8)
        self.critic_optimizer = ClippedAdam(self.critic.params, cfg.learning_rate, eps=1e-8)
        self.gradient_steps = 0
        self.generator = torch.Generator(device=device)
        self.reseed(seed, 0, 0)

    def reseed(self, seed: int, rank: int, segment: int) -> None:
        """Restart the reparameterisation noise from ``(seed, rank, segment)``."""
        self.generator.manual_seed(int(np.random.SeedSequence([seed, rank, segment, 0x5AC]).generate_state(1)[0]))

    @property
    def alpha(self) -> float:
        return float(self._log_alpha.exp())

    def update(
        self, batch: Transitions, sync: Sync, eps_next: torch.Tensor | None = None, eps_pi: torch.Tensor | None = None
    ) -> dict[str, float]:
        """One gradient step; ``eps_*`` fix the reparameterisation noise [B, A] (drawn if None)."""
        cfg = self.cfg
        n, shape = batch.size, (batch.size, self.action_dim)
        eps_next = (
            eps_next if eps_next is not None else torch.randn(shape, generator=self.generator, device=self.device)
        )
        eps_pi = eps_pi if eps_pi is not None else torch.randn(shape, generator=self.generator, device=self.device)
        alpha = self.alpha

        with torch.no_grad():
            nxt = self.actor.sample(batch.next_obs, eps_next)
            target_q = self.critic_target.forward(batch.next_obs, nxt.action)
            y = critic_target(batch.rewards, batch.terminated, target_q.q1, target_q.q2, nxt.log_prob, alpha, cfg.gamma)
        pi = self.actor.sample(batch.obs, eps_pi)

        # critic and entropy coefficient
        fwd = self.critic.forward(batch.obs, batch.actions)
        loss_q, grads_q = self.loss_and_output_grads(critic_loss, fused_critic_loss, (fwd.q1, fwd.q2), y)
        self.critic.backward(fwd, *grads_q)
        loss_alpha, (grad_log_alpha,) = self.loss_and_output_grads(
            temperature_loss, fused_temperature_loss, (self._log_alpha[0],), pi.log_prob.detach(), self.target_entropy
        )
        if self.learn_alpha:
            self._log_alpha_grad.copy_(grad_log_alpha)
        else:
            self._log_alpha_grad.zero_()
        count = torch.full((), float(n), dtype=loss_q.dtype, device=self.device)
        stats = torch.stack([count, loss_q, loss_alpha, fwd.q1.sum()]).detach().double()
        sync.gradients(self.critic.params.grad, stats)
        critic_sums = stats.tolist()
        self.critic_optimizer.step(samples=critic_sums[0])

        # actor, against the updated critics: the critic carries d(loss)/dQ_i back to the action
        q_pi = self.critic.forward(batch.obs, pi.action)
        loss_pi, (grad_log_prob, grad_q1, grad_q2) = self.loss_and_output_grads(
            actor_loss, fused_actor_loss, (pi.log_prob, q_pi.q1, q_pi.q2), alpha
        )
        self.actor.backward(pi, self.critic.action_grad(q_pi, grad_q1, grad_q2), grad_log_prob)
        actor_stats = torch.stack([count, loss_pi, pi.log_prob.sum()]).detach().double()
        sync.gradients(self.actor.params.grad, actor_stats)
        actor_sums = actor_stats.tolist()
        self.actor_optimizer.step(samples=actor_sums[0])
        self.actor.refresh_acting_copy()

        self.gradient_steps += 1
        if self.gradient_steps % cfg.target_update_interval == 0:
            polyak(self.critic_target.params.data, self.critic.params.data, cfg.tau)
        samples = critic_sums[0]
        return {
            "losses/critic_loss": critic_sums[1] / samples,
            "losses/ent_coef_loss": critic_sums[2] / samples,
            "losses/actor_loss": actor_sums[1] / samples,
            "losses/entropy": -actor_sums[2] / samples,
            "losses/q_mean": critic_sums[3] / samples,
            "losses/ent_coef": alpha,
        }

    def loss_and_output_grads(
        self,
        plain: Callable[..., torch.Tensor],
        fused: Callable[..., tuple[torch.Tensor, tuple[torch.Tensor, ...]]],
        outputs: Sequence[torch.Tensor],
        *constants: object,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor | None, ...]]:
        """The loss ``plain(*outputs, *constants)``, detached, and its gradient with respect to the networks'
        ``outputs``: in closed form by its ``fused`` counterpart (the default), or by autograd on the plain loss
        with ``fused_loss=False``."""
        if self.cfg.fused_loss:
            return fused(*(output.detach() for output in outputs), *constants)
        inputs = leaves(*outputs)
        loss = plain(*inputs, *constants)
        return loss.detach(), output_grads(loss, inputs)

    # ---- state ----

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {}
        for name, params, optim in (
            ("actor", self.actor.params, self.actor_optimizer),
            ("critic", self.critic.params, self.critic_optimizer),
        ):
            tensors.update({f"{name}/{k}": v for k, v in params.state_dict().items()})
            tensors.update({f"{name}_optim/{k}": v for k, v in optim.state_dict().items()})
        tensors.update({f"critic_target/{k}": v for k, v in self.critic_target.params.state_dict().items()})
        tensors["gradient_steps"] = torch.tensor([self.gradient_steps], dtype=torch.int64)
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + "/")}

        self.actor.params.load_state_dict(part("actor"))
        self.critic.params.load_state_dict(part("critic"))
        self.critic_target.params.load_state_dict(part("critic_target"))
        self.actor_optimizer.load_state_dict(part("actor_optim"))
        self.critic_optimizer.load_state_dict(part("critic_optim"))
        self.gradient_steps = int(tensors["gradient_steps"][0])
        self.actor.refresh_acting_copy()

    def broadcast_tensors(self) -> list[torch.Tensor]:
        """Everything that must be equal on every worker, as tensors (counters packed in the last one)."""
        counters = torch.tensor(
            [self.actor_optimizer.steps, self.critic_optimizer.steps, self.gradient_steps], dtype=torch.float64
        )
        return [
            self.actor.params.data,
            self.critic.params.data,
            self.critic_target.params.data,
            self.actor_optimizer.exp_avg,
            self.actor_optimizer.exp_avg_sq,
            self.critic_optimizer.exp_avg,
            self.critic_optimizer.exp_avg_sq,
            counters,
        ]

    def after_broadcast(self, counters: torch.Tensor) -> None:
        self.actor_optimizer.steps, self.critic_optimizer.steps, self.gradient_steps = (
            int(v) for v in counters.tolist()
        )
        self.actor.refresh_acting_copy()
