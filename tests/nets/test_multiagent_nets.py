"""Multi-agent networks beyond distrl's feed-forward ones: a user's module per group of agents, recurrent cores for
per-agent and grouped policies and for the centralised critic, and bf16 on them."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from distrl.algos.protocols import LocalSync  # noqa: E402
from distrl.cli import main  # noqa: E402
from distrl.config import PPOConfig, RunConfig  # noqa: E402
from distrl.envs.spaces import DictLayout  # noqa: E402
from distrl.nets.encoders import ActorCriticModule  # noqa: E402
from distrl.nets.multiagent import (  # noqa: E402
    STATE_KEY,
    ActorView,
    PolicyGroups,
    RecurrentPolicyGroups,
    RecurrentSplitActorCritic,
)
from distrl.nets.recurrent import RecurrentActorCritic, RecurrentAgent  # noqa: E402
from distrl.training import OnPolicyTrainer  # noqa: E402
from distrl_manets import CueEncoder, CueNet  # noqa: E402

FAST = ["--n-envs", "4", "--n-steps", "32", "--batch-size", "64", "--n-epochs", "4", "--eval-episodes", "8", "--quiet"]


def trainer(env="distrl_macoop:unlike", seed=3, core="none", precision="fp32", **run) -> OnPolicyTrainer:
    """A small PPO trainer on a cooperative task; ``run``: RunConfig fields (agent_policies, critic, policy...)."""
    config = RunConfig(env=env, seed=seed, quiet=True, precision=precision, **run)
    return OnPolicyTrainer(
        config, PPOConfig(n_envs=2, n_steps=12, batch_size=24, core=core, core_size=8, net_arch=(8,))
    )


def gradient_by_group(agent, loss: torch.Tensor) -> dict[int, list[float]]:
    """The size of d loss / d parameter of every parameter of each group's network (``members.G.*``)."""
    (grad,) = torch.autograd.grad(loss, [agent.params.param])
    sizes: dict[int, list[float]] = {}
    for name, view in agent.params.views(grad).items():
        if name.startswith("members."):
            sizes.setdefault(int(name.split(".")[1]), []).append(float(view.abs().sum()))
    return sizes


@pytest.mark.parametrize("user, core", [(CueEncoder, "none"), (CueNet, "none"), (CueEncoder, "gru")])
def test_each_agent_gets_its_own_instance_of_the_users_module_and_trains_it_on_its_rows_alone(user, core):
    policy = f"distrl_manets:{user.__name__}"
    first = trainer(agent_policies="per-agent", policy=policy, core=core)
    groups = first.agent.module
    assert isinstance(groups, RecurrentPolicyGroups if core != "none" else PolicyGroups) and len(groups.members) == 2
    for member in groups.members:  # an encoder gets distrl's heads (and core), a whole network is used as it is
        if user is CueEncoder:
            assert isinstance(member, RecurrentActorCritic if core != "none" else ActorCriticModule)
            assert isinstance(member.encoder, CueEncoder)
        else:
            assert isinstance(member, CueNet)
    weights = first.agent.params.state_dict()
    own = {name.split(".", 2)[2] for name in weights}
    assert all(not torch.equal(weights[f"members.0.{n}"], weights[f"members.1.{n}"]) for n in own)  # distinct
    # the groups' weights depend on the seed alone
    again, other = (
        trainer(agent_policies="per-agent", policy=policy, core=core),
        trainer(agent_policies="per-agent", policy=policy, core=core, seed=4),
    )
    assert torch.equal(again.agent.params.data, first.agent.params.data)
    assert not torch.equal(other.agent.params.data, first.agent.params.data)
    # an agent's rows (row = copy * 2 + agent) reach its network's parameters and none of the other's
    rollout = first.collector.collect(0)
    batch = first.algo.prepare(rollout)
    T, N = rollout.rewards.shape
    for agent in (0, 1):
        rows = torch.arange(T * N).reshape(T, N)[:, agent::2].reshape(-1)
        if core == "none":
            fwd = first.agent.forward_train(batch.obs[rows])
        else:  # the agent's whole sequences, in the order forward_sequences reads them
            sequences = batch.sequences.select(torch.arange(agent, N, 2))
            fwd = first.agent.forward_sequences(batch.obs[rows], sequences.initial_state, sequences.starts)
        terms = first.agent.dist_terms(fwd, batch.actions[rows])
        sizes = gradient_by_group(first.agent, terms.log_prob.sum() + fwd.values.sum())
        assert all(size > 0 for size in sizes[agent]) and all(size == 0 for size in sizes[1 - agent])
    for run in (first, again, other):
        run.close()


