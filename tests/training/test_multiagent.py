"""Multi-agent training: shared, per-agent and grouped policies, the centralised critic, ddp against single."""

import json

import numpy as np
import pytest
import torch
from gymnasium import spaces

pytest.importorskip("pettingzoo")

from distributed import run_ranks  # noqa: E402
from distrl.cli import main  # noqa: E402
from distrl.config import ConfigError, PPOConfig, RunConfig  # noqa: E402
from distrl.envs.spaces import DictLayout  # noqa: E402
from distrl.nets.multiagent import PolicyGroups, SplitActorCritic, agent_setup, multiagent_module  # noqa: E402
from distrl.training import OnPolicyTrainer  # noqa: E402

FAST = ["--n-envs", "4", "--n-steps", "32", "--batch-size", "64", "--n-epochs", "4", "--eval-episodes", "8", "--quiet"]


def monitor(run):
    lines = (run / "monitor.csv").read_text().splitlines()
    return lines[1].split(","), np.array([[float(v) for v in line.split(",")] for line in lines[2:]])


@pytest.mark.parametrize(
    "env, extra",
    [
        ("distrl_macoop:symmetric", []),
        ("distrl_macoop:symmetric", ["--critic", "centralised"]),
        ("distrl_macoop:unlike", ["--agent-policies", "per-agent"]),
        ("distrl_macoop:unlike", ["--agent-groups", "cue2=agent_0", "cue3=agent_1"]),
    ],
    ids=["shared", "mappo", "per-agent", "groups"],
)
def test_cooperative_tasks_are_learned(tmp_path, env, extra):
    # guessing earns 8/3 (symmetric) or 10/3 (unlike) of the best team return, 8
    run = tmp_path / "run"
    assert main(["train", "ppo", env, *extra, *FAST, "--total-steps", "12000", "--run-dir", str(run)]) in (0, None)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval_mean_return"] >= 7.5
    # the evaluation counts games, not agents' rows: it ends once every copy played one (8-step games here)
    evaluated = summary["final_eval_episodes"]
    assert summary["final_eval_finished"] == evaluated and summary["final_eval_steps"] <= 2 * 9 * evaluated * 3
    header, rows = monitor(run)
    assert header == ["r", "l", "t", *(f"r_agent_{i}" for i in range(3 if "symmetric" in env else 2))]
    assert set(rows[:, 1]) == {8} and rows[:, 0].max() <= 8 + 1e-6  # one line per game, with the team's return
    np.testing.assert_allclose(rows[:, 3:].sum(1), rows[:, 0], atol=1e-4)  # the team's is the agents' sum
    # steps count agents' steps: 4 games of 2 or 3 agents
    assert summary["total_steps"] % (4 * 32 * (3 if "symmetric" in env else 2)) == 0


def test_a_group_trains_on_its_own_agents_rows_alone():
    space = spaces.Dict(
        {"observation": spaces.Box(0, 1, (3,), np.float32), "agent": spaces.Box(0, 1, (2,), np.float32)}
    )
    setup = agent_setup(("left", "right"), "per-agent", (), "local")
    module = multiagent_module(space, 3, (8,), "tanh", "auto", setup)
    assert isinstance(module, PolicyGroups) and len(module.members) == 2
    layout = DictLayout(space)
    obs = {"observation": np.random.default_rng(0).random((6, 3), dtype=np.float32), "agent": np.eye(2)[[0] * 6]}
    head, value = module(torch.from_numpy(layout.pack(obs)))
    (head.sum() + value.sum()).backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in module.members[0].parameters())
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in module.members[1].parameters())
    # a row goes to its agent's network: the same observation as the other agent gives that network's output
    obs["agent"] = np.eye(2)[[0, 1, 0, 1, 0, 1]]
    obs["observation"][:] = obs["observation"][0]
    head, _ = module(torch.from_numpy(layout.pack(obs)))
    assert torch.equal(head[0], head[2]) and not torch.allclose(head[0], head[1])


