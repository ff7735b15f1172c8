"""Recurrent policies: the sequence gradient against plain autograd, state restarts at episode boundaries,
a memory task, CartPole without velocities, and the API's state-carrying predict."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl import PPO, REINFORCE
from distrl.algos.appo import APPOAlgo
from distrl.algos.estimators import vtrace
from distrl.algos.ppo import PPOAlgo
from distrl.algos.protocols import LocalSync
from distrl.config import APPOConfig, ConfigError, PPOConfig
from distrl.data.normalize import ObsNormalizer, RewardScaler
from distrl.data.rollout import RolloutCollector, Sequences
from distrl.envs.vector import make_env
from distrl.nets import make_agent
from distrl.nets.recurrent import RecurrentAgent, RecurrentCore, sequence_minibatch_rows

CUE = "distrl_memoryenvs:CueEnv"
OBS, ACT = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2)


def lstm_agent(core="lstm", seed=0, size=8) -> RecurrentAgent:
    cfg = PPOConfig(core=core, core_size=size, net_arch=(8,), n_envs=2, n_steps=4, batch_size=4)
    agent = make_agent(OBS, ACT, cfg, "cpu", seed)
    assert isinstance(agent, RecurrentAgent)
    return agent


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_the_core_in_segments_equals_a_step_by_step_loop_that_restarts_at_episode_starts(kind):
    torch.manual_seed(0)
    core = RecurrentCore(kind, 5, 7)
    T, B = 9, 3
    x = torch.randn(T, B, 5)
    starts = torch.zeros(T, B)
    starts[0, 1] = starts[3, 0] = starts[3, 2] = starts[6, 1] = 1.0
    state = tuple(torch.randn(1, B, 7) for _ in range(2 if kind == "lstm" else 1))
    out, last = core(x, state, starts)
    cell = core.rnn
    h = [s.clone() for s in state]
    for t in range(T):  # the plain loop: zero where an episode starts, then one step
        h = [s * (1 - starts[t]).view(1, B, 1) for s in h]
        step, new = cell(x[t : t + 1], tuple(h) if kind == "lstm" else h[0])
        h = list(new) if kind == "lstm" else [new]
        torch.testing.assert_close(out[t], step[0], rtol=0, atol=1e-6)
    for a, b in zip(last, h):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


def _plain_loss(
    agent: RecurrentAgent,
    params: torch.Tensor,
    obs,
    state,
    starts,
    actions,
    old_log_prob,
    advantages,
    returns,
    valid,
    cfg: PPOConfig,
    clip: float,
) -> torch.Tensor:
    """PPO's loss written directly with autograd: the module called one step at a time from its state."""
    views = agent._views(params)
    T, B = starts.shape
    heads, values = [], []
    for t in range(T):
        state = tuple(s * (1 - starts[t]).view(1, B, 1) for s in state)
        (head, value), state = torch.func.functional_call(
            agent.module, {n: views[n] for n in agent.names}, (obs[t : t + 1], state, torch.zeros(1, B))
        )
        heads.append(head[0])
        values.append(value[0])
    dist = torch.distributions.Categorical(logits=torch.stack(heads).reshape(T * B, -1))
    log_prob = dist.log_prob(actions)
    ratio = (log_prob - old_log_prob).exp()
    policy = -torch.minimum(ratio * advantages, ratio.clamp(1 - clip, 1 + clip) * advantages)
    value_loss = (torch.stack(values).reshape(-1) - returns).square()
    per_sample = policy + cfg.vf_coef * value_loss - cfg.ent_coef * dist.entropy()
    return (per_sample * valid).sum()


