"""The objectives of four offline RL methods, as plain losses on the networks' outputs.

- Behaviour cloning: the dataset action's negative log-likelihood (stochastic policies, discrete or continuous)
  or squared error (deterministic policies).
- TD3 (Fujimoto, van Hoof & Meger 2018, arXiv:1802.09477) and TD3+BC (Fujimoto & Gu 2021, arXiv:2106.06860):
  clipped double-Q targets, and TD3's actor loss plus a behaviour-cloning term weighted against the Q scale.
- IQL (Kostrikov, Nair & Levine 2021, arXiv:2110.06169): an expectile regression of V on Q, a TD loss of Q on V
  of the next state, and advantage-weighted regression for the policy.
- CQL (Kumar, Zhou, Tucker & Levine 2020, arXiv:2006.04779): the CQL(H) conservative penalty on top of SAC with
  its Lagrangian weight (continuous), and on top of DQN (discrete).

Every loss is summed over the samples of a batch, as every loss in ``distrl.algos``: ``Sync.gradients`` sums
the gradients and sample counts over workers and the sum is divided by the global count, which gives the
references' batch means. Where a reference takes a statistic of the whole batch (TD3+BC's Q scale, CQL's mean
penalty for its Lagrangian weight) the function takes what makes the sum over workers exact.

Targets and weights that a method treats as constants (TD3+BC's lambda, IQL's advantage weights and bootstrap
values, CQL's sampled log-densities) are detached here; the targets built from target networks are the
caller's to compute under ``torch.no_grad``, as in :mod:`distrl.algos.sac`.
"""

from __future__ import annotations

import math

import torch

# ---- behaviour cloning ----


def bc_gaussian_loss(log_prob: torch.Tensor) -> torch.Tensor:
    """``-sum_i log pi(a_i|s_i)``: the dataset actions' negative log-likelihood under a stochastic policy.

    Args:
        log_prob: [B] the policy's log-density of each dataset action (summed over action dimensions).
    """
    return -log_prob.sum()


def bc_deterministic_loss(action: torch.Tensor, dataset_action: torch.Tensor) -> torch.Tensor:
    """``sum_i (1/A) ||pi(s_i) - a_i||^2``: the squared error averaged over the A action dimensions, summed over
    samples.

    Averaged over dimensions as in TD3+BC's BC term and the reference implementations' BC: the gradient has their
    scale, and Adam's epsilon (fixed, beside the gradient's running magnitude) weighs what it weighs there.

    Args:
        action: [B, A] the deterministic policy's actions.
        dataset_action: [B, A] the dataset's actions.
    """
    return (action - dataset_action).square().mean(dim=1).sum()


