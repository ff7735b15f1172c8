"""Rollouts of episodes that begin again at once: only transitions, and each truncation valued at its end."""

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.algos.ppo import PPOAlgo
from distrl.config import PPOConfig
from distrl.data.normalize import ObsNormalizer, RewardScaler
from distrl.data.rollout import RolloutCollector
from distrl.envs.vector import make_env
from distrl.nets import ActorCritic


@pytest.mark.parametrize("normalize", [False, True])
def test_a_rollout_of_restarted_episodes_holds_transitions_only_and_values_each_truncation_at_its_end(normalize):
    env = make_env("CartPole-v1", 2, "sync", {"max_episode_steps": 14})  # random play: some fall, some reach 14
    agent = ActorCritic(4, spaces.Discrete(2), (16, 16), seed=0)
    normalizer = ObsNormalizer.for_space(env.single_observation_space, normalize)
    if normalize:  # statistics far from the identity, so that a value of the raw observation would differ
        normalizer.stats.load({"mean": np.full(4, 0.3), "var": np.full(4, 4.0), "count": np.array(100.0)})
        normalizer.refresh()
    collector = RolloutCollector(env, agent, normalizer, RewardScaler(2, 0.9, False), 64, seed=3)
    seen = []
    step = env.step
    env.step = lambda actions: seen.append(s := step(actions)) or s  # what each step returned, final obs included
    collector.reset(3)
    rollout = collector.collect(0)
    assert collector.restarts and rollout.valid.all()  # no reset steps: 128 steps, 128 transitions
    cut, fell = rollout.truncated & ~rollout.terminated, rollout.terminated
    assert cut.sum() >= 2 and fell.sum() >= 2
    for t, n in zip(*np.nonzero(cut | fell)):
        final = normalizer(seen[t].obs[n][None])
        assert not np.array_equal(rollout.obs[t + 1, n], final[0])  # the next row is the next episode's first
        expected = float(agent.values(torch.from_numpy(final))[0]) if cut[t, n] else 0.0
        assert rollout.final_values[t, n] == pytest.approx(expected, abs=1e-6)
    # a truncated step's advantage is its one-step TD error to the final observation's value, however lambda
    cfg = PPOConfig(n_envs=2, n_steps=64, batch_size=128, gamma=0.9, gae_lambda=0.8)
    batch = PPOAlgo(cfg, agent, 0).prepare(rollout)
    values = agent.values(torch.from_numpy(rollout.obs[:64].reshape(128, 4))).numpy().reshape(64, 2)
    advantages = batch.advantages.numpy().reshape(64, 2)
    for t, n in zip(*np.nonzero(cut)):
        td = rollout.rewards[t, n] + 0.9 * rollout.final_values[t, n] - values[t, n]
        assert advantages[t, n] == pytest.approx(td, abs=1e-5)
    env.close()
