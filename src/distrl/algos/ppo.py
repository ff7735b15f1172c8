"""Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

Clipped surrogate objective, GAE(lambda) advantages, optional value clipping, entropy
bonus, and early stopping on Schulman's approx-KL estimator. One ``update`` runs
``n_epochs`` passes over a rollout in minibatches; every minibatch goes through the
strategy's ``Sync`` before the gradient is clipped and Adam steps. With ``normalize_value``
the critic works in normalised units (:mod:`distrl.algos.value_norm`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
import torch

from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.estimators import gae
from distrl.algos.fused import fused_ppo_loss
from distrl.algos.optim import ClippedAdam, FlatOptimizer, linear
from distrl.algos.policy_stats import APPROX_KL, COUNT, AgentPolicies, UpdateReport
from distrl.algos.protocols import Sync
from distrl.algos.value_norm import ValueNormalizer
from distrl.config import PPOConfig
from distrl.data.packed import Minibatch, PackedBatch
from distrl.data.rollout import Rollout, RolloutBatch, Sequences
from distrl.nets import Agent
from distrl.nets.multiagent import AgentSetup
from distrl.nets.recurrent import state_from_numpy


class Targets(NamedTuple):
    """What a rollout's batch trains toward (see :meth:`PPOAlgo.targets`)."""

    log_probs: torch.Tensor
    """[T * N] the behaviour policy's log-probs of the actions taken."""
    values: np.ndarray
    """[T + 1, N] the critic's outputs the advantages were computed from (in normalised units with
    ``normalize_value``: the advantages come from their denormalised values)."""
    advantages: np.ndarray
    """[T, N] the policy gradient's advantages."""
    returns: np.ndarray
    """[T, N] the critic's targets."""


def rollout_starts(rollout: Rollout, obs: torch.Tensor) -> torch.Tensor:
    """[T + 1, N] episode starts of a recurrent rollout, as floats on ``obs``'s device."""
    assert rollout.starts is not None
    return torch.from_numpy(rollout.starts.astype(np.float32)).to(obs.device)


class PPOLoss(NamedTuple):
    """The PPO loss of a minibatch and the per-sample parts it is made of (for the statistics)."""

    loss: torch.Tensor | None
    """Scalar: the per-sample loss summed over valid samples (the algorithm divides by the global count); None
    from the fused path, whose training step needs only the gradients."""
    policy_loss: torch.Tensor
    """[B] clipped surrogate."""
    value_loss: torch.Tensor
    """[B] squared error of the value (clipped as PPO's original when ``clip_range_vf`` is set)."""
    ratio: torch.Tensor
    """[B] probability ratio ``pi / pi_old`` of the taken actions."""
    log_ratio: torch.Tensor
    """[B] its logarithm, ``log_prob - old_log_prob`` (for the approximate KL)."""


def ppo_loss(
    log_prob: torch.Tensor,
    entropy: torch.Tensor,
    values: torch.Tensor,
    old_log_prob: torch.Tensor,
    old_values: torch.Tensor,
    advantages: torch.Tensor,
    returns: torch.Tensor,
    valid: torch.Tensor,
    clip_range: float,
    clip_range_vf: float | None,
    vf_coef: float,
    ent_coef: float,
) -> PPOLoss:
    """PPO's objective on the network's outputs for a minibatch of B samples (all arguments [B]).

    Per sample, with ``r = exp(log_prob - old_log_prob)`` and ``e = clip_range``::

        policy_loss = max(-A r, -A clip(r, 1 - e, 1 + e))
        value_loss  = (v - R)^2, or max((v - R)^2, (v_old + clip(v - v_old, -e_vf, e_vf) - R)^2)
        loss        = policy_loss + vf_coef * value_loss - ent_coef * entropy

    summed over the samples where ``valid`` is 1. The max makes the surrogate pessimistic: a ratio
    that left the clip range in the direction the advantage favours earns nothing more.
    """
    log_ratio = log_prob - old_log_prob
    ratio = log_ratio.exp()
    policy_loss = torch.max(-advantages * ratio, -advantages * ratio.clamp(1.0 - clip_range, 1.0 + clip_range))
    value_loss = (values - returns).square()
    if clip_range_vf is not None:
        clipped_values = old_values + (values - old_values).clamp(-clip_range_vf, clip_range_vf)
        value_loss = torch.max(value_loss, (clipped_values - returns).square())
    loss = policy_loss + vf_coef * value_loss
    if ent_coef:
        loss = loss - ent_coef * entropy
    return PPOLoss(loss @ valid, policy_loss, value_loss, ratio, log_ratio)


