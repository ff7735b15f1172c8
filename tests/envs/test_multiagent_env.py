import pickle
import sys

import numpy as np
import pytest
from gymnasium import spaces

from distrl.config import ConfigError
from distrl.envs.masks import MaskReader
from distrl.envs.multiagent import ParallelAgents
from distrl.envs.pettingzoo import is_parallel_env, make_parallel_env
from distrl.envs.vector import VecEnv

pytest.importorskip("pettingzoo")
from distrl_maenvs import ScoutAndTank  # noqa: E402  (a PettingZoo ParallelEnv)

SPREAD = ("mpe2.simple_spread_v3", {"N": 3, "max_cycles": 25, "continuous_actions": False})


def agents(name: str, n_copies: int = 1, global_state: bool = False, **kwargs) -> ParallelAgents:
    return ParallelAgents(make_parallel_env(f"distrl_maenvs:{name}", kwargs), n_copies, global_state)


def offset(seed: int) -> float:
    """The offset ScoutAndTank draws for its first game after reset(seed=seed)."""
    obs, _ = ScoutAndTank().reset(seed=seed)
    return float(obs["scout"][0])


def test_rows_are_copy_times_agents_plus_agent_with_padding_and_one_hot():
    env = agents("scout_and_tank", n_copies=2)
    space = env.single_observation_space
    assert env.num_envs == 4 and env.agents == ("scout", "tank")
    assert set(space.spaces) == {"observation", "agent", "action_mask"}
    assert space["observation"].shape == (5,) and env.single_action_space == spaces.Discrete(5)
    obs, _ = env.reset(seed=7)
    np.testing.assert_array_equal(obs["agent"], [[1, 0], [0, 1], [1, 0], [0, 1]])
    for c in range(2):
        scout, tank = obs["observation"][2 * c], obs["observation"][2 * c + 1]
        np.testing.assert_allclose(scout, [offset(7 + 2 * c)] * 3 + [0, 0])  # Box(3) padded to Box(5)
        np.testing.assert_allclose(tank, [offset(7 + 2 * c) + 0.1] * 5)
    assert offset(7) != offset(9)
    np.testing.assert_array_equal(obs["action_mask"], [[1, 1, 1, 0, 0], [1] * 5] * 2)
    assert space.contains({key: value[0] for key, value in obs.items()})


def test_same_seed_reproduces_and_another_differs():
    first = agents("scout_and_tank", n_copies=2).reset(seed=3)[0]["observation"]
    again = agents("scout_and_tank", n_copies=2).reset(seed=3)[0]["observation"]
    other = agents("scout_and_tank", n_copies=2).reset(seed=4)[0]["observation"]
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_dead_agent_sits_out_then_game_ends_and_next_step_resets():
    env = agents("scout_and_tank", scout_steps=2, game_steps=4)
    env.reset(seed=0)
    start = offset(0)
    act = np.array([2, 4])
    for _ in range(2):
        obs, reward, terminated, truncated, info = env.step(act)
        np.testing.assert_array_equal(info["active"], [True, True])
        np.testing.assert_array_equal(reward, [2.5, 5.0])
    np.testing.assert_array_equal(terminated, [True, False])  # the scout's last step: its final observation
    np.testing.assert_allclose(obs["observation"][0, :3], start + 2)
    obs, reward, terminated, truncated, info = env.step(np.array([4, 4]))  # row 0's action is not sent
    np.testing.assert_array_equal(info["active"], [False, True])
    np.testing.assert_array_equal(reward, [0.0, 5.0])
    assert not terminated.any() and not truncated.any() and not info["game_over"].any()
    np.testing.assert_allclose(obs["observation"][0, :3], start + 2)  # the scout keeps its last observation
    obs, reward, terminated, truncated, info = env.step(act)
    np.testing.assert_array_equal(truncated, [False, True])
    np.testing.assert_allclose(obs["observation"][1], start + 4.1)  # the tank's final observation
    # the game is counted on the first row that ended on this step: the tank's
    np.testing.assert_array_equal(info["game_over"], [False, True])
    assert info["game_return"][1] == 2 * 2.5 + 4 * 5.0 and info["game_length"][1] == 4
    assert info["agent_game_returns"] == [(0, {"scout": 5.0, "tank": 20.0})]
    obs, reward, terminated, truncated, info = env.step(act)  # the reset step
    np.testing.assert_array_equal(info["active"], [False, False])
    assert not reward.any() and not terminated.any() and not truncated.any() and not info["game_over"].any()
    new = obs["observation"][0, 0]
    assert new == np.floor(new) and new != start  # t = 0 of a new game
    obs, reward, *_ = env.step(act)
    np.testing.assert_allclose(obs["observation"][0, :3], new + 1)
    np.testing.assert_array_equal(reward, [2.5, 5.0])


