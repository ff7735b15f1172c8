"""On-policy rollouts: collection from a vector env and the flat training batch (the advantages that the
algorithm computes from it: :mod:`distrl.algos.estimators`)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
import torch

from distrl.data.collector import Collector, LocalCollection
from distrl.data.normalize import ObsNormalizer, RewardScaler
from distrl.envs.spaces import stored_layout
from distrl.envs.vector import VecEnv
from distrl.nets import Agent
from distrl.nets.recurrent import state_to_numpy


@dataclass
class Rollout:
    """What a collector saw over ``n_steps`` vector steps; arrays are [T, N, ...].

    ``obs`` has T + 1 rows: the last row is the observation after the final step, so
    that values can be computed for every step and its successor in one pass.
    """

    obs: np.ndarray
    actions: np.ndarray
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    policy_version: int
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    episode_agent_returns: list[list[float]] = field(default_factory=list)
    """A multi-agent env's games: each agent's return of each game in ``episode_returns`` (the team's)."""
    obs_moments: np.ndarray | None = None
    """Moments of the raw observations seen, for the normaliser (see data/normalize.py)."""
    reward_moments: np.ndarray | None = None
    """Moments of the discounted returns seen, for the reward scaler."""
    collect_s: float = 0.0
    collected_steps: int = 0
    """Vector steps actually taken (fewer than n_steps when preempted)."""
    log_probs: np.ndarray | None = None
    """[T, N] log-probabilities of the actions under the policy that took them, recorded while acting
    (module networks) or after (pipeline generators); None: the learner computes them."""
    values: np.ndarray | None = None
    """[T + 1, N] the critic's values of ``obs`` at collection time, recorded while acting by module
    networks; None: the learner computes them in one batched pass."""
    starts: np.ndarray | None = None
    """Recurrent policies: [T + 1, N] True where ``obs[t]`` begins an episode (the state restarts there)."""
    initial_state: dict[str, np.ndarray] | None = None
    """Recurrent policies: each environment's state before ``obs[0]``, parts "0", "1", ... of shape
    [layers, N, hidden] (see ``distrl.nets.recurrent.state_to_numpy``)."""
    final_values: np.ndarray | None = None
    """[T, N] where the collector began the next episode at once after step ``t`` ended one (``obs[t + 1]`` is
    then the new episode's first observation): the critic's output for the ended episode's true final
    observation at a truncation, 0 at a termination, which GAE and V-trace bootstrap from. None: the collector
    left the reset to the env's next step, so every final observation is the next row (see
    :func:`distrl.algos.estimators.following_values`)."""

    @property
    def steps(self) -> int:
        """Environment steps taken (including reset steps, excluding padding)."""
        return self.collected_steps * int(self.rewards.shape[1])


def merge_rollouts(parts: list[Rollout]) -> Rollout:
    """Concatenate fragments from several workers along the env axis (in the given order)."""
    cat = lambda name: np.concatenate([getattr(p, name) for p in parts], axis=1)  # noqa: E731
    merged = Rollout(
        cat("obs"),
        cat("actions"),
        cat("rewards"),
        cat("terminated"),
        cat("truncated"),
        cat("valid"),
        parts[0].policy_version,
    )
    if parts[0].values is not None:
        merged.values = cat("values")
    if parts[0].log_probs is not None:
        merged.log_probs = cat("log_probs")
    if parts[0].final_values is not None:
        merged.final_values = cat("final_values")
    if parts[0].starts is not None:  # recurrent: each fragment's starts and initial state, env axis 1 alike
        merged.starts = cat("starts")
        merged.initial_state = {
            key: np.concatenate([p.initial_state[key] for p in parts], axis=1) for key in parts[0].initial_state
        }
    for p in parts:
        merged.episode_returns.extend(p.episode_returns)
        merged.episode_lengths.extend(p.episode_lengths)
        merged.episode_agent_returns.extend(p.episode_agent_returns)
    if parts[0].obs_moments is not None:
        merged.obs_moments = sum(p.obs_moments for p in parts)
    if parts[0].reward_moments is not None:
        merged.reward_moments = sum(p.reward_moments for p in parts)
    merged.collected_steps = parts[0].collected_steps
    merged.collect_s = max(p.collect_s for p in parts)
    return merged


@dataclass(frozen=True)
class Sequences:
    """How a flat batch of B = T * N rows (row t * N + n) is N environment sequences of T steps."""

    starts: torch.Tensor  # [T, N] 1.0 where a step begins an episode
    initial_state: tuple[torch.Tensor, ...]  # each [layers, N, hidden]: the state before step 0

    @property
    def length(self) -> int:
        return int(self.starts.shape[0])

    @property
    def count(self) -> int:
        return int(self.starts.shape[1])

    def select(self, envs: torch.Tensor) -> Sequences:
        return Sequences(self.starts[:, envs], tuple(s[:, envs] for s in self.initial_state))


@dataclass(frozen=True)
class RolloutBatch:
    """A flat on-policy training batch; B = T * N, invalid steps carry ``valid == 0``."""

    obs: torch.Tensor  # [B, *obs_shape] in the stored dtype (uint8 images, float32 vectors)
    actions: torch.Tensor  # [B] (discrete) or [B, A]
    log_probs: torch.Tensor  # [B] behaviour log-probabilities
    values: torch.Tensor  # [B] critic values at collection time
    advantages: torch.Tensor  # [B]
    returns: torch.Tensor  # [B] value targets
    valid: torch.Tensor  # [B] 1.0 for trainable steps, 0.0 for reset steps
    policy_version: int
    sequences: Sequences | None = None
    """Recurrent policies: the batch is N sequences of T steps, row t * N + n."""
    rollout: Rollout | None = None
    """The rollout the batch came from, kept when the advantages are to be recomputed between epochs
    (PPO ``recompute_advantage``)."""

    @property
    def size(self) -> int:
        return int(self.obs.shape[0])


class RolloutSource(Collector, Protocol):
    """A collector of fixed-length rollouts (PPO's): this process's environments, remote workers or a pipeline."""

    def collect(
        self, policy_version: int, preempt: Callable[[], bool] | None = None, min_steps: int = 0
    ) -> Rollout: ...


class RolloutCollector(LocalCollection):
    """Steps a :class:`VecEnv` with the current policy for ``n_steps`` per rollout.

    Sampling noise comes from one random stream per environment, keyed by the run seed
    and the environment's global index, so that the same environments produce the same
    actions however they are split over workers. The collector does not know about
    workers: ``env_offset`` is just the global index of its first environment.

    Where the env allows it (:attr:`VecEnv.can_restart`), an episode that ends is followed at once by the next
    (:meth:`VecEnv.restart`): every step of a rollout is a transition, as in a stable-baselines3 rollout, and
    a truncated episode's final observation is valued as it is seen (``Rollout.final_values``). Elsewhere
    the env's next step is the reset step, carried with ``valid`` False.
    """

    def __init__(
        self,
        env: VecEnv,
        agent: Agent,
        obs_normalizer: ObsNormalizer,
        reward_scaler: RewardScaler,
        n_steps: int,
        seed: int,
        env_offset: int = 0,
    ):
        self.env = env
        self.agent = agent
        self.obs_normalizer = obs_normalizer
        self.reward_scaler = reward_scaler
        self.n_steps = n_steps
        self.env_offset = env_offset
        self.noise_rngs: list[np.random.Generator] = []
        self._raw_obs: np.ndarray | None = None
        self.obs_shape, self.obs_dtype = stored_layout(env.single_observation_space)
        self.recurrent = agent.recurrent
        self._state: Any = None
        self._starts = np.ones(env.n_envs, dtype=bool)
        self.restarts = env.can_restart
        """Whether ended episodes begin again at once (no reset steps)."""

    def reset(self, seed: int, segment: int = 0) -> None:
        """Begin new episodes everywhere and restart the sampling streams.

        Environment i (global index ``env_offset + i``) is seeded ``seed + segment +
        env_offset + i`` and its noise stream from ``(seed, env_offset + i, segment)``;
        ``segment`` is the step count at which training (re)starts.
        """
        self._raw_obs = self.env.reset(seed=seed + segment + self.env_offset)
        if self.recurrent:  # every environment begins an episode: states restart
            self._state = self.agent.initial_state(self.env.n_envs)
            self._starts[:] = True
        self.reward_scaler.reset()
        self.noise_rngs = [
            np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, self.env_offset + i, segment])))
            for i in range(self.env.n_envs)
        ]

    def _noise(self) -> np.ndarray:
        return np.stack([self.agent.spec.draw_noise(rng, (self.n_steps,)) for rng in self.noise_rngs], axis=1)

    def collect(self, policy_version: int, preempt: Callable[[], bool] | None = None, min_steps: int = 0) -> Rollout:
        """Step all environments ``n_steps`` times (or fewer, see ``preempt``).

        Args:
            policy_version: recorded in the rollout.
            preempt: asked after each step from ``min_steps`` on; when it answers True the
                rollout stops early (straggler preemption). The remaining steps are padded:
                observations repeat the last one (so its value bootstraps the last real
                step) and ``valid`` is False, so they carry no weight.
        """
        assert self._raw_obs is not None, "call reset() before collect()"
        start = time.perf_counter()
        T, N = self.n_steps, self.env.n_envs
        normalize = self.obs_normalizer.enabled  # vector observations only: images stay uint8
        obs = np.empty((T + 1, N, *self.obs_shape), dtype=self.obs_dtype)
        raw_obs = np.empty_like(obs) if normalize else obs
        spec = self.agent.spec
        actions = np.empty((T, N, *spec.action_shape), dtype=spec.action_dtype)
        rewards = np.empty((T, N), dtype=np.float32)
        terminated = np.empty((T, N), dtype=bool)
        truncated = np.empty((T, N), dtype=bool)
        valid = np.empty((T, N), dtype=bool)
        noise = self._noise()
        rollout = Rollout(obs, actions, rewards, terminated, truncated, valid, policy_version)
        # A module network's acting pass yields the value and the action's log-prob as well: keeping them
        # spares two forward passes over the rollout. The closed-form MLPs act on the policy alone and
        # compute both afterwards in one batched pass, which is cheaper for them.
        if self.agent.records_while_acting:
            rollout.log_probs = np.zeros((T, N), dtype=np.float32)
            rollout.values = np.empty((T + 1, N), dtype=np.float32)
        if self.restarts:
            rollout.final_values = np.zeros((T, N), dtype=np.float32)
        if self.recurrent:  # the fragment's initial state, from which training replays it
            rollout.starts = np.zeros((T + 1, N), dtype=bool)
            rollout.initial_state = state_to_numpy(self._state)
        raw_obs[0] = self._raw_obs
        if normalize:
            obs[0] = self.obs_normalizer(raw_obs[0])
        for t in range(T):
            if self.recurrent:
                rollout.starts[t] = self._starts
            action, log_probs, values, self._state = self.agent.act_step(obs[t], noise[t], self._state, self._starts)
            if rollout.log_probs is not None:
                rollout.log_probs[t], rollout.values[t] = log_probs, values
            actions[t] = action
            step = self.env.step(self.agent.env_action(action))
            ended = step.terminated | step.truncated
            restarted = self.restarts and ended.any()
            if restarted:  # value the truncated episodes' ends as seen, then begin the next episodes at once
                cut = step.truncated & ~step.terminated
                if cut.any():
                    rollout.final_values[t, cut] = self._values_of(step.obs, cut)
                raw_obs[t + 1] = self.env.restart(ended)
            else:
                raw_obs[t + 1] = step.obs
            if normalize:
                obs[t + 1] = self.obs_normalizer(raw_obs[t + 1])
            terminated[t] = step.terminated
            truncated[t] = step.truncated
            valid[t] = step.valid
            rewards[t] = self.reward_scaler(step.reward, ended, step.valid)
            if self.recurrent:  # after a restart or a reset step the observation is a new episode's first
                self._starts = ended if restarted else ~step.valid
            if len(step.episode_returns):
                rollout.episode_returns.extend(step.episode_returns.tolist())
                rollout.episode_lengths.extend(step.episode_lengths.tolist())
                if step.agent_returns is not None:
                    rollout.episode_agent_returns.extend(step.agent_returns.tolist())
            if preempt is not None and t + 1 >= min_steps and t + 1 < T and preempt():
                self._pad(rollout, raw_obs, t + 1)
                T = t + 1
                break
        self._raw_obs = raw_obs[T]
        if self.recurrent:  # the last observation's value from the state reached, which goes on to the next fragment
            rollout.starts[T:] = self._starts
            rollout.values[T:] = self.agent.value_state(obs[T], self._state, self._starts)
        elif self.agent.records_while_acting:  # the value of the last observation, repeated over any padding
            rollout.values[T:] = self.agent.values(torch.from_numpy(obs[T])).cpu().numpy()
        if normalize:
            rollout.obs_moments = self.obs_normalizer.moments(raw_obs[1 : T + 1].reshape(T * N, *self.obs_shape))
        if self.reward_scaler.enabled:
            rollout.reward_moments = self.reward_scaler.take_moments()
        rollout.collected_steps = T
        rollout.collect_s = time.perf_counter() - start
        return rollout

    def _values_of(self, raw_obs: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The critic's outputs for the observations ``raw_obs`` of the rows ``rows`` (a recurrent critic from
        the state the last step reached, as those episodes' next step would have used it)."""
        obs = self.obs_normalizer(raw_obs) if self.obs_normalizer.enabled else raw_obs
        if self.recurrent:
            return np.asarray(self.agent.value_state(obs, self._state, np.zeros(len(rows), dtype=bool)))[rows]
        return self.agent.values(torch.from_numpy(np.ascontiguousarray(obs[rows]))).cpu().numpy()

    @staticmethod
    def _pad(rollout: Rollout, raw_obs: np.ndarray, steps: int) -> None:
        rollout.obs[steps + 1 :] = rollout.obs[steps]
        raw_obs[steps + 1 :] = raw_obs[steps]
        rollout.actions[steps:] = 0
        rollout.rewards[steps:] = 0.0
        rollout.terminated[steps:] = False
        rollout.truncated[steps:] = False
        rollout.valid[steps:] = False