def test_the_sequence_gradient_equals_autograd_on_the_plain_loss():
    agent = lstm_agent()
    cfg = PPOConfig(core="lstm", core_size=8, n_envs=3, n_steps=6, batch_size=18, ent_coef=0.01, clip_range=0.2)
    algo = PPOAlgo(cfg, agent, seed=0)
    T, N = 6, 3
    gen = torch.Generator().manual_seed(1)
    obs = torch.randn(T, N, 3, generator=gen)
    starts = torch.zeros(T, N)
    starts[2, 0] = starts[4, 2] = 1.0
    state = tuple(torch.randn(1, N, 8, generator=gen) * 0.5 for _ in range(2))
    actions = torch.randint(0, 2, (T * N,), generator=gen)
    old_log_prob = torch.log(torch.full((T * N,), 0.5)) + 0.1 * torch.randn(T * N, generator=gen)
    advantages = torch.randn(T * N, generator=gen)
    returns = torch.randn(T * N, generator=gen)
    valid = torch.ones(T * N)
    valid[7] = 0.0  # a reset step: no weight
    from distrl.data.packed import Minibatch

    envs = torch.tensor([2, 0, 1])  # a minibatch's sequences, in shuffled order
    rows = sequence_minibatch_rows(T, N, envs)
    mb = Minibatch(
        obs.reshape(T * N, 3)[rows],
        actions[rows],
        old_log_prob[rows],
        torch.zeros(T * N),
        advantages[rows],
        returns[rows],
        valid[rows],
        rows,
    )
    algo._minibatch_gradient(mb, 0.2, Sequences(starts, state).select(envs))
    ours = agent.params.grad.clone()

    params = agent.params.data.clone().requires_grad_(True)
    loss = _plain_loss(
        agent,
        params,
        obs[:, envs],
        tuple(s[:, envs] for s in state),
        starts[:, envs],
        mb.actions,
        mb.old_log_prob,
        mb.advantages,
        mb.returns,
        mb.valid,
        cfg,
        0.2,
    )
    (expected,) = torch.autograd.grad(loss, [params])
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)
    assert expected.abs().sum() > 0


def test_reinforce_runs_each_episode_as_one_sequence_from_the_initial_state():
    agent = lstm_agent()
    gen = torch.Generator().manual_seed(2)
    offsets = np.array([0, 3, 8, 10])  # episodes of 3, 5 and 2 steps, concatenated
    obs = torch.randn(10, 3, generator=gen)
    fwd = agent.forward_episodes(obs, offsets)
    for a, b in zip(offsets[:-1], offsets[1:]):  # each episode alone, step by step, from zeros
        state = agent.initial_state(1)
        for t in range(a, b):
            _, _, value, state = agent.act_state(obs[t : t + 1].numpy(), None, state, np.array([t == a]))
            np.testing.assert_allclose(fwd.values[t].item(), value[0], rtol=0, atol=1e-6)
    # the gradient reaches through the sequences: d(sum of values)/d(params) equals autograd's on the loop
    agent.backward(
        fwd,
        agent.dist_terms(fwd, torch.zeros(10, dtype=torch.long)),
        torch.zeros(10, dtype=torch.long),
        torch.zeros(10),
        None,
        torch.ones(10),
    )
    params = agent.params.data.clone().requires_grad_(True)
    views = agent._views(params)
    total = 0.0
    for a, b in zip(offsets[:-1], offsets[1:]):
        (head, values), _ = torch.func.functional_call(
            agent.module,
            {n: views[n] for n in agent.names},
            (obs[a:b, None], agent.initial_state(1), torch.zeros(b - a, 1)),
        )
        total = total + values.sum()
    (expected,) = torch.autograd.grad(total, [params])
    torch.testing.assert_close(agent.params.grad, expected, rtol=1e-5, atol=1e-6)


def _collect(agent, n_envs=2, T=14, seed=0):
    env = make_env(CUE, n_envs, vec="sync")
    collector = RolloutCollector(
        env,
        agent,
        ObsNormalizer.for_space(env.single_observation_space, False, 10.0),
        RewardScaler(n_envs, 0.99, False),
        T,
        seed,
    )
    collector.reset(seed)
    rollout = collector.collect(0)
    return collector, rollout


