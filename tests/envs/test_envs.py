import gymnasium as gym
import numpy as np
import pytest

from distrl.config import ConfigError, RunConfig, parse_env_kwargs
from distrl.envs import names as env_names
from distrl.envs.names import (
    env_kwargs_items,
    env_source,
    portable_env_name,
    required_extra,
    resolve_env_id,
    wrapper_names,
)
from distrl.envs.vector import make_env, make_run_env, make_vector_env


def test_short_names_and_ids_resolve():
    assert resolve_env_id("cartpole") == "CartPole-v1"
    assert resolve_env_id("hopper") == "Hopper-v5"
    assert resolve_env_id("Pendulum-v1") == "Pendulum-v1"


def test_unknown_env_suggests_near_names():
    with pytest.raises(ConfigError, match="did you mean CartPole-v1"):
        resolve_env_id("CartPol-v1")


def test_custom_env_by_entry_point():
    env_id = resolve_env_id("distrl_testenvs:CountEnv")
    env = make_env(env_id, 2)
    assert env.reset(seed=0).shape == (2, 2)
    env.close()
    with pytest.raises(ConfigError, match="cannot import module"):
        resolve_env_id("no_such_module_xyz:Env")
    with pytest.raises(ConfigError, match="has no 'Nope'"):
        resolve_env_id("distrl_testenvs:Nope")


def test_missing_simulator_names_the_extra(monkeypatch):
    def fail(*args, **kwargs):
        raise gym.error.DependencyNotInstalled("No module named 'mujoco'")

    monkeypatch.setattr(gym, "make", fail)
    assert required_extra("Hopper-v5") == "mujoco"
    with pytest.raises(ConfigError, match=r"pip install 'distrl\[mujoco\]'"):
        make_vector_env("Hopper-v5", 1, "sync")


def test_native_vector_env_is_used_when_available():
    env = make_vector_env("CartPole-v1", 4, "auto")
    assert type(env).__name__ == "CartPoleVectorEnv"
    env.close()
    with pytest.raises(ConfigError, match="no vector entry point"):
        make_vector_env("Pendulum-v1", 2, "native")


@pytest.mark.parametrize("terminate", [False, True])
def test_autoreset_marks_reset_step_invalid_and_keeps_final_obs(terminate):
    env = make_env(resolve_env_id("distrl_testenvs:CountEnv"), 1, "sync")
    env.env.unwrapped  # noqa: B018 - make sure construction worked
    env.env.envs[0].unwrapped.terminate = terminate
    env.reset(seed=0)
    seen = []
    for _ in range(8):
        step = env.step(np.zeros(1, dtype=np.int64))
        seen.append(
            (
                step.obs[0].tolist(),
                bool(step.valid[0]),
                bool(step.terminated[0]),
                bool(step.truncated[0]),
                float(step.reward[0]),
                step.episode_returns.tolist(),
            )
        )
    # episode of 3 steps: obs 1, 2, 3 (3 is the true final obs), then the reset step returns [0, 1]
    assert seen[2][0] == [3.0, 0.0] and seen[2][2:4] == (terminate, not terminate) and seen[2][5] == [3.0]
    assert seen[3] == ([0.0, 1.0], False, False, False, 0.0, [])
    assert [s[1] for s in seen] == [True, True, True, False, True, True, True, False]
    env.close()


def test_native_cartpole_reset_step_is_invalid():
    env = make_env("CartPole-v1", 2, "native")
    env.reset(seed=0)
    ended_at = None
    for t in range(200):
        step = env.step(np.zeros(2, dtype=np.int64))
        if ended_at is not None:
            assert not step.valid[ended_at] and step.reward[ended_at] == 0.0
            break
        if (step.terminated | step.truncated).any():
            ended_at = int(np.flatnonzero(step.terminated | step.truncated)[0])
            assert step.episode_returns[0] == step.episode_lengths[0] == t + 1
    assert ended_at is not None
    env.close()


def test_async_vector_env_steps_in_subprocesses():
    env = make_env("CartPole-v1", 2, "async")
    assert type(env.env).__name__ == "AsyncVectorEnv"
    env.reset(seed=0)
    step = env.step(np.zeros(2, dtype=np.int64))
    assert step.obs.shape == (2, 4) and step.valid.all()
    env.close()


