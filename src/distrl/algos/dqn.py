"""Deep Q-Network (Mnih et al. 2015, doi:10.1038/nature14236) with Double DQN targets (van Hasselt et al. 2016,
arXiv:1509.06461), n-step returns and prioritised replay's importance weights (Schaul et al. 2016,
arXiv:1511.05952) as options.

One gradient step, in stable-baselines3's order:

1. the target ``y = R + discount (1 - terminated) Q'(s', a*)`` (:func:`td_target`), with the target network Q'
   and ``a* = argmax_a Q'(s', a)``, or ``argmax_a Q(s', a)`` for Double DQN. ``R`` is the transition's
   (n-step) discounted reward and ``discount`` gamma to the power of its steps; truncated episodes are not
   ``terminated`` and bootstrap from their true final observation;
2. :func:`td_loss`: the Huber (or squared) TD error of the action taken, weighted by the importance weights;
3. one sync, then the sum over every worker's samples divided by their count, clipped, one Adam step.

The target network follows the Q network every ``target_update_interval`` env steps (the trainer counts
them, as stable-baselines3 does): ``Q' <- (1 - tau) Q' + tau Q``, a copy for ``tau = 1``.
"""

from __future__ import annotations

import numpy as np
import torch

from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.optim import ClippedAdam
from distrl.algos.protocols import Sync
from distrl.algos.sac import polyak
from distrl.config import DQNConfig
from distrl.data.replay import Transitions
from distrl.nets.q import QMLP, ModuleQ

QNetwork = QMLP | ModuleQ
"""A Q network (``nets.make_q_network`` builds the closed-form MLPs or a module: one interface)."""


def td_target(
    rewards: torch.Tensor,
    discounts: torch.Tensor | float,
    terminated: torch.Tensor,
    next_q_target: torch.Tensor,
    next_q_online: torch.Tensor | None = None,
) -> torch.Tensor:
    """``R + discount (1 - terminated) Q'(s', a*)`` per sample [B].

    Args:
        rewards: [B] the transitions' discounted rewards.
        discounts: [B] (or one float) the discount of each bootstrap: gamma^k after k steps.
        terminated: [B] 1.0 where the episode terminated (no bootstrap).
        next_q_target: [B, n_actions] the target network's values of the next observations.
        next_q_online: [B, n_actions] the Q network's values there, for Double DQN (it picks ``a*``);
            None picks ``a*`` by the target network's own values (DQN's max).
    """
    if next_q_online is None:
        next_value = next_q_target.max(1).values
    else:
        best = next_q_online.argmax(1, keepdim=True)
        next_value = next_q_target.gather(1, best).squeeze(1)
    return rewards + discounts * (1.0 - terminated) * next_value


def td_loss(
    q: torch.Tensor, actions: torch.Tensor, target: torch.Tensor, weights: torch.Tensor | None, kind: str = "huber"
) -> tuple[torch.Tensor, torch.Tensor]:
    """The TD loss summed over samples, and the TD errors ``Q(s, a) - y`` [B] (detached).

    ``huber``: ``0.5 d^2`` where ``|d| < 1``, else ``|d| - 0.5`` (smooth L1, the Nature paper's clipped
    error); ``mse``: ``d^2``. ``weights`` [B] scale each sample's term (prioritised replay), None is 1.
    """
    taken = q.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    error = taken - target
    per_sample = torch.nn.functional.huber_loss(taken, target, reduction="none") if kind == "huber" else error**2
    if weights is not None:
        per_sample = weights * per_sample
    return per_sample.sum(), error.detach()