def test_action_outside_an_agents_own_actions_is_refused():
    env = agents("scout_and_tank")
    env.reset(seed=0)
    with pytest.raises(ValueError, match="action 3 is not allowed for agent 'scout'"):
        env.step(np.array([3, 0]))


def test_late_agent_sits_out_until_it_joins():
    env = agents("scout_and_tank", late_tank=True)
    obs, _ = env.reset(seed=0)
    assert not obs["observation"][1].any()
    np.testing.assert_array_equal(obs["action_mask"][1], [1] * 5)
    obs, reward, _, _, info = env.step(np.array([0, 0]))
    np.testing.assert_array_equal(info["active"], [True, False])
    np.testing.assert_allclose(obs["observation"][1], offset(0) + 1.1)  # its first observation
    _, reward, _, _, info = env.step(np.array([0, 2]))
    np.testing.assert_array_equal(info["active"], [True, True])
    np.testing.assert_array_equal(reward, [0.5, 3.0])


def test_vecenv_marks_sitting_out_invalid_and_counts_one_episode_per_game_with_the_team_return():
    env = VecEnv(agents("scout_and_tank", n_copies=2, scout_steps=2, game_steps=4), "scout_and_tank")
    env.reset(seed=1)
    rng = np.random.default_rng(0)
    valid, team, episodes = [], np.zeros(2), []
    for _ in range(10):
        step = env.step(np.stack([rng.integers(0, 3), rng.integers(0, 5)] * 2))
        valid.append(step.valid)
        assert not step.reward[~step.valid].any()
        team += step.reward.reshape(2, 2).sum(1)
        if len(step.episode_returns):
            np.testing.assert_array_equal(step.episode_ends, [False, True, False, True])
            np.testing.assert_allclose(step.episode_returns, team)
            episodes += list(step.episode_lengths)
            team[:] = 0
    # per 5 steps: 2 steps of both, the scout out for 2, then the reset step
    cycle = [[True, True], [True, True], [False, True], [False, True], [False, False]]
    np.testing.assert_array_equal(np.array(valid), np.array([[*row, *row] for row in cycle * 2]))
    assert episodes == [4, 4, 4, 4]


def test_masks_merge_and_finished_boards_keep_a_legal_action():
    env = agents("masked_pair", n_copies=1, game_steps=2)
    assert env.single_action_space == spaces.Discrete(4)
    assert env.single_observation_space["action_mask"] == spaces.Box(0, 1, (4,), np.int8)
    obs, _ = env.reset()
    np.testing.assert_array_equal(obs["action_mask"], [[1, 0, 0, 0], [1, 0, 0, 0]])
    obs, *_ = env.step(np.array([0, 0]))
    np.testing.assert_array_equal(obs["action_mask"], [[0, 1, 0, 0], [0, 1, 0, 0]])
    obs, *_ = env.step(np.array([1, 1]))  # the env's masks are all 0: the game is over
    np.testing.assert_array_equal(obs["action_mask"], [[1, 1, 0, 0], [1, 1, 1, 1]])
    vec = VecEnv(agents("masked_pair", n_copies=1, game_steps=2), "masked_pair")
    reader = MaskReader(vec.single_observation_space, vec.single_action_space)
    reader.check(vec.reset())
    reader.check(vec.step(np.array([0, 0])).obs)
    reader.check(vec.step(np.array([1, 1])).obs)


def test_global_state_concatenates_observations_with_absent_agents_zero():
    env = agents("scout_and_tank", global_state=True)
    assert env.single_observation_space["state"].shape == (8,)
    obs, _ = env.reset(seed=0)
    expected = np.r_[[offset(0)] * 3, [offset(0) + 0.1] * 5]
    np.testing.assert_allclose(obs["state"], [expected, expected])
    env.step(np.array([0, 0]))
    env.step(np.array([0, 0]))
    obs, *_ = env.step(np.array([0, 0]))  # the scout is out: its part is zero
    np.testing.assert_allclose(obs["state"][0], np.r_[[0.0] * 3, [offset(0) + 3.1] * 5])