_VALUE_NORM = "value_norm"  # the normaliser's entries in the algorithm's state: value_norm/<key>


class PPOAlgo:
    """The PPO learning rule over an agent (closed-form MLPs or a module; see ``nets.make_agent``)."""

    def __init__(self, cfg: PPOConfig, agent: Agent, seed: int):
        self.cfg = cfg
        self.agent = agent
        self.optimizer: FlatOptimizer = ClippedAdam(
            agent.params, cfg.learning_rate, eps=1e-5, max_grad_norm=cfg.max_grad_norm
        )
        self.shuffle_rng = np.random.default_rng()
        self.agents_per_env = 1
        """Rows per environment (a multi-agent env's agents): a minibatch holds ``batch_size`` environment steps
        of every agent, so the minibatches per epoch do not grow with the agents (MAPPO's fixed num_mini_batch)."""
        self.policies: AgentPolicies | None = None
        """A multi-agent run with more than one policy: which policy each agent's rows train, for the
        statistics ``update`` reports per policy."""
        self.value_norm = ValueNormalizer() if cfg.normalize_value else None
        """With ``normalize_value``: the value targets' running statistics, the critic's units."""
        self.reseed(seed, 0, 0)

    def set_agents(self, setup: AgentSetup | None) -> None:
        """A multi-agent env's agents and their policies (None: a single-agent env); see ``agents_per_env``."""
        if setup is None:
            return
        self.agents_per_env = len(setup.names)
        if len(setup.groups) > 1:
            self.policies = AgentPolicies.of_setup(setup)

    def reseed(self, seed: int, rank: int, segment: int) -> None:
        """Restart the minibatch shuffling stream from ``(seed, rank, segment)``."""
        self.shuffle_rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, rank, segment, 0x5EED])))

    def prepare(self, rollout: Rollout) -> RolloutBatch:
        """Values, behaviour log-probs and advantages (:meth:`targets`) for a rollout, flattened to a batch."""
        device = self.agent.device
        T, N = rollout.rewards.shape
        obs = torch.from_numpy(rollout.obs).to(device)
        sequences = None
        if rollout.starts is not None:  # recurrent: the rollout is N sequences, replayed from their initial state
            assert rollout.initial_state is not None
            starts = rollout_starts(rollout, obs)
            sequences = Sequences(starts[:T], state_from_numpy(rollout.initial_state, device))
        flat_obs = obs[:T].reshape(T * N, *obs.shape[2:])
        actions = torch.from_numpy(rollout.actions.reshape(T * N, *rollout.actions.shape[2:])).to(device)
        targets = self.targets(rollout, obs, actions, sequences)
        return RolloutBatch(
            obs=flat_obs,
            actions=actions,
            log_probs=targets.log_probs,
            values=torch.from_numpy(targets.values[:T].reshape(-1).copy()).to(device),
            advantages=torch.from_numpy(targets.advantages.reshape(-1)).to(device),
            returns=torch.from_numpy(targets.returns.reshape(-1)).to(device),
            valid=torch.from_numpy(rollout.valid.reshape(-1).astype(np.float32)).to(device),
            policy_version=rollout.policy_version,
            sequences=sequences,
            rollout=rollout if self.cfg.recompute_advantage else None,
        )

    def targets(
        self, rollout: Rollout, obs: torch.Tensor, actions: torch.Tensor, sequences: Sequences | None
    ) -> Targets:
        """PPO's: GAE on the values recorded while acting, else on this critic's (in one batched pass).

        ``obs`` are the rollout's [T + 1, N, ...] observations and ``actions`` its flat [T * N, ...] actions;
        the behaviour log-probs are the recorded ones, else this policy's.
        """
        T = rollout.rewards.shape[0]
        if rollout.values is not None:
            values = rollout.values
        elif sequences is not None:  # lagged data (pipeline): this critic's values, in one pass over the sequences
            values = (
                self.agent.sequence_values(obs, sequences.initial_state, rollout_starts(rollout, obs)).cpu().numpy()
            )
        else:
            values = self.critic_values(obs)
        advantages, returns = gae(
            rollout.rewards,
            self.denormalized(values),
            rollout.terminated,
            rollout.truncated,
            rollout.valid,
            self.cfg.gamma,
            self.cfg.gae_lambda,
            self.final_values(rollout),
        )
        if rollout.log_probs is not None:
            log_probs = torch.from_numpy(rollout.log_probs.reshape(-1)).to(self.agent.device)
        else:
            log_probs = self.agent.log_prob(obs[:T].reshape(-1, *obs.shape[2:]), actions)
        return Targets(log_probs, values, advantages, returns)

    def critic_values(self, obs: torch.Tensor) -> np.ndarray:
        """The critic's outputs for rollout observations [T + 1, N, ...] as [T + 1, N] (see :meth:`denormalized`)."""
        rows, n = obs.shape[:2]
        return self.agent.values(obs.reshape(rows * n, *obs.shape[2:])).reshape(rows, n).cpu().numpy()

    def denormalized(self, values: np.ndarray) -> np.ndarray:
        """The critic's outputs (recorded while acting, or computed here) as values in the returns' units, for
        GAE or V-trace to bootstrap from, truncated episodes' final observations included: ``z * std + mean``
        with ``normalize_value``, else as they are."""
        return values if self.value_norm is None else self.value_norm.denormalize_numpy(values)

    def final_values(self, rollout: Rollout) -> np.ndarray | None:
        """The values the collector recorded of final observations where the next episode began at once, in the
        returns' units (None where every final observation is the rollout's next row)."""
        return None if rollout.final_values is None else self.denormalized(rollout.final_values)

    def value_targets(self, returns: torch.Tensor) -> torch.Tensor:
        """What the critic's output is trained toward: the returns, normalised with ``normalize_value``."""
        return returns if self.value_norm is None else self.value_norm.normalize(returns)

    def explained_variance(self, packed: PackedBatch) -> float:
        """The batch's explained variance in the returns' units (the critic's outputs denormalised with the
        statistics its advantages were computed with: call it before the normaliser's update)."""
        if self.value_norm is None:
            return packed.explained_variance()
        return packed.explained_variance(self.value_norm.denormalize(packed.all_rows().old_values))

    def recomputed(self, batch: RolloutBatch) -> RolloutBatch:
        """``batch`` with the current critic's values, and the advantages and returns they give."""
        rollout = batch.rollout
        assert rollout is not None, "the batch was prepared without recompute_advantage"
        device = self.agent.device
        obs = torch.from_numpy(rollout.obs).to(device)
        T = rollout.rewards.shape[0]
        behaviour = batch.log_probs.reshape(T, -1).cpu().numpy()
        targets = self.targets(dataclasses.replace(rollout, values=None, log_probs=behaviour), obs, batch.actions, None)
        return dataclasses.replace(
            batch,
            values=torch.from_numpy(targets.values[:T].reshape(-1).copy()).to(device),
            advantages=torch.from_numpy(targets.advantages.reshape(-1)).to(device),
            returns=torch.from_numpy(targets.returns.reshape(-1)).to(device),
        )

    @staticmethod
    def batch_statistics(batch: RolloutBatch) -> np.ndarray:
        """This worker's part of what :meth:`update` needs summed over every worker's batch: [count, sum, sum of
        squares] of the advantages over valid steps. A loop that sums statistics over workers once per iteration sums
        these in the same collective and hands the sums to ``update`` as ``batch_totals``."""
        adv = batch.advantages.double()
        return np.array(
            [float(batch.valid.sum()), float((adv * batch.valid).sum()), float((adv.square() * batch.valid).sum())]
        )

    def normalized_advantages(self, batch: RolloutBatch, sync: Sync, moments: np.ndarray | None = None) -> torch.Tensor:
        """Advantages standardised with the mean and std over every worker's valid steps.

        ``moments`` are the already summed :meth:`batch_statistics` of all workers; without
        them this sums them itself (one more collective).
        """
        if not self.cfg.normalize_advantage:
            return batch.advantages
        count, total, total_sq = moments if moments is not None else sync.all_sum(self.batch_statistics(batch))
        mean = total / max(count, 1.0)
        std = np.sqrt(max(total_sq / max(count, 1.0) - mean * mean, 0.0))
        return ((batch.advantages - mean) / (std + 1e-8)) * batch.valid

    def update(
        self,
        batch: RolloutBatch,
        sync: Sync,
        progress_remaining: float = 1.0,
        batch_totals: np.ndarray | None = None,
    ) -> dict[str, float]:
        """``n_epochs`` x minibatches of: loss gradient → ``sync.gradients`` → clip → Adam step.

        ``batch_totals``: every worker's :meth:`batch_statistics` of its batch, summed already (the on-policy
        loop's one all-reduce per iteration carries them); None: ``update`` sums them through ``sync`` (one more
        collective). With ``recompute_advantage`` every epoch after the first starts from :meth:`recomputed`
        (every worker recomputes its own part, then the advantages are normalised over all of them).
        """
        packed = PackedBatch.pack(batch, self.normalized_advantages(batch, sync, batch_totals))

        def repack() -> PackedBatch:
            fresh = self.recomputed(batch)
            return PackedBatch.pack(fresh, self.normalized_advantages(fresh, sync))

        return self.update_packed(
            packed, sync, progress_remaining, repack=repack if batch.rollout is not None else None
        )

    def update_packed(
        self,
        packed: PackedBatch,
        sync: Sync,
        progress_remaining: float = 1.0,
        part: tuple[int, int] | None = None,
        repack: Callable[[], PackedBatch] | None = None,
    ) -> dict[str, float]:
        """The update on an already packed batch (advantages as they should be used).

        ``part=(j, k)``: this worker holds the whole batch and computes the gradient of the
        j-th of k chunks of every minibatch; summed over the k workers that is the whole
        minibatch's gradient (``decoupled --share-data``). Every worker must then draw the
        same shuffles. ``repack``: called before every epoch after the first for the batch to use.
        """
        cfg = self.cfg
        lr = linear(cfg.learning_rate, progress_remaining, cfg.lr_schedule)
        clip_range = linear(cfg.clip_range, progress_remaining, cfg.clip_schedule)
        grad = self.agent.params.grad
        explained_variance = self.explained_variance(packed)
        if self.value_norm is not None:  # once per update, before any value loss, from every worker's returns
            everything = packed.all_rows()
            self.value_norm.update(sync.all_sum(self.value_norm.moments(everything.returns, everything.valid)))
        report = UpdateReport(self.policies)
        for epoch in range(cfg.n_epochs):
            if epoch and repack is not None:
                packed = repack()
                explained_variance = self.explained_variance(packed)
            for mb, sequences in packed.minibatches(cfg.batch_size, self.shuffle_rng, part, self.agents_per_env):
                stats = self._minibatch_gradient(mb, clip_range, sequences)
                sync.gradients(grad, stats)
                summed = stats.tolist()  # all samples' statistics first, then each policy's
                count = summed[COUNT]
                if count == 0:
                    continue
                report.approx_kl = summed[APPROX_KL] / count
                if cfg.target_kl is not None and report.approx_kl > 1.5 * cfg.target_kl:
                    report.stopped_early = True  # every worker sees the same summed KL: they stop together
                    break
                report.add(summed, self.optimizer.step(lr, samples=count))
            if report.stopped_early:
                break
        self.agent.refresh_acting_copy()
        return report.metrics(explained_variance, lr, clip_range)

    def _minibatch_gradient(self, mb: Minibatch, clip_range: float, sequences: Sequences | None = None) -> torch.Tensor:
        """Put the gradient of the minibatch's :func:`ppo_loss` (summed over valid samples) in the buffer.

        Returns the summed statistics that travel with the gradient: :data:`~distrl.algos.policy_stats.STATS`
        over all valid samples, then over each policy's (a multi-agent run with several), flattened.
        """
        agent = self.agent
        if sequences is None:
            fwd = agent.forward_train(mb.obs)
        else:
            fwd = agent.forward_sequences(mb.obs, sequences.initial_state, sequences.starts)
        terms = agent.dist_terms(fwd, mb.actions)
        loss, output_grads = self.loss_and_output_grads((terms.log_prob, terms.entropy, fwd.values), mb, clip_range)
        agent.backward(fwd, terms, mb.actions, *output_grads)  # d loss / d outputs, onwards
        # the statistics, from values that carry no graph (the loss's parts never do; a module's outputs may), so
        # that no no_grad block is needed: at this size it costs as much as an operation
        ratio = loss.ratio
        approx_kl = torch.sub(ratio, 1.0).sub_(
            loss.log_ratio
        )  # (r - 1) - log r (http://joschu.net/blog/kl-approx.html)
        # 1.0 where the ratio lies outside the clip range (ne_ writes the comparison as the ratio's float dtype)
        was_clipped = ratio.clamp(1.0 - clip_range, 1.0 + clip_range).ne_(ratio)
        per_sample = torch.stack(
            [mb.valid, approx_kl, was_clipped, loss.policy_loss, loss.value_loss, terms.entropy.detach()]
        )
        stats = per_sample @ mb.valid  # float32, as the all-reduce carries it; the update sums them in float64
        if self.policies is not None:
            stats = torch.cat([stats[None], self.policies.sums(per_sample, mb.valid, mb.rows)]).flatten()
        return stats

    def loss_and_output_grads(
        self, outputs: tuple[torch.Tensor, ...], mb: Minibatch, clip_range: float
    ) -> tuple[PPOLoss, tuple[torch.Tensor | None, ...]]:
        """The minibatch's loss and its gradient with respect to the network's (log_prob, entropy, values), for the
        network's backward pass: :func:`~distrl.algos.fused.fused_ppo_loss` in one closed-form pass (the default),
        or autograd over :meth:`loss` with ``fused_loss=False``."""
        if not self.cfg.fused_loss:
            return self.autograd_loss_and_output_grads(outputs, mb, clip_range)
        log_prob, entropy, values = outputs
        fused = fused_ppo_loss(
            log_prob.detach(), entropy.detach(), values.detach(), *self._loss_arguments(mb, clip_range), total=False
        )
        return PPOLoss(
            fused.loss, fused.policy_loss, fused.value_loss, fused.ratio, fused.log_ratio
        ), fused.output_grads

    def autograd_loss_and_output_grads(
        self, outputs: tuple[torch.Tensor, ...], mb: Minibatch, clip_range: float
    ) -> tuple[PPOLoss, tuple[torch.Tensor | None, ...]]:
        """:meth:`loss` written plainly, and autograd over its graph for d(loss)/d(outputs); the loss comes back
        detached, as the fused path's."""
        inputs = leaves(*outputs)
        loss = self.loss(inputs, mb, clip_range)
        grads = output_grads(loss.loss, inputs)
        return PPOLoss(*(part.detach() for part in loss)), grads

    def loss(self, outputs: tuple[torch.Tensor, ...], mb: Minibatch, clip_range: float) -> PPOLoss:
        """The minibatch's :func:`ppo_loss` on the network's (log_prob, entropy, values)."""
        return ppo_loss(*outputs, *self._loss_arguments(mb, clip_range))

    def _loss_arguments(self, mb: Minibatch, clip_range: float) -> tuple[Any, ...]:
        """What :func:`ppo_loss` (and its fused form) takes beside the network's outputs."""
        cfg = self.cfg
        targets = self.value_targets(mb.returns)
        return (
            mb.old_log_prob,
            mb.old_values,
            mb.advantages,
            targets,
            mb.valid,
            clip_range,
            cfg.clip_range_vf,
            cfg.vf_coef,
            cfg.ent_coef,
        )

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The optimizer's state, and with ``normalize_value`` the normaliser's as ``value_norm/<key>``."""
        tensors = self.optimizer.state_dict()
        if self.value_norm is not None:
            tensors.update({f"{_VALUE_NORM}/{k}": v for k, v in self.value_norm.state_dict().items()})
        return tensors

    def load_state_dict(self, tensors: dict[str, torch.Tensor]) -> None:
        """What :meth:`state_dict` gave; a checkpoint from before ``normalize_value`` was set (no ``value_norm/``
        entries) leaves the normaliser's statistics as they are."""
        self.optimizer.load_state_dict(tensors)
        prefix = f"{_VALUE_NORM}/"
        stats = {k.removeprefix(prefix): v for k, v in tensors.items() if k.startswith(prefix)}
        if self.value_norm is not None and stats:
            self.value_norm.load_state_dict(stats)
