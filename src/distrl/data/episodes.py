"""Whole-episode collection, for Monte-Carlo methods such as REINFORCE."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from distrl.data.collector import Collector, LocalCollection
from distrl.envs.spaces import stored_layout
from distrl.envs.vector import VecEnv
from distrl.nets import Agent

NOISE_BLOCK = 256  # steps of sampling noise drawn per environment at a time


@dataclass
class EpisodeBatch:
    """Complete episodes, concatenated; ``starts[k]:starts[k + 1]`` are episode k's steps."""

    obs: np.ndarray  # [M, *obs_shape] observations the policy acted on, in the stored dtype
    actions: np.ndarray  # [M] (Discrete), [M, parts] (MultiDiscrete) or [M, A] unclipped Gaussian samples
    rewards: np.ndarray  # [M]
    starts: np.ndarray  # [E + 1] episode offsets
    policy_version: int
    steps: int = 0
    """Environment steps taken to collect them (including reset steps and unfinished episodes)."""
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)
    collect_s: float = 0.0

    @property
    def n_episodes(self) -> int:
        return len(self.starts) - 1


def merge_episode_batches(parts: list[EpisodeBatch]) -> EpisodeBatch:
    """Concatenate batches from several collectors (in the given order)."""
    offsets = np.cumsum([0] + [len(p.rewards) for p in parts])
    return EpisodeBatch(
        obs=np.concatenate([p.obs for p in parts]),
        actions=np.concatenate([p.actions for p in parts]),
        rewards=np.concatenate([p.rewards for p in parts]),
        starts=np.concatenate([[0]] + [p.starts[1:] + off for p, off in zip(parts, offsets)]),
        policy_version=parts[0].policy_version,
        steps=sum(p.steps for p in parts),
        episode_returns=[r for p in parts for r in p.episode_returns],
        episode_lengths=[n for p in parts for n in p.episode_lengths],
        collect_s=max(p.collect_s for p in parts),
    )


class EpisodeSource(Collector, Protocol):
    """A collector of whole episodes (REINFORCE's): this process's environments or remote workers."""

    def collect(self, n_episodes: int, policy_version: int) -> EpisodeBatch: ...


class EpisodeCollector(LocalCollection):
    """Runs a vector env with the current policy until a number of episodes have ended.

    Every call starts fresh episodes (a policy update between calls would otherwise leave
    half-finished episodes from an older policy); unfinished ones are dropped. Sampling
    noise comes from one stream per environment, keyed by seed and global env index.
    """

    def __init__(self, env: VecEnv, agent: Agent, seed: int, env_offset: int = 0, max_episode_steps: int = 10_000):
        self.env = env
        self.agent = agent
        self.seed = seed
        self.env_offset = env_offset
        self.max_episode_steps = max_episode_steps
        self.segment = 0
        self.calls = 0
        self.noise_rngs: list[np.random.Generator] = []
        self.obs_dtype = stored_layout(env.single_observation_space)[1]

    def reset(self, seed: int, segment: int = 0) -> None:
        """Restart the noise streams from ``(seed, env index, segment)``."""
        self.seed, self.segment, self.calls = seed, segment, 0
        self.noise_rngs = [np.random.default_rng([seed, self.env_offset + i, segment]) for i in range(self.env.n_envs)]

    def _noise(self) -> np.ndarray:
        return np.stack([self.agent.spec.draw_noise(rng, (NOISE_BLOCK,)) for rng in self.noise_rngs], axis=1)

    def collect(self, n_episodes: int, policy_version: int) -> EpisodeBatch:
        start = time.perf_counter()
        n = self.env.n_envs
        obs = self.env.reset(seed=self.seed + self.segment + 7919 * self.calls + self.env_offset).astype(self.obs_dtype)
        self.calls += 1
        current: list[list[tuple[np.ndarray, np.ndarray, float]]] = [[] for _ in range(n)]
        skipping = [False] * n  # an episode cut at max_episode_steps: ignore it until it really ends
        done: list[list[tuple[np.ndarray, np.ndarray, float]]] = []
        returns: list[float] = []
        lengths: list[int] = []
        steps, t = 0, 0
        noise = self._noise()
        recurrent = self.agent.recurrent
        state, starts = None, np.ones(n, dtype=bool)
        if recurrent:  # every episode begins from the initial state
            state = self.agent.initial_state(n)
        while len(done) < n_episodes:
            if t == NOISE_BLOCK:
                noise, t = self._noise(), 0
            action, _, _, state = self.agent.act_step(obs, noise[t], state, starts)
            step = self.env.step(self.agent.env_action(action))
            if recurrent:
                starts = ~step.valid
            t += 1
            steps += n
            ended = step.terminated | step.truncated
            returned = iter(zip(step.episode_returns.tolist(), step.episode_lengths.tolist()))
            for i in range(n):
                if not step.valid[i]:
                    continue
                if skipping[i]:
                    if ended[i]:
                        next(returned)
                        skipping[i] = False
                    continue
                current[i].append((obs[i], action[i], float(step.reward[i])))
                if ended[i] or len(current[i]) >= self.max_episode_steps:
                    if ended[i]:
                        r, length = next(returned)
                    else:
                        r, length = sum(x[2] for x in current[i]), len(current[i])
                        skipping[i] = True
                    if len(done) < n_episodes:
                        done.append(current[i])
                        returns.append(r)
                        lengths.append(length)
                    current[i] = []
            obs = step.obs.astype(self.obs_dtype)
        starts = np.cumsum([0] + [len(e) for e in done])
        flat = [x for episode in done for x in episode]
        return EpisodeBatch(
            obs=np.stack([x[0] for x in flat]),
            actions=np.stack([x[1] for x in flat]),
            rewards=np.array([x[2] for x in flat], dtype=np.float32),
            starts=starts,
            policy_version=policy_version,
            steps=steps,
            episode_returns=returns,
            episode_lengths=lengths,
            collect_s=time.perf_counter() - start,
        )