def test_simple_spread_rows_state_autoreset_and_episodes():
    simple_spread_v3 = pytest.importorskip("mpe2.simple_spread_v3")

    env = ParallelAgents(make_parallel_env(*SPREAD), 2, global_state=True)
    space = env.single_observation_space
    assert set(space.spaces) == {"observation", "agent", "state"}
    assert space["observation"].shape == (18,) and space["state"].shape == (54,)
    assert env.single_action_space == spaces.Discrete(5)
    obs, _ = env.reset(seed=5)
    for c in range(2):
        single = simple_spread_v3.parallel_env(**SPREAD[1])
        own, _ = single.reset(seed=5 + 3 * c)
        np.testing.assert_allclose(obs["observation"][3 * c : 3 * c + 3], [own[a] for a in single.possible_agents])
        np.testing.assert_allclose(obs["state"][3 * c : 3 * c + 3], [single.state()] * 3)
    assert not np.allclose(obs["observation"][:3], obs["observation"][3:])

    vec = VecEnv(env, "simple_spread")
    vec.reset(seed=5)
    rng = np.random.default_rng(0)
    team = np.zeros(2)
    for t in range(1, 27):
        step = vec.step(rng.integers(0, 5, 6))
        team += step.reward.reshape(2, 3).sum(1)
        if t < 25:
            assert step.valid.all() and not len(step.episode_returns)
        elif t == 25:
            assert step.truncated.all()
            np.testing.assert_array_equal(step.episode_ends, [True, False, False] * 2)
            np.testing.assert_allclose(step.episode_returns, team, rtol=1e-6)
            np.testing.assert_array_equal(step.episode_lengths, [25, 25])
        else:
            assert not step.valid.any() and not step.reward.any()
    vec.close()


@pytest.mark.filterwarnings("ignore:The old environment creation API:DeprecationWarning")
@pytest.mark.parametrize("name", ["classic/rps-v2", "pettingzoo.classic.rps_v2"])
def test_pettingzoo_registry_id_and_module_with_discrete_observations(name):
    env = ParallelAgents(make_parallel_env(name, {"max_cycles": 3}), 1)
    assert env.single_observation_space["observation"] == spaces.Discrete(4)
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(obs["observation"], [3, 3])  # nothing played yet
    obs, reward, *_ = env.step(np.array([0, 1]))  # rock against paper
    np.testing.assert_array_equal(obs["observation"], [1, 0])
    np.testing.assert_array_equal(reward, [-1.0, 1.0])


def test_is_parallel_env():
    assert is_parallel_env(ScoutAndTank())
    assert not is_parallel_env(object())


def test_env_functions_pickle_for_worker_processes():
    pytest.importorskip("mpe2")
    for name, kwargs in [SPREAD, ("classic/rps-v2", {}), ("distrl_maenvs:scout_and_tank", {"game_steps": 3})]:
        env = pickle.loads(pickle.dumps(make_parallel_env(name, kwargs)))()
        assert is_parallel_env(env)
    assert env.game_steps == 3


def test_errors_are_one_line_config_errors(monkeypatch):
    cases = [
        (lambda: agents("no_agents"), "no agents"),
        (lambda: agents("unequal_boxes"), r"scout: Box\(-1.0, 1.0, \(2,\), float32\), tank: Box\(-1.0, 1.0, \(3,\)"),
        (
            lambda: agents("cartpole"),
            "distrl_maenvs:cartpole built a TimeLimit, which is not allowed: it must be a PettingZoo ParallelEnv",
        ),
        (lambda: make_parallel_env("no_such_module_xyz.thing_v0", {}), "cannot import module 'no_such_module_xyz"),
        (lambda: make_parallel_env("distrl_maenvs:nope", {}), "has no function 'nope'"),
    ]
    for build, message in cases:
        with pytest.raises(ConfigError, match=message) as caught:
            build()
        assert "\n" not in str(caught.value)
    monkeypatch.setitem(sys.modules, "pettingzoo", None)
    with pytest.raises(ConfigError, match=r"pip install 'distrl\[pettingzoo\]'"):
        make_parallel_env(*SPREAD)
