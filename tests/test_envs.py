import gymnasium as gym
import numpy as np
import pytest

from distrl.config import ConfigError
from distrl.envs import make_env, make_vector_env, required_extra, resolve_env_id


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

    monkeypatch.setattr(gym, "make_vec", fail)
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
        seen.append((step.obs[0].tolist(), bool(step.valid[0]), bool(step.terminated[0]), bool(step.truncated[0]),
                     float(step.reward[0]), step.episode_returns.tolist()))
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

    from distrl.envs import OneEnv, VecEnv

    if env_id.startswith("Hopper"):
        pytest.importorskip("mujoco")
    fast = make_env(env_id, 1)
    assert isinstance(fast.env, OneEnv)
    sync = VecEnv(gym.make_vec(env_id, num_envs=1, vectorization_mode="sync",
                               vector_kwargs={"autoreset_mode": AutoresetMode.NEXT_STEP}), env_id)
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