def bc_categorical_loss(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """``-sum_i log softmax(logits_i)[a_i]``: cross-entropy of the dataset's discrete actions, summed.

    Args:
        logits: [B, n_actions] the policy's unnormalised log-probabilities.
        actions: [B] the dataset's action indices.
    """
    return torch.nn.functional.cross_entropy(logits, actions.long(), reduction="sum")


# ---- TD3 and TD3+BC ----


def td3_target(
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_q1: torch.Tensor,
    next_q2: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """``r + gamma (1 - terminated) min(Q'_1(s', a'), Q'_2(s', a'))`` per sample [B] (clipped double Q).

    The target policy smoothing is the caller's: ``a' = clip(pi'(s') + clip(eps, -c, c), -1, 1)`` with
    ``eps ~ N(0, sigma^2)`` goes into the target critics before this. Truncated episodes are not ``terminated``.

    Args:
        rewards, terminated: [B] the transitions' rewards and 1.0 where the episode terminated.
        next_q1, next_q2: [B] the target critics' values of the next state and the smoothed target action.
    """
    return rewards + gamma * (1.0 - terminated) * torch.minimum(next_q1, next_q2)


def td3_critic_loss(q1: torch.Tensor, q2: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """``sum_i (Q_1(s, a) - y)^2 + (Q_2(s, a) - y)^2``, summed over samples (``target`` y detached).

    Divided by the batch size it is the reference's ``mse_loss(Q1, y) + mse_loss(Q2, y)`` (sfujim/TD3 and
    sfujim/TD3_BC): each critic's mean squared error, the two added, no factor 1/2 (distrl's SAC has one, as
    stable-baselines3's).

    Args:
        q1, q2: [B] both critics' values of the dataset's (s, a).
        target: [B] :func:`td3_target`.
    """
    return ((q1 - target).square() + (q2 - target).square()).sum()


def td3_actor_loss(q1_pi: torch.Tensor) -> torch.Tensor:
    """``-sum_i Q_1(s_i, pi(s_i))``: TD3's deterministic policy gradient through the first critic.

    Args:
        q1_pi: [B] the first critic's values of the policy's actions.
    """
    return -q1_pi.sum()


def td3bc_actor_loss(
    q1_pi: torch.Tensor,
    action_pi: torch.Tensor,
    dataset_action: torch.Tensor,
    alpha: float,
    q_abs_mean: float | torch.Tensor | None = None,
) -> torch.Tensor:
    """TD3+BC's actor loss: ``sum_i [-lambda Q_1(s_i, pi(s_i)) + (1/A) ||pi(s_i) - a_i||^2]``.

    ``lambda = alpha / mean_i |Q_1(s_i, pi(s_i))|`` is a constant of the step: no gradient flows through the
    normaliser. It is the Q scale of the whole batch, so a caller that splits a batch over workers passes
    ``q_abs_mean``, the mean over every worker's samples (an all-reduced sum of ``|Q_1|`` over the global
    count); None computes it from this batch (a single worker's whole batch). The paper writes the normaliser
    over the minibatch's ``Q(s_i, a_i)``; the reference code (sfujim/TD3_BC, also CORL) and this use
    ``Q_1(s_i, pi(s_i))``.

    The behaviour-cloning term is averaged over the A action dimensions, as the reference's
    ``F.mse_loss(pi, action)``: the default ``alpha = 2.5`` was tuned with that scale (summed over dimensions
    it would be A times stronger).

    Args:
        q1_pi: [B] the first critic's values of the policy's actions.
        action_pi: [B, A] the policy's actions.
        dataset_action: [B, A] the dataset's actions.
        alpha: the paper's alpha (2.5 in its experiments).
        q_abs_mean: ``mean |Q_1(s, pi(s))|`` over the global batch, or None for this batch's.
    """
    if q_abs_mean is None:
        q_abs_mean = q1_pi.abs().mean()
    lam = alpha / torch.as_tensor(q_abs_mean, dtype=q1_pi.dtype, device=q1_pi.device).detach()
    bc = (action_pi - dataset_action).square().mean(dim=1)
    return (bc - lam * q1_pi).sum()


# ---- IQL ----


def expectile_loss(diff: torch.Tensor, tau: float) -> torch.Tensor:
    """``sum_i |tau - 1(d_i < 0)| d_i^2``: the asymmetric squared loss whose minimiser is the tau-expectile.

    IQL's ``d = Q(s, a) - V(s)`` with Q from the target critics, detached by the caller (:func:`iql_value_loss`
    does it): only V learns from this loss. With ``tau > 0.5`` a V below Q costs more than a V above it, so V
    approaches an upper expectile of Q over the dataset's actions.

    Args:
        diff: [B] the differences ``d``.
        tau: the expectile, in (0, 1) (0.7 for MuJoCo, 0.9 for AntMaze in the paper).
    """
    weight = (tau - (diff < 0).to(diff.dtype)).abs()
    return (weight * diff.square()).sum()


def iql_value_loss(q_target_min: torch.Tensor, v: torch.Tensor, tau: float) -> torch.Tensor:
    """IQL's value loss, :func:`expectile_loss` of ``min_i Q'_i(s, a) - V(s)`` (the Q-values detached here).

    Args:
        q_target_min: [B] the smaller of the target critics' values of the dataset's (s, a).
        v: [B] the value network's ``V(s)``.
        tau: the expectile.
    """
    return expectile_loss(q_target_min.detach() - v, tau)


def iql_critic_loss(
    q1: torch.Tensor,
    q2: torch.Tensor,
    rewards: torch.Tensor,
    terminated: torch.Tensor,
    next_v: torch.Tensor,
    gamma: float,
) -> torch.Tensor:
    """``sum_i sum_{k=1,2} (Q_k(s, a) - (r + gamma (1 - terminated) V(s')))^2``, the target detached here.

    IQL bootstraps from the value network, never from an action the dataset lacks: this is where the method
    avoids querying Q out of distribution. No factor 1/2, as the reference (ikostrikov/implicit_q_learning).

    Args:
        q1, q2: [B] both critics' values of the dataset's (s, a).
        rewards, terminated: [B] the transitions' rewards and 1.0 where the episode terminated.
        next_v: [B] the value network's ``V(s')``.
        gamma: the discount.
    """
    target = (rewards + gamma * (1.0 - terminated) * next_v).detach()
    return ((q1 - target).square() + (q2 - target).square()).sum()


def iql_actor_loss(
    log_prob: torch.Tensor,
    q_target_min: torch.Tensor,
    v: torch.Tensor,
    beta: float,
    max_weight: float = 100.0,
) -> torch.Tensor:
    """Advantage-weighted regression: ``-sum_i min(exp(beta (Q(s_i, a_i) - V(s_i))), max_weight) log pi(a_i|s_i)``.

    The weights are constants (detached here): the policy clones the dataset's actions, the better ones more.
    ``beta`` is the paper's inverse temperature (3.0 for MuJoCo, 10.0 for AntMaze); the clip at 100 is the
    reference's, not in the paper, and keeps one large advantage from dominating a batch.

    Args:
        log_prob: [B] the policy's log-density of each dataset action.
        q_target_min: [B] the smaller of the target critics' values of the dataset's (s, a).
        v: [B] the value network's ``V(s)``.
        beta: the inverse temperature.
        max_weight: the largest weight a sample gets.
    """
    weight = torch.exp(beta * (q_target_min - v).detach()).clamp(max=max_weight)
    return -(weight * log_prob).sum()


# ---- CQL ----


def cql_penalty(
    q_random: torch.Tensor,
    q_policy: torch.Tensor,
    q_next_policy: torch.Tensor,
    log_prob_policy: torch.Tensor,
    log_prob_next_policy: torch.Tensor,
    q_data: torch.Tensor,
    action_dim: int,
    temperature: float = 1.0,
) -> torch.Tensor:
    """CQL(H)'s conservative penalty of one critic, ``sum_i [T logsumexp_j (x_ij / T) - Q(s_i, a_i)]``.

    The ``x_ij`` are importance-sampled estimates of ``log sum_a exp Q(s_i, a)`` from 3N actions per state,
    each Q-value minus the log-density of the distribution that proposed its action::

        Q(s, a_rand)  - log(0.5^A)          a_rand uniform in [-1, 1]^A, density 0.5^A
        Q(s, a_pi)    - log pi(a_pi | s)    a_pi ~ pi(.|s)
        Q(s, a'_pi)   - log pi(a'_pi | s')  a'_pi ~ pi(.|s'), the next state's actions at this state

    so ``- log(0.5^A) = + A log 2`` raises the uniform samples: a smaller density weighs a sample more. This is
    the reference's ``min_q_version=3`` (aviralkumar2907/CQL, rlkit ``cql.py``; CORL's ``cql.py`` alike),
    with the temperature dividing the whole entries, the density terms included. As the reference, the sum
    over 3N samples is not divided by 3N: that shifts the penalty by ``log 3N`` (no gradient), which matters
    only against the Lagrangian's ``target_action_gap``. The log-densities are constants (detached here).

    The critic's loss adds ``alpha' *`` this (``alpha'`` the fixed or Lagrangian weight, times the reference's
    ``min_q_weight``) to its TD loss; call it once per critic.

    Args:
        q_random: [B, N] ``Q(s, a_rand)`` of N uniform actions per state.
        q_policy: [B, N] ``Q(s, a_pi)`` of N actions sampled from the policy at s.
        q_next_policy: [B, N] ``Q(s, a'_pi)`` of N actions sampled from the policy at s'.
        log_prob_policy: [B, N] ``log pi(a_pi | s)``.
        log_prob_next_policy: [B, N] ``log pi(a'_pi | s')``.
        q_data: [B] ``Q(s, a)`` of the dataset's action.
        action_dim: A, the number of action dimensions (actions scaled to [-1, 1]).
        temperature: T; 1.0 in the paper's experiments.
    """
    log_uniform_density = action_dim * math.log(0.5)
    proposals = torch.cat(
        [
            q_random - log_uniform_density,
            q_policy - log_prob_policy.detach(),
            q_next_policy - log_prob_next_policy.detach(),
        ],
        dim=1,
    )
    return (temperature * torch.logsumexp(proposals / temperature, dim=1) - q_data).sum()


def cql_alpha_loss(
    log_alpha_prime: torch.Tensor, penalty_sum: torch.Tensor, count: float, target_action_gap: float
) -> torch.Tensor:
    """The Lagrangian's loss for CQL's conservative weight, ``-alpha' (sum_i penalty_i - count * target_gap)``.

    ``alpha' = clamp(exp(log_alpha'), 0, 1e6)``, as the reference (aviralkumar2907/CQL, ``with_lagrange``;
    CORL alike). Gradient descent on ``log_alpha'`` raises alpha' while the mean penalty exceeds the target gap
    and lowers it while it is below. The penalty is a constant here (detached).

    The reference's loss is ``-alpha' (mean penalty - gap)`` over its batch; this is that loss summed over
    samples, so that summed over workers and divided by the global count it is the reference's over the global
    batch, as the other losses (and SAC's temperature loss). The reference averages its two critics' penalties:
    pass ``(cql_penalty(critic 1) + cql_penalty(critic 2)) / 2``, times its ``min_q_weight`` if one is used.

    Args:
        log_alpha_prime: 0-dim, the learned log of the conservative weight.
        penalty_sum: 0-dim, :func:`cql_penalty` of this batch (summed over its samples).
        count: the number of samples ``penalty_sum`` was summed over.
        target_action_gap: the threshold tau of the paper's Lagrangian form.
    """
    alpha_prime = log_alpha_prime.exp().clamp(0.0, 1e6)
    return -alpha_prime * (penalty_sum.detach() - count * target_action_gap)


def cql_discrete_penalty(q_all: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    """CQL(H) with DQN: ``sum_i [logsumexp_a Q(s_i, a) - Q(s_i, a_i)]``, exact over the discrete actions.

    Args:
        q_all: [B, n_actions] the Q network's values of every action.
        actions: [B] the dataset's action indices.
    """
    taken = q_all.gather(1, actions.long().unsqueeze(1)).squeeze(1)
    return (torch.logsumexp(q_all, dim=1) - taken).sum()