def test_state_restarts_where_an_episode_starts_and_training_replays_what_acting_saw():
    agent = lstm_agent()
    collector, first = _collect(agent)
    second = collector.collect(1)  # begins from the state the first fragment ended with
    for rollout in (first, second):
        T, N = rollout.rewards.shape
        assert rollout.starts is not None and rollout.starts[1:].any()  # episodes of 4 steps (+ reset steps)
        # 1. at every start the recorded value is the value from a fresh state: nothing leaked from the last episode
        fresh = agent.initial_state(1)
        for t, n in zip(*np.nonzero(rollout.starts)):
            value = agent.value_state(rollout.obs[t, n][None], fresh, np.array([True]))
            np.testing.assert_allclose(rollout.values[t, n], value[0], rtol=0, atol=1e-6)
        # 2. replaying the fragment from its recorded initial state gives the values and log-probs acting recorded
        batch = PPOAlgo(
            PPOConfig(core="lstm", core_size=8, net_arch=(8,), n_envs=N, n_steps=T, batch_size=T * N), agent, 0
        ).prepare(rollout)
        with torch.no_grad():
            fwd = agent.forward_sequences(batch.obs, batch.sequences.initial_state, batch.sequences.starts)
            log_prob = agent.dist_terms(fwd, batch.actions).log_prob
        np.testing.assert_allclose(fwd.values.numpy(), rollout.values[:T].reshape(-1), rtol=0, atol=1e-5)
        np.testing.assert_allclose(log_prob.numpy(), rollout.log_probs.reshape(-1), rtol=0, atol=1e-5)
    # 3. lagged data (pipeline) has no recorded values: the learner's pass over the sequences gives them
    lagged = PPOAlgo(PPOConfig(core="lstm", core_size=8, net_arch=(8,), n_envs=2, n_steps=14, batch_size=28), agent, 0)
    recorded = lagged.prepare(second).values
    second.values = None
    torch.testing.assert_close(lagged.prepare(second).values, recorded, rtol=0, atol=1e-5)
    # 4. the second fragment's recorded initial state is where the first one's acting left off, not zeros
    assert any(np.abs(s).sum() > 0 for s in second.initial_state.values())


def test_appo_replays_recurrent_fragments_from_their_initial_state_for_its_vtrace_targets():
    agent = lstm_agent()
    _, rollout = _collect(agent)
    T, N = rollout.rewards.shape
    sizes = dict(core="lstm", core_size=8, net_arch=(8,), n_envs=N, n_steps=T, batch_size=T * N, gae_lambda=1.0)
    # the behaviour is the policy: V-trace's targets are GAE's, on the values acting recorded
    on_policy = APPOAlgo(APPOConfig(**sizes), agent, 0).prepare(rollout)
    gae_batch = PPOAlgo(PPOConfig(**sizes), agent, 0).prepare(rollout)
    torch.testing.assert_close(on_policy.returns, gae_batch.returns, rtol=0, atol=1e-5)
    torch.testing.assert_close(on_policy.advantages, gae_batch.advantages, rtol=0, atol=1e-5)
    # the learner moved on: pi and the values come from replaying the sequences with its weights
    agent.params.data.add_(0.1 * torch.randn_like(agent.params.data))
    agent.refresh_acting_copy()
    lagged = APPOAlgo(APPOConfig(**sizes), agent, 0).prepare(rollout)
    assert torch.equal(lagged.log_probs, torch.from_numpy(rollout.log_probs.reshape(-1)))
    starts = torch.from_numpy(rollout.starts.astype(np.float32))
    initial = lagged.sequences.initial_state
    with torch.no_grad():
        fwd = agent.forward_sequences(lagged.obs, initial, starts[:T])
        pi = agent.dist_terms(fwd, lagged.actions).log_prob.numpy().reshape(T, N)
        values = agent.sequence_values(torch.from_numpy(rollout.obs), initial, starts).numpy()
    expected = vtrace(
        pi - rollout.log_probs,
        rollout.rewards,
        values,
        rollout.terminated,
        rollout.truncated,
        rollout.valid,
        0.99,
    )
    assert np.abs(pi - rollout.log_probs).max() > 1e-3  # the correction has something to correct
    np.testing.assert_allclose(lagged.returns.numpy(), expected.vs.reshape(-1), rtol=0, atol=1e-5)
    np.testing.assert_allclose(lagged.advantages.numpy(), expected.pg_advantages.reshape(-1), rtol=0, atol=1e-5)


def test_a_leaking_state_would_be_caught():
    # without the restarts, the value at an episode's first observation depends on the episode before
    agent = lstm_agent()
    _, rollout = _collect(agent)
    T, N = rollout.rewards.shape
    t, n = next((t, n) for t, n in zip(*np.nonzero(rollout.starts)) if t > 0)
    carried = agent.initial_state(N)
    for k in range(t):  # run up to t without any restart
        _, _, _, carried = agent.act_state(rollout.obs[k], None, carried, np.zeros(N, dtype=bool))
    leaked = agent.value_state(rollout.obs[t], carried, np.zeros(N, dtype=bool))[n]
    assert abs(leaked - rollout.values[t, n]) > 1e-4


