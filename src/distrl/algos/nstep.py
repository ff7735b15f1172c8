"""n-step transitions from vector steps, for value-based learners (the n-step returns of Sutton & Barto ch. 7;
Rainbow, Hessel et al. 2018, arXiv:1710.02298, and Ape-X use them).

Each environment keeps its last ``n`` observations, actions and rewards. Once it holds ``n``, every step emits the
transition from the oldest: ``(obs_t, a_t, R, obs_{t+n}, terminated, gamma^n)`` with
``R = r_t + gamma r_{t+1} + ... + gamma^{n-1} r_{t+n-1}``. Where an episode ends, every transition still held is
emitted with the rewards up to the end and the discount ``gamma^k`` of its ``k`` steps, bootstrapping from the
episode's final observation: a learner's target ``R + discount * (1 - terminated) * V(next_obs)`` then bootstraps
after a truncation and not after a termination, as distrl's one-step transitions do. The reset step that follows
an episode's end (``valid`` False) adds nothing.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np

from distrl.algos.estimators import n_step_return
from distrl.config import require


@dataclass(frozen=True)
class NStepBatch:
    """Transitions completed by one vector step, in environment order (oldest first within an environment)."""

    obs: np.ndarray
    """[m, *obs_shape] in the stored dtype."""
    actions: np.ndarray
    """[m, *action_shape]"""
    returns: np.ndarray
    """[m] float32: the discounted sum of the rewards of the transition's steps."""
    next_obs: np.ndarray
    """[m, *obs_shape]: the observation after its last step (an episode's final observation at its end)."""
    terminated: np.ndarray
    """[m] float32: 1.0 where the episode terminated within the transition (no bootstrap)."""
    discounts: np.ndarray
    """[m] float32: gamma to the power of the transition's steps (n, or fewer where an episode ended)."""

    def __len__(self) -> int:
        return len(self.returns)


class NStepAccumulator:
    """Turns vector steps ``(obs, action, reward, next_obs, terminated, truncated, valid)`` of ``n_envs``
    environments into n-step transitions (see the module docstring)."""

    def __init__(self, n_envs: int, n: int, gamma: float):
        require(n >= 1, "n_step", n, ">= 1")
        require(0.0 <= gamma <= 1.0, "gamma", gamma, "in [0, 1]")
        self.n, self.gamma = n, gamma
        self.pending: list[deque[tuple[np.ndarray, np.ndarray, float]]] = [deque() for _ in range(n_envs)]

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        rewards: np.ndarray,
        next_obs: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        valid: np.ndarray,
    ) -> NStepBatch:
        """One vector step [n_envs, ...]; returns the transitions it completes (possibly none)."""
        out: list[tuple[np.ndarray, np.ndarray, float, np.ndarray, bool, int]] = []
        for i, pending in enumerate(self.pending):
            if not valid[i]:
                continue
            pending.append((obs[i].copy(), np.array(actions[i]), float(rewards[i])))  # the caller reuses its arrays
            if terminated[i] or truncated[i]:
                out += self._flush(pending, next_obs[i], bool(terminated[i]))
            elif len(pending) == self.n:
                out.append(self._oldest(pending, next_obs[i], False))
                pending.popleft()
        return self._batch(out, obs, actions)

    def cut(self, last_obs: np.ndarray) -> NStepBatch:
        """Emit everything held as if each environment's episode were truncated at ``last_obs`` [n_envs, ...] (the
        observation each environment is at): a segment restarts its environments (a checkpoint's, a resume's),
        and the transitions begun before it bootstrap from where they were cut."""
        out = []
        for i, pending in enumerate(self.pending):
            out += self._flush(pending, last_obs[i], False)
        return self._batch(out, last_obs, None)

    def _oldest(self, pending: deque, next_obs: np.ndarray, terminated: bool) -> tuple:
        obs, action, _ = pending[0]
        total = n_step_return([reward for _, _, reward in pending], self.gamma)
        return obs, action, total, next_obs, terminated, len(pending)

    def _flush(self, pending: deque, next_obs: np.ndarray, terminated: bool) -> list[tuple]:
        out = []
        while pending:
            out.append(self._oldest(pending, next_obs, terminated))
            pending.popleft()
        return out

    def _batch(self, out: list[tuple], obs: np.ndarray, actions: np.ndarray | None) -> NStepBatch:
        if not out:
            action_shape = actions.shape[1:] if actions is not None else ()
            action_dtype = actions.dtype if actions is not None else np.int64
            empty_obs = np.zeros((0, *obs.shape[1:]), obs.dtype)
            return NStepBatch(
                empty_obs,
                np.zeros((0, *action_shape), action_dtype),
                np.zeros(0, np.float32),
                empty_obs,
                np.zeros(0, np.float32),
                np.zeros(0, np.float32),
            )
        first, action, total, after, ended, steps = zip(*out)
        return NStepBatch(
            np.stack(first),
            np.stack(action),
            np.asarray(total, np.float32),
            np.stack(after),
            np.asarray(ended, np.float32),
            np.asarray([self.gamma**k for k in steps], np.float32),
        )