@pytest.mark.parametrize("policy", ["", "distrl_manets:CueEncoder"])
def test_with_a_core_the_centralised_critic_sees_the_state_and_the_actor_never_does(policy):
    run = trainer(critic="centralised", agent_policies="per-agent", policy=policy, core="gru")
    groups = run.agent.module
    assert isinstance(groups, RecurrentPolicyGroups)
    split = groups.members[0]
    assert isinstance(split, RecurrentSplitActorCritic)
    if policy:  # the user's encoder was built for the actor's parts, and is fed those alone
        assert isinstance(split.actor_encoder, ActorView) and isinstance(split.actor_encoder.encoder, CueEncoder)
        assert STATE_KEY not in split.actor_encoder.encoder.seen.spaces
    # a row's state is the actor core's followed by the critic core's
    assert [tuple(s.shape) for s in groups.initial_state(5)] == [(1, 5, 8), (1, 5, 8)]
    space = run.env.single_observation_space
    layout = DictLayout(space)
    rollout = run.collector.collect(0)
    T, N = 4, rollout.obs.shape[1]
    parts = layout.unpack_numpy(rollout.obs[:T].reshape(T * N, -1))

    def outputs(changed: str) -> tuple[torch.Tensor, torch.Tensor]:
        """Heads [T, N, H] and values [T, N] after changing part ``changed`` (or nothing) at step 1 alone."""
        new = {key: value.copy() for key, value in parts.items()}
        if changed:
            new[changed].reshape(T, N, -1)[1] += 0.5
        obs = torch.from_numpy(layout.pack(new).reshape(T, N, -1))
        with torch.no_grad():
            (head, value), _ = groups(obs, groups.initial_state(N), torch.zeros(T, N))
        return head, value

    head, value = outputs("")
    state_head, state_value = outputs(STATE_KEY)
    obs_head, obs_value = outputs("observation")
    assert torch.equal(state_head, head) and torch.equal(obs_value, value)  # the actor never reads the state
    assert torch.equal(state_value[0], value[0]) and torch.equal(obs_head[0], head[0])  # nothing leaks back in time
    for t in range(1, T):  # the critic remembers the state it saw, the actor the observation
        assert not torch.allclose(state_value[t], value[t]) and not torch.allclose(obs_head[t], head[t])
    run.close()


@pytest.mark.parametrize(
    "env, core, run",
    [
        ("distrl_macoop:unlike", "gru", dict(agent_policies="per-agent")),
        ("distrl_macoop:symmetric", "lstm", dict(agent_groups=("pair=agent_0,agent_1", "solo=agent_2"))),
        ("distrl_macoop:unlike", "lstm", dict(critic="centralised")),
        ("distrl_macoop:unlike", "gru", dict(critic="centralised", agent_policies="per-agent")),
        ("distrl_macoop:unlike", "gru", dict(critic="centralised", policy="distrl_manets:CueEncoder")),
    ],
    ids=["per-agent", "groups", "mappo", "per-agent-mappo", "mappo-user-encoder"],
)
def test_the_learner_replays_the_log_probs_and_values_acting_recorded(env, core, run):
    trainer_ = trainer(env, core=core, **run)
    agent = trainer_.agent
    assert isinstance(agent, RecurrentAgent)
    for iteration in range(2):  # the second fragment starts from the state the first one ended with
        rollout = trainer_.collector.collect(iteration)
        assert rollout.starts[1:].any()  # a game of 8 steps ends inside each fragment of 12
        batch = trainer_.algo.prepare(rollout)
        T, N = rollout.rewards.shape
        with torch.no_grad():
            fwd = agent.forward_sequences(batch.obs, batch.sequences.initial_state, batch.sequences.starts)
            log_prob = agent.dist_terms(fwd, batch.actions).log_prob
        np.testing.assert_allclose(log_prob.numpy(), rollout.log_probs.reshape(-1), rtol=0, atol=1e-5)
        np.testing.assert_allclose(fwd.values.numpy(), rollout.values[:T].reshape(-1), rtol=0, atol=1e-5)
    assert any(np.abs(s).sum() > 0 for s in rollout.initial_state.values())
    trainer_.close()


@pytest.mark.parametrize("critic", ["local", "centralised"])
def test_per_agent_recurrent_policies_train_under_bf16(critic):
    run = trainer(agent_policies="per-agent", critic=critic, core="lstm", precision="bf16")
    before = run.agent.params.data.clone()
    for iteration in range(3):
        rollout = run.collector.collect(iteration)
        assert all(part.dtype == np.float32 for part in rollout.initial_state.values())
        metrics = run.algo.update(run.algo.prepare(rollout), LocalSync())
        assert np.isfinite(metrics["losses/policy_loss"]) and np.isfinite(metrics["losses/value_loss"])
        assert metrics["losses/gradient_steps"] > 0
    assert torch.isfinite(run.agent.params.data).all() and not torch.equal(run.agent.params.data, before)
    run.close()


def test_per_agent_recurrent_policies_learn_the_cooperative_task(tmp_path):
    # guessing earns 10/3 of the best team return, 8 (as in test_multiagent.py's learning tests)
    run = tmp_path / "run"
    args = ["--agent-policies", "per-agent", "--core", "gru", "--core-size", "16", "--learning-rate", "3e-3"]
    code = main(["train", "ppo", "distrl_macoop:unlike", *args, *FAST, "--total-steps", "6000", "--run-dir", str(run)])
    assert code in (0, None)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval_mean_return"] >= 7.5 and summary["total_steps"] >= 6000


def test_groups_a_centralised_critic_a_users_encoder_and_a_core_train_together(tmp_path):
    run = tmp_path / "run"
    args = ["--agent-groups", "cue2=agent_0", "cue3=agent_1", "--critic", "centralised", "--core", "lstm"]
    args += ["--policy", "distrl_manets:CueEncoder", "--total-steps", "512", "--run-dir", str(run)]
    assert main(["train", "ppo", "distrl_macoop:unlike", *FAST, *args]) in (0, None)
    assert json.loads((run / "summary.json").read_text())["total_steps"] >= 512