class DQNAlgo:
    """DQN's update over a Q network and its target copy (``nets.make_q_network`` builds both).

    The loss is written on the Q network's outputs; autograd gives d(loss)/dQ there and the network carries it
    to its parameters (closed form or autograd, one contract).
    """

    def __init__(self, cfg: DQNConfig, q: QNetwork, q_target: QNetwork, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.q, self.q_target = q, q_target
        self.q_target.params.data.copy_(self.q.params.data)
        # Adam's default eps, as stable-baselines3's DQN uses; its max_grad_norm clips after the sync
        self.optimizer = ClippedAdam(q.params, cfg.learning_rate, eps=1e-8, max_grad_norm=cfg.max_grad_norm)
        self.gradient_steps = 0

    @torch.no_grad()
    def targets(self, batch: Transitions) -> torch.Tensor:
        """The TD targets y [B] of a batch (no gradient flows into them)."""
        next_q = self.q_target.values(batch.next_obs)
        online = self.q.values(batch.next_obs) if self.cfg.double_q else None
        discounts = batch.discounts if batch.discounts is not None else self.cfg.gamma
        return td_target(batch.rewards, discounts, batch.terminated, next_q, online)

    @torch.no_grad()
    def td_errors(self, batch: Transitions) -> np.ndarray:
        """|Q(s, a) - y| [B] under the current weights: an actor's initial priorities (Ape-X)."""
        taken = self.q.values(batch.obs).gather(1, batch.actions.long().unsqueeze(1)).squeeze(1)
        return (taken - self.targets(batch)).abs().cpu().numpy()

    def update(self, batch: Transitions, sync: Sync) -> tuple[dict[str, float], np.ndarray]:
        """One gradient step; returns the metrics and the batch's TD errors [B] before the step (its new
        priorities, for prioritised replay)."""
        y = self.targets(batch)
        fwd = self.q.forward(batch.obs)
        (q,) = leaves(fwd.q)
        loss, errors = td_loss(q, batch.actions, y, batch.weights, self.cfg.loss)
        (d_q,) = output_grads(loss, (q,))
        assert d_q is not None
        self.q.backward(fwd, d_q)
        taken_sum = (y + errors).sum()  # Q(s, a) summed: the error is Q(s, a) - y
        stats = torch.stack([loss.new_tensor(float(batch.size)), loss.detach(), taken_sum]).double()
        sync.gradients(self.q.params.grad, stats)
        count = float(stats[0])
        grad_norm = self.optimizer.step(samples=count)
        self.q.refresh_acting_copy()
        self.gradient_steps += 1
        metrics = {
            "losses/loss": float(stats[1]) / count,
            "losses/q_values": float(stats[2]) / count,
            "losses/grad_norm": grad_norm,
        }
        return metrics, errors.cpu().numpy()

    def update_target(self, times: int = 1) -> None:
        """``times`` target updates at once: ``Q' <- (1 - tau)^times Q' + (1 - (1 - tau)^times) Q``, what
        that many Polyak steps towards an unchanged Q network give."""
        if times > 0:
            polyak(self.q_target.params.data, self.q.params.data, 1.0 - (1.0 - self.cfg.tau) ** times)

    # ---- state ----

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"q/{k}": v for k, v in self.q.params.state_dict().items()}
        tensors.update({f"q_target/{k}": v for k, v in self.q_target.params.state_dict().items()})
        tensors.update({f"q_optim/{k}": v for k, v in self.optimizer.state_dict().items()})
        tensors["gradient_steps"] = torch.tensor([self.gradient_steps], dtype=torch.int64)
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        def part(prefix: str) -> dict[str, torch.Tensor]:
            return {k[len(prefix) + 1 :]: v for k, v in tensors.items() if k.startswith(prefix + "/")}

        self.q.params.load_state_dict(part("q"))
        self.q_target.params.load_state_dict(part("q_target"))
        self.optimizer.load_state_dict(part("q_optim"))
        self.gradient_steps = int(tensors["gradient_steps"][0])
        self.q.refresh_acting_copy()

    def broadcast_tensors(self) -> list[torch.Tensor]:
        """Everything that must be equal on every worker, as tensors (counters packed in the last one)."""
        counters = torch.tensor([self.optimizer.steps, self.gradient_steps], dtype=torch.float64)
        return [
            self.q.params.data,
            self.q_target.params.data,
            self.optimizer.exp_avg,
            self.optimizer.exp_avg_sq,
            counters,
        ]

    def after_broadcast(self, counters: torch.Tensor) -> None:
        self.optimizer.steps, self.gradient_steps = (int(v) for v in counters.tolist())
        self.q.refresh_acting_copy()