def test_the_centralised_critic_sees_the_state_and_the_actor_does_not():
    space = spaces.Dict(
        {
            "observation": spaces.Box(0, 1, (3,), np.float32),
            "agent": spaces.Box(0, 1, (2,), np.float32),
            "state": spaces.Box(0, 1, (6,), np.float32),
        }
    )
    module = multiagent_module(space, 4, (8,), "tanh", "auto", agent_setup(("a", "b"), "shared", (), "centralised"))
    assert isinstance(module, SplitActorCritic)
    layout, rng = DictLayout(space), np.random.default_rng(1)
    base = {"observation": rng.random((1, 3)), "agent": np.eye(2)[[0]], "state": rng.random((1, 6))}
    other_state = {**base, "state": rng.random((1, 6))}
    other_obs = {**base, "observation": rng.random((1, 3))}
    out = {k: module(torch.from_numpy(layout.pack(v))) for k, v in [("b", base), ("s", other_state), ("o", other_obs)]}
    assert torch.equal(out["b"][0], out["s"][0]) and not torch.equal(out["b"][1], out["s"][1])
    assert not torch.equal(out["b"][0], out["o"][0]) and torch.equal(out["b"][1], out["o"][1])


def whole_run(rank, world, cfg, policies, iterations):
    from distrl.strategies.ddp import DistributedSync

    run = RunConfig(
        env="distrl_macoop:unlike", total_steps=iterations * cfg.rollout_size * 2 * world, seed=3, quiet=True
    )
    run = run.replace(agent_policies=policies)
    trainer = OnPolicyTrainer(run, cfg, sync=DistributedSync(torch.device("cpu"), 30))
    trainer.broadcast_state()
    trainer.train()
    trainer.close()
    return trainer.agent.params.data.clone(), trainer.steps