@pytest.mark.slow  # learning
@pytest.mark.parametrize("algo, core", [("ppo", "lstm"), ("ppo", "gru"), ("reinforce", "lstm")])
def test_a_memory_task_is_solved_with_a_core_and_not_without(algo, core):
    if algo == "ppo":
        model, budget = PPO, 8192
        settings = dict(n_envs=8, n_steps=32, batch_size=128, n_epochs=4, ent_coef=0.01)
    else:
        model, budget = REINFORCE, 30_000
        settings = dict(n_envs=8, episodes_per_iter=32)
    settings.update(core_size=32, learning_rate=3e-3, seed=0, net_arch=(32,), env_kwargs={"length": 6})
    memory = model(CUE, core=core, **settings).learn(budget)
    feed_forward = model(CUE, **settings).learn(budget)
    remembered, _ = memory.evaluate(50)
    guessed, _ = feed_forward.evaluate(50)
    assert remembered >= 0.9  # +1 each episode when the cue is remembered
    assert guessed <= 0.5  # chance: 0 expected
    memory.close()
    feed_forward.close()


def test_predict_takes_and_returns_the_state():
    model = PPO(CUE, core="lstm", core_size=8, n_envs=2, n_steps=8, batch_size=8, seed=0)
    obs = np.array([[1.0, 1.0, 0.0], [-1.0, 1.0, 0.0]], np.float32)
    actions, state = model.predict(obs)
    assert actions.shape == (2,) and [s.shape for s in state] == [(1, 2, 8), (1, 2, 8)]
    later = np.array([[0.0, 0.0, 1.0], [0.0, 0.0, 1.0]], np.float32)
    _, carried = model.predict(later, state=state, episode_start=[False, False])
    _, restarted = model.predict(later, state=state, episode_start=[True, True])
    _, fresh = model.predict(later)
    np.testing.assert_allclose(restarted[0], fresh[0], atol=1e-6)  # a start discards the state passed in
    assert not np.allclose(carried[0], fresh[0])  # otherwise the state is carried
    single, one_state = model.predict(obs[0])
    assert np.ndim(single) == 0 and one_state[0].shape == (1, 1, 8)
    model.close()


def test_what_a_recurrent_run_refuses():
    with pytest.raises(
        ConfigError, match="batch_size=16 is not allowed: must be a multiple of n_steps = 32 with core='lstm'"
    ):
        PPOConfig(core="lstm", n_envs=8, n_steps=32, batch_size=16)
    with pytest.raises(ConfigError, match="core='lstm' is not allowed with policy=.*returns \\(head, value\\) itself"):
        PPO("CartPole-v1", core="lstm", policy="distrl_spaceenvs:tiny_net", n_envs=2, n_steps=8, batch_size=8)


@pytest.mark.slow
def test_cartpole_without_velocities_needs_memory():
    # RL Zoo's CartPoleNoVel-v1 settings for RecurrentPPO (hyperparams/ppo_lstm.yml), one LSTM for both heads
    settings = dict(
        wrappers=["distrl_memoryenvs:hide_velocity"],
        core_size=64,
        n_envs=8,
        n_steps=32,
        batch_size=256,
        n_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=1e-3,
        lr_schedule="linear",
        clip_range=0.2,
        clip_schedule="linear",
        net_arch=(64,),
        activation="relu",
        ortho_init=False,
        normalize_obs=True,
        normalize_reward=True,
        seed=0,
        eval_every=10_000,
        eval_episodes=10,
        target_return=475.0,
    )
    memory = PPO("CartPole-v1", core="lstm", **settings).learn(100_000)
    reached = memory._trainer.last_eval[0]
    steps = memory.num_steps
    memory.close()
    assert reached >= 475, (reached, steps)
    feed_forward = PPO("CartPole-v1", **settings).learn(100_000)
    assert feed_forward._trainer.last_eval[0] < 200  # the same budget without memory stays far below
    feed_forward.close()


def test_a_recurrent_policy_under_bf16_keeps_its_state_in_float32():
    cfg = PPOConfig(core="lstm", core_size=8, net_arch=(8,), n_envs=2, n_steps=6, batch_size=12)
    agent = make_agent(OBS, ACT, cfg, "cpu", 0, precision="bf16")
    collector, rollout = _collect(agent, T=6)
    assert all(part.dtype == np.float32 for part in rollout.initial_state.values())
    assert all(s.dtype == torch.float32 for s in collector._state)
    algo = PPOAlgo(cfg, agent, 0)
    metrics = algo.update(algo.prepare(rollout), LocalSync())
    assert np.isfinite(metrics["losses/policy_loss"]) and metrics["losses/gradient_steps"] > 0