def test_box2d_env_through_its_extra():
    pytest.importorskip("Box2D")
    env = make_env("lunarlander", 2)
    assert env.env_id == "LunarLander-v3" and env.reset(seed=0).shape == (2, 8)
    env.close()


@pytest.mark.parametrize("env_id", ["Pendulum-v1", "Hopper-v5"])
def test_one_env_fast_path_steps_exactly_like_a_sync_vector_env(env_id):
    """A single env skips SyncVectorEnv, with the same next-step autoreset, seeding and episode accounting."""
    from gymnasium.vector import AutoresetMode

    from distrl.envs.vector import OneEnv, VecEnv

    if env_id.startswith("Hopper"):
        pytest.importorskip("mujoco")
    fast = make_env(env_id, 1)
    assert isinstance(fast.env, OneEnv)
    sync = VecEnv(
        gym.make_vec(
            env_id, num_envs=1, vectorization_mode="sync", vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}
        ),
        env_id,
    )
    assert np.array_equal(fast.reset(seed=3), sync.reset(seed=3))
    rng = np.random.default_rng(0)
    low, high = fast.single_action_space.low, fast.single_action_space.high
    ends = 0
    for t in range(1500):
        action = rng.uniform(low, high)[None].astype(np.float32)
        a, b = fast.step(action), sync.step(action)
        for name in ("obs", "reward", "terminated", "truncated", "valid", "episode_returns", "episode_lengths"):
            assert np.array_equal(getattr(a, name), getattr(b, name)), (t, name)
        ends += int(a.terminated[0] or a.truncated[0])
    assert ends >= 5  # episode ends and the reset steps after them were compared too
    fast.close()
    sync.close()