@pytest.mark.multiprocess
@pytest.mark.parametrize("policies", ["shared", "per-agent"])
def test_ddp_of_two_ranks_equals_single_on_the_same_games(policies):
    cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=2, learning_rate=3e-3)
    (p0, steps), (p1, _) = run_ranks(whole_run, 2, cfg, policies, 3)
    single_cfg = PPOConfig(n_envs=4, n_steps=16, batch_size=64, n_epochs=2, learning_rate=3e-3)
    run = RunConfig(env="distrl_macoop:unlike", total_steps=steps, seed=3, quiet=True, agent_policies=policies)
    single = OnPolicyTrainer(run, single_cfg)
    single.train()
    single.close()
    assert single.steps == steps == 3 * 16 * 4 * 2  # 4 games of 2 agents
    assert torch.equal(p0, p1)
    torch.testing.assert_close(p0, single.agent.params.data, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "args, message",
    [
        (["ppo", "distrl_maenvs:no_agents"], "built an env with no agents"),
        (["ppo", "distrl_macoop:unlike", "--agent-groups", "x=agent_0,agent_7"], "names unknown agent 'agent_7'"),
        (["ppo", "distrl_macoop:unlike", "--agent-groups", "x=agent_0"], "leaves out agent 'agent_1'"),
        (["ppo", "CartPole-v1", "--agent-policies", "per-agent"], "agent_policies is not allowed for a single-agent"),
        (["dqn", "distrl_macoop:unlike"], "is a multi-agent env, which dqn does not train yet"),
        (["ppo", "distrl_macoop:unlike", "--wrappers", "distrl_testenvs:identity"], "multi-agent env, which is not"),
    ],
)
def test_bad_multiagent_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    code = main(["train", *args, "--total-steps", "256", "--quiet", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_the_centralised_critic_refuses_a_policy_that_returns_head_and_value_itself():
    # an encoder becomes the actor's (tests/nets/test_multiagent_nets.py); a whole network would read the state in its actor
    run = RunConfig(env="distrl_macoop:unlike", quiet=True, critic="centralised", policy="distrl_manets:CueNet")
    with pytest.raises(ConfigError, match="critic=centralised is not allowed with policy='distrl_manets:CueNet'"):
        OnPolicyTrainer(run, PPOConfig(n_envs=1, n_steps=8, batch_size=8))


def test_a_shared_recurrent_policy_trains_on_the_agents_rows(tmp_path):
    run = tmp_path / "run"
    args = ["--core", "gru", "--n-steps", "16", "--batch-size", "32", "--total-steps", "2000", "--run-dir", str(run)]
    main(["train", "ppo", "distrl_macoop:symmetric", *FAST, *args])
    config = json.loads((run / "config.json").read_text())
    assert config["run"]["agent_policies"] == "shared" and config["run"]["action_mask"] == "off"
    assert json.loads((run / "summary.json").read_text())["total_steps"] >= 2000


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy, workers", [("pipeline", 2), ("actor-learner", 2), ("decoupled", 3)])
@pytest.mark.heavy
def test_per_agent_policies_learn_under_every_strategy(tmp_path, strategy, workers):
    # workers build the same per-agent networks from the run (else the weights they receive would not fit)
    run = tmp_path / "run"
    args = ["--strategy", strategy, "--workers", str(workers), "--agent-policies", "per-agent", "--run-dir", str(run)]
    assert main(["train", "ppo", "distrl_macoop:unlike", *FAST, "--total-steps", "12000", *args]) in (0, None)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval_mean_return"] >= 7.5 and summary["total_steps"] >= 12000
    header, rows = monitor(run)  # each agent's returns travel from the workers with the team's
    assert header[3:] == ["r_agent_0", "r_agent_1"] and len(rows) >= 12000 // (8 + 1) // 2 // 2
    np.testing.assert_allclose(rows[:, 3:].sum(1), rows[:, 0], atol=1e-4)


def test_one_shared_policy_on_vector_observations_takes_the_closed_form_networks():
    from distrl.nets import ActorCritic

    cfg = PPOConfig(n_envs=2, n_steps=8, batch_size=16)
    shared = OnPolicyTrainer(RunConfig(env="distrl_macoop:symmetric", quiet=True), cfg)
    # the agent's cue (3) and its one-hot index (3) side by side, as one float vector per row
    assert isinstance(shared.agent, ActorCritic) and shared.env.single_observation_space.shape == (6,)
    shared.close()
    mappo = OnPolicyTrainer(RunConfig(env="distrl_macoop:symmetric", quiet=True, critic="centralised"), cfg)
    assert not isinstance(mappo.agent, ActorCritic) and "state" in mappo.env.single_observation_space.spaces
    mappo.close()


# ---- APPO and IMPALA (V-trace) on multi-agent envs ----

VTRACE = ["--n-envs", "4", "--n-steps", "32", "--batch-size", "128", "--eval-episodes", "8", "--quiet"]
"""Their own defaults (one epoch, lr 1e-4 for APPO, 5e-4 for IMPALA) but small batches: each learned the unlike task
to 8.0 by 30,000 steps for every seed tried (0-4 in single, 0-5 in APPO's pipeline), and at 20,000 not for all."""


@pytest.mark.parametrize(
    "algo, strategy",
    [
        ("appo", ["--strategy", "single"]),
        ("impala", ["--strategy", "single"]),
        pytest.param("appo", ["--strategy", "pipeline", "--workers", "2"], marks=pytest.mark.multiprocess),
    ],
    ids=["appo-single", "impala-single", "appo-pipeline"],
)
@pytest.mark.heavy
def test_vtrace_algorithms_learn_the_unlike_task_with_per_agent_policies(tmp_path, algo, strategy):
    # guessing earns 10/3 of the best team return, 8
    run = tmp_path / "run"
    args = ["--agent-policies", "per-agent", *VTRACE, "--total-steps", "30000", *strategy, "--run-dir", str(run)]
    assert main(["train", algo, "distrl_macoop:unlike", *args]) in (0, None)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == strategy[1] and summary["total_steps"] >= 30000
    assert summary["final_eval_mean_return"] >= 7.5
    header, rows = monitor(run)
    assert header[3:] == ["r_agent_0", "r_agent_1"]
    np.testing.assert_allclose(rows[:, 3:].sum(1), rows[:, 0], atol=1e-4)
