"""Return and advantage estimators as pure functions: GAE, discounted returns, V-trace and n-step returns.

Each takes arrays and hyperparameters and returns arrays; nothing here keeps state, reads a config or knows a
network. Shapes are stated in each docstring: ``T`` steps of ``N`` environments, time first. They run in numpy in
float32 (GAE) or float64 (V-trace, returns) as the algorithms' tests have always checked them by hand, and every
one handles episode ends the same way: a terminated step does not bootstrap, a truncated one bootstraps from its
true final observation, and a ``valid`` 0 step (the reset step after an episode's end, or padding) contributes
nothing. The final observation's value is the next row's (``values[t + 1]``: Gymnasium's next-step autoreset, the
reset step follows), or ``final_values[t]`` where the collector began the next episode at once and the next row is
its first observation (see :func:`following_values`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np


def following_values(
    values: np.ndarray, terminated: np.ndarray, truncated: np.ndarray, final_values: np.ndarray | None
) -> np.ndarray:
    """[T, N] the value each step bootstraps from: the next row's, ``values[t + 1]``, except where step ``t``
    ended an episode and the next began at once (``final_values`` given): there ``final_values[t]``, the value
    of the episode's true final observation (used at a truncation; a termination does not bootstrap)."""
    following = values[1:]
    if final_values is None:
        return following
    return np.where(terminated | truncated, final_values, following)


def gae(
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    valid: np.ndarray,
    gamma: float,
    lam: float,
    final_values: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Generalised advantage estimation (Schulman et al. 2015, arXiv:1506.02438).

    Args:
        rewards, terminated, truncated, valid: [T, N] per step.
        values: [T + 1, N]; ``values[t + 1]`` is the value of the observation that step
            ``t`` produced. Under next-step autoreset, when step ``t`` ends an episode that
            observation is the episode's true final observation, so a truncated episode
            bootstraps from it and a terminated one does not bootstrap at all.
        gamma, lam: discount and GAE lambda.
        final_values: [T, N] where the next episode began at once: the final observations' values
            (see :func:`following_values`); None: every final observation is the next row.

    Returns:
        advantages and returns (advantages + values), [T, N]; 0 on invalid steps.
    """
    T = rewards.shape[0]
    advantages = np.zeros_like(rewards, dtype=np.float32)
    not_terminated = 1.0 - terminated.astype(np.float32)
    continues = not_terminated * (1.0 - truncated.astype(np.float32))
    valid_f = valid.astype(np.float32)
    following = following_values(values, terminated, truncated, final_values)
    running = np.zeros(rewards.shape[1], dtype=np.float32)
    for t in range(T - 1, -1, -1):
        delta = rewards[t] + gamma * not_terminated[t] * following[t] - values[t]
        running = (delta + gamma * lam * continues[t] * running) * valid_f[t]
        advantages[t] = running
    returns = (advantages + values[:T]) * valid_f
    return advantages, returns


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    """``G_t = r_t + gamma * G_{t+1}`` over one episode's rewards [T]."""
    out = np.zeros(len(rewards), dtype=np.float64)
    running = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def n_step_return(rewards: Sequence[float], gamma: float) -> float:
    """``R = r_0 + gamma r_1 + ... + gamma^(k-1) r_(k-1)`` over the ``k`` rewards of one n-step transition (``k <= n``;
    fewer where the episode ended), oldest first. The transition's bootstrap discount is ``gamma ** k``."""
    return sum(gamma**k * reward for k, reward in enumerate(rewards))


class VTrace(NamedTuple):
    """V-trace's targets for a [T, N] fragment; 0 on invalid steps."""

    vs: np.ndarray
    """[T, N] value targets ``v_s``: what the critic regresses to."""
    pg_advantages: np.ndarray
    """[T, N] policy-gradient advantages ``rho_s (r_s + gamma v_{s+1} - V(x_s))``."""


def vtrace(
    log_rhos: np.ndarray,
    rewards: np.ndarray,
    values: np.ndarray,
    terminated: np.ndarray,
    truncated: np.ndarray,
    valid: np.ndarray,
    gamma: float,
    lam: float = 1.0,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    final_values: np.ndarray | None = None,
) -> VTrace:
    """V-trace targets of a fragment collected by a behaviour policy ``mu``, for the target policy ``pi``.

    With ``rho_t = min(rho_bar, pi/mu)`` and ``c_t = lam * min(c_bar, pi/mu)`` at step t, the paper's
    definition (its eq. 1, with lambda as in its section 4.2 remark)::

        v_s = V(x_s) + sum_{t >= s} gamma^(t-s) (c_s ... c_{t-1}) rho_t (r_t + gamma V(x_{t+1}) - V(x_t))

    is computed backwards as ``v_s - V(x_s) = delta_s + gamma c_s (v_{s+1} - V(x_{s+1}))``. The sum stops
    where the episode ends: a terminated step does not bootstrap (``V(x_{t+1})`` is dropped), a
    truncated one bootstraps from its true final observation's value and carries no trace past it, as
    :func:`gae` does. With ``pi = mu`` and ``rho_bar, c_bar >= 1``, ``v_s - V(x_s)``
    is GAE(lam)'s advantage (and with ``lam = 1`` ``v_s`` is the n-step return bootstrapped at the
    fragment's end); ``pg_advantages`` bootstrap from ``v_{s+1}``, so they equal it only at ``lam = 1``.

    Args:
        log_rhos: [T, N] ``log pi(a_t|x_t) - log mu(a_t|x_t)`` of the actions taken.
        rewards, terminated, truncated, valid: [T, N] per step (``valid`` 0 marks the reset steps of
            next-step autoreset and padding; their targets are 0 and nothing flows through them).
        values: [T + 1, N] the critic's ``V(x)``; ``values[t + 1]`` is the value of the observation
            step t produced (the true final observation when step t ends an episode).
        gamma: discount; lam: the trace's lambda (1 in the paper's experiments).
        rho_bar, c_bar: truncation levels of the importance weights (the paper's defaults: 1).
        final_values: as for :func:`gae`.
    """
    T = rewards.shape[0]
    ratio = np.exp(np.asarray(log_rhos, dtype=np.float64))
    rho = np.minimum(rho_bar, ratio)
    c = lam * np.minimum(c_bar, ratio)
    values = np.asarray(values, dtype=np.float64)
    following = following_values(values, terminated, truncated, final_values)
    not_terminated = 1.0 - terminated.astype(np.float64)
    continues = not_terminated * (1.0 - truncated.astype(np.float64))
    valid_f = valid.astype(np.float64)
    # corrections[t] = v_t - V(x_t); the row after the fragment has none (v_T = V(x_T))
    corrections = np.zeros((T + 1, rewards.shape[1]), dtype=np.float64)
    pg_advantages = np.zeros(rewards.shape, dtype=np.float64)
    for t in range(T - 1, -1, -1):
        next_correction = continues[t] * corrections[t + 1]
        delta = rho[t] * (rewards[t] + gamma * not_terminated[t] * following[t] - values[t])
        corrections[t] = (delta + gamma * c[t] * next_correction) * valid_f[t]
        next_target = following[t] + next_correction  # v_{t+1} within the episode, V(x_{t+1}) at its end
        pg_advantages[t] = rho[t] * (rewards[t] + gamma * not_terminated[t] * next_target - values[t]) * valid_f[t]
    vs = (values[:T] + corrections[:T]) * valid_f
    return VTrace(vs.astype(np.float32), pg_advantages.astype(np.float32))