def _transitions(env, restart: bool, per_env: int) -> list[list[tuple]]:
    """Each env's first ``per_env`` transitions (observation, action, reward, final or next observation,
    terminated, truncated), acting by a rule of the episode and the step within it so that both layouts act
    alike whatever their reset steps."""
    n = env.n_envs
    obs = env.reset(seed=5)
    episode, t = np.zeros(n, dtype=int), np.zeros(n, dtype=int)
    out: list[list[tuple]] = [[] for _ in range(n)]
    while min(len(rows) for rows in out) < per_env:
        actions = np.where(episode % 3 == 2, 1, (t // (1 + episode % 3)) % 2).astype(np.int64)
        step = env.step(actions)
        if restart:
            assert step.valid.all()  # no reset steps
        ended = step.terminated | step.truncated
        for i in np.flatnonzero(step.valid):
            out[i].append((obs[i].copy(), int(actions[i]), float(step.reward[i]), step.obs[i].copy(),
                           bool(step.terminated[i]), bool(step.truncated[i])))  # fmt: skip
        episode[ended] += 1
        t = np.where(ended, 0, t + step.valid)
        obs = env.restart(ended) if restart and ended.any() else step.obs
    return [rows[:per_env] for rows in out]


@pytest.mark.parametrize("mode, n", [("one", 1), ("sync", 2), ("async", 2)])
def test_restart_begins_the_next_episode_at_once_with_the_same_transitions(mode, n):
    """Beginning each next episode at once spends no step on the reset: every step is a transition, and they
    are the transitions next-step autoreset gives, final observations and truncations included."""
    from distrl.envs.vector import OneEnv, VecEnv, make_single_env

    kwargs = {"max_episode_steps": 12}  # alternate pushes outlast 12 steps (truncated), pushing one way falls

    def build():
        if mode == "one":  # what a single env of an env without a native vector version gets
            return VecEnv(OneEnv(make_single_env("CartPole-v1", kwargs)), "CartPole-v1")
        return make_env("CartPole-v1", n, mode, kwargs)

    with_reset, restarted = build(), build()
    assert restarted.can_restart
    a, b = _transitions(with_reset, False, 60), _transitions(restarted, True, 60)
    for rows_a, rows_b in zip(a, b):
        for x, y in zip(rows_a, rows_b):
            assert all(np.array_equal(u, v) for u, v in zip(x, y))
    flags = [(row[4], row[5]) for rows in b for row in rows]
    assert (True, False) in flags and (False, True) in flags  # terminations and truncations both compared
    with_reset.close()
    restarted.close()


def test_envs_that_reset_on_the_next_step_only_cannot_restart():
    assert not make_env("CartPole-v1", 2).can_restart  # Gymnasium's own CartPole vector env


def test_env_kwargs_are_typed_and_bad_items_named():
    assert parse_env_kwargs(["continuous=true", "n=500", "lr=2.5e-4", "x=none", "name=fast", "flag=False"]) == {
        "continuous": True,
        "n": 500,
        "lr": 2.5e-4,
        "x": None,
        "name": "fast",
        "flag": False,
    }
    with pytest.raises(ConfigError, match="env_kwargs='continuous' is not allowed: must be key=value"):
        RunConfig(env_kwargs=("continuous",))
    with pytest.raises(ConfigError, match="given twice"):
        RunConfig(env_kwargs=("a=1", "a=2"))
    with pytest.raises(ConfigError, match="wrappers='nocolon' is not allowed"):
        RunConfig(wrappers=("nocolon",))
    with pytest.raises(ConfigError, match="policy='nets.cnn' is not allowed"):
        RunConfig(policy="nets.cnn")
    assert RunConfig(policy="mypkg.nets:build").policy == "mypkg.nets:build"


@pytest.mark.parametrize(
    "entry, kind",
    [
        ("os:system", "builtin_function_or_method"),
        ("distrl_testenvs:NOT_AN_ENV", "int"),
        ("distrl_testenvs:np", "module"),
    ],
)
def test_an_entry_point_that_is_not_an_env_is_refused_without_calling_it(entry, kind):
    with pytest.raises(
        ConfigError,
        match=f"is a {kind}, not an environment: an entry point must be a gymnasium.Env "
        "subclass or a function returning a gymnasium.Env",
    ):
        resolve_env_id(entry)


def test_a_class_that_is_no_env_and_a_factory_that_returns_none_are_config_errors():
    with pytest.raises(ConfigError, match="does not subclass gymnasium.Env"):
        resolve_env_id("distrl_testenvs:NotAnEnv")
    with pytest.raises(ConfigError, match="returned a NoneType, not a gymnasium.Env"):
        make_env("distrl_testenvs:returns_none", 1)


def test_factory_entry_point_takes_env_kwargs_and_is_portable():
    env = make_env("distrl_testenvs:make_count_env", 2, env_kwargs={"length": 2, "terminate": True})
    env.reset(seed=0)
    env.step(np.zeros(2, np.int64))
    step = env.step(np.zeros(2, np.int64))
    assert step.terminated.all() and step.episode_lengths.tolist() == [2, 2]
    env.close()
    assert portable_env_name("distrl_testenvs:make_count_env") == "distrl_testenvs:make_count_env"
    assert resolve_env_id("distrl_testenvs:make_count_env") == "custom/make_count_env-v0"


def test_unknown_env_kwarg_is_named():
    with pytest.raises(ConfigError, match="env_kwargs=lenght=2 is not accepted by"):
        make_env("distrl_testenvs:CountEnv", 1, env_kwargs={"lenght": 2})


def test_wrappers_apply_in_order_to_each_env():
    run = RunConfig(
        env="distrl_testenvs:CountEnv",
        env_kwargs=("length=2",),
        vec="sync",
        wrappers=("distrl_testenvs:double_reward", "distrl_testenvs:add_one_reward"),
    )
    env = make_run_env(run, 2)
    env.reset(seed=0)
    step = env.step(np.zeros(2, np.int64))
    assert step.reward.tolist() == [3.0, 3.0]  # (1 * 2) + 1, not (1 + 1) * 2
    assert env.step(np.zeros(2, np.int64)).episode_returns.tolist() == [6.0, 6.0]
    env.close()


@pytest.mark.parametrize(
    "wrapper, message",
    [
        ("distrl_testenvs:broken_wrapper", "returned a NoneType, not a gymnasium.Env"),
        ("distrl_testenvs:NOT_AN_ENV", "is a int: a wrapper must be a function"),
        ("distrl_testenvs:nope", "has no 'nope'"),
    ],
)
def test_a_wrapper_that_does_not_return_an_env_is_named(wrapper, message):
    with pytest.raises(ConfigError, match=f"wrappers.*{wrapper}.*{message}"):
        make_env("CartPole-v1", 1, wrappers=(wrapper,))


def test_async_envs_check_user_code_in_this_process_first():
    with pytest.raises(ConfigError, match="returned a NoneType"):
        make_env("CartPole-v1", 2, "async", wrappers=("distrl_testenvs:broken_wrapper",))


def test_native_vector_env_is_kept_when_it_takes_the_kwargs():
    env = make_vector_env("CartPole-v1", 2, "auto", {"sutton_barto_reward": True, "max_episode_steps": 20})
    assert type(env).__name__ == "CartPoleVectorEnv"
    env.close()
    env = make_vector_env("CartPole-v1", 2, "auto", {}, ("distrl_testenvs:double_reward",))
    assert type(env).__name__ == "SyncVectorEnv"
    env.close()
    with pytest.raises(
        ConfigError, match="vec='native' is not available for CartPole-v1: wrappers apply to single envs"
    ):
        make_vector_env("CartPole-v1", 2, "native", {}, ("distrl_testenvs:double_reward",))


def test_a_custom_id_from_an_old_run_asks_for_its_entry_point():
    with pytest.raises(ConfigError, match="name it, e.g. --env mypkg.envs:Gone"):
        resolve_env_id("custom/Gone-v0")


def test_env_instances_and_factories_from_the_api():
    assert env_source(gym.make("CartPole-v1")) == ("CartPole-v1", ())
    assert env_source(gym.make("CartPole-v1", sutton_barto_reward=True, max_episode_steps=50)) == (
        "CartPole-v1",
        ("sutton_barto_reward=true", "max_episode_steps=50"),
    )
    from distrl_testenvs import CountEnv, make_count_env

    assert env_source(make_count_env) == ("distrl_testenvs:make_count_env", ())
    assert env_source(CountEnv) == ("distrl_testenvs:CountEnv", ())
    name, _ = env_source(lambda: CountEnv(length=2))
    assert name.startswith("memory:")
    env = make_env(name, 3)
    assert env.reset(seed=0).shape == (3, 2)
    env.close()
    wrapped, _ = env_source(gym.wrappers.ClipReward(gym.make("CartPole-v1"), -0.5, 0.5))  # rebuilt from its spec
    env = make_env(wrapped, 2)
    env.reset(seed=0)
    assert env.step(np.zeros(2, np.int64)).reward.tolist() == [0.5, 0.5]
    env.close()
    with pytest.raises(ConfigError, match="env=3 is not allowed"):
        env_source(3)


def test_an_instance_without_spec_is_used_itself_and_only_alone():
    from distrl_testenvs import CountEnv

    instance = CountEnv(length=2)
    name, _ = env_source(instance)
    with pytest.raises(ConfigError, match="n_envs=2 is not allowed with an env instance that has no spec"):
        make_env(name, 2)
    env = make_env(name, 1)
    assert env.env.env is instance
    evaluation = make_env(name, 3)  # evaluation envs are copies
    assert evaluation.reset(seed=0).shape == (3, 2)
    env.close()
    evaluation.close()


def test_api_kwargs_and_wrappers_become_recordable_names():
    from distrl_testenvs import double_reward

    assert env_kwargs_items({"length": 2, "terminate": True}) == ("length=2", "terminate=true")
    with pytest.raises(ConfigError, match="cannot be recorded in config.json"):
        env_kwargs_items({"shape": (2, 2)})
    assert wrapper_names([double_reward, "distrl_testenvs:add_one_reward"]) == (
        "distrl_testenvs:double_reward",
        "distrl_testenvs:add_one_reward",
    )
    name = wrapper_names(lambda env: env)[0]
    assert name.startswith("memory:")
    env_names._OBJECTS.pop(name)  # as in a fresh process
    with pytest.raises(ConfigError, match="was a Python function given to the API"):
        make_env("CartPole-v1", 1, wrappers=(name,))


def test_ale_ids_without_ale_py_name_the_extra(monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "ale_py", None)  # import ale_py now fails
    with pytest.raises(ConfigError, match=r"ALE/\.\.\. ids need ale-py: pip install 'distrl\[atari\]'"):
        resolve_env_id("ALE/NotRegisteredHere-v5")
