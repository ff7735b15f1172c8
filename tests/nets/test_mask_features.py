"""What the network of a masked run sees: a mask distrl moved into the observation masks the logits and is no
feature, so the network is the one the env's own observation gets (see distrl.envs.masks)."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl.config import DQNConfig, PPOConfig
from distrl.envs.masks import MaskInObservation
from distrl.envs.spaces import DictLayout
from distrl.nets import ActorCritic, ModuleAgent, make_agent
from distrl.nets.factory import make_q_network
from distrl.nets.q import QMLP
from distrl_maskenvs import NearestFreeCellEnv, PickBestEnv, observation_env

SEED = 5


def packed(space: gym.spaces.Dict, observation: np.ndarray, mask: np.ndarray) -> torch.Tensor:
    """Stored rows [B, nbytes] of observations [B, ...] with masks [B, n]."""
    return torch.from_numpy(DictLayout(space).pack({"observation": observation, "action_mask": mask}))


def random_masks(rng: np.random.Generator, rows: int, n: int) -> np.ndarray:
    mask = (rng.random((rows, n)) < 0.5).astype(np.int8)
    mask[np.arange(rows), rng.integers(n, size=rows)] = 1
    return mask


@pytest.mark.parametrize("env, source", [(PickBestEnv(), "info"), (NearestFreeCellEnv(), "method")])
def test_a_moved_mask_leaves_the_network_of_the_envs_own_observation_as_it_starts(env, source):
    # the module path's MLP starts from the closed-form MLP's weights: the network a Box observation gets, whose
    # first layers read the env's observation alone, not its observation and the mask side by side
    space = MaskInObservation(env, source).observation_space
    agent = make_agent(space, env.action_space, PPOConfig(), "cpu", SEED, action_mask=source)
    plain = ActorCritic(env.observation_space.shape[0], env.action_space, (64, 64), seed=SEED)
    assert isinstance(agent, ModuleAgent)
    got = agent.params.state_dict()
    expected = plain.params.state_dict()
    assert len(got) == len(expected) == 12
    for name, value in expected.items():
        trunk, layer, kind = name.split(".")
        mine = got[f"{trunk}.layers.{layer}.{kind}"]
        torch.testing.assert_close(mine.t() if kind == "weight" else mine, value, rtol=0, atol=0, msg=name)


def test_a_moved_mask_changes_the_illegal_logits_alone():
    env = PickBestEnv()
    space = MaskInObservation(env, "info").observation_space
    agent = make_agent(space, env.action_space, PPOConfig(), "cpu", SEED, action_mask="info")
    with torch.no_grad():  # weights away from their start, so that the outputs depend on every input
        agent.params.data.add_(0.3 * torch.randn(agent.params.data.shape, generator=torch.Generator().manual_seed(0)))
    rng = np.random.default_rng(0)
    observation = rng.random((64, 8)).astype(np.float32)
    one, other = random_masks(rng, 64, 8), random_masks(rng, 64, 8)

    def outputs(mask: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        rows = packed(space, observation, mask)
        return agent.forward_train(rows).head.detach(), agent.values(rows)

    (head_one, values_one), (head_other, values_other) = outputs(one), outputs(other)
    both = torch.from_numpy((one == 1) & (other == 1))
    assert both.sum() > 100 and (one != other).any()
    torch.testing.assert_close(head_one[both], head_other[both], rtol=0, atol=0)
    torch.testing.assert_close(values_one, values_other, rtol=0, atol=0)
    assert (head_one[torch.from_numpy(one == 0)] == -1e9).all()


def test_dqns_q_network_reads_the_envs_own_observation_alone_too():
    env = PickBestEnv()
    space = MaskInObservation(env, "info").observation_space
    q = make_q_network(space, env.action_space, DQNConfig(), "cpu", SEED, action_mask="info")
    plain = QMLP(8, 8, DQNConfig().net_arch, DQNConfig().activation, "cpu", SEED, DQNConfig().dueling)
    assert q.params.data.numel() == plain.params.data.numel()  # no weight for a mask entry
    rng = np.random.default_rng(1)
    observation = rng.random((32, 8)).astype(np.float32)
    one, other = random_masks(rng, 32, 8), random_masks(rng, 32, 8)
    both = torch.from_numpy((one == 1) & (other == 1))
    with torch.no_grad():
        q_one = q.values(packed(space, observation, one))
        q_other = q.values(packed(space, observation, other))
    torch.testing.assert_close(q_one[both], q_other[both], rtol=0, atol=0)


@pytest.mark.parametrize("mode", ["observation", "off"])
def test_a_mask_that_is_part_of_the_envs_own_observation_stays_a_feature(mode):
    # the env's own Dict observation holds the mask: the network reads it as the env gives it, masked or not
    env = observation_env(n=6)
    agent = make_agent(env.observation_space, env.action_space, PPOConfig(), "cpu", SEED, action_mask=mode)
    assert agent.params.view("policy.layers.0.weight").shape == (64, 12)


@pytest.mark.slow
def test_ppo_at_sb3s_defaults_learns_to_pick_the_best_legal_option():
    # 40k steps at stable-baselines3's default settings, greedy over 100 episodes: 9.00 (MaskablePPO: 9.10), where
    # the network reading the mask beside the observation reached 8.75 (benchmarks/masks_vs_maskable.py)
    from distrl import PPO

    model = PPO("distrl_maskenvs:PickBestEnv", seed=0).learn(40_000)
    env, returns = PickBestEnv(), []
    for episode in range(100):
        obs, info = env.reset(seed=10_000 + episode)
        total, done = 0.0, False
        while not done:
            action, _ = model.predict(obs, action_mask=info["action_mask"])
            obs, reward, terminated, truncated, info = env.step(action)
            total, done = total + reward, terminated or truncated
        returns.append(total)
    assert np.mean(returns) >= 8.9


def test_a_masked_run_saved_while_the_mask_was_an_input_still_loads_and_acts_as_saved(tmp_path):
    """A checkpoint without ``mask_input`` was saved while a moved mask was also a network input: it loads with
    that network (its first layer reads the mask too) and predicts what it predicted when saved."""
    import json

    from distrl import PPO

    old = PPO("distrl_maskenvs:PickBestEnv", mask_input=True, n_envs=2, n_steps=16, batch_size=32, seed=1).learn(64)
    rng = np.random.default_rng(0)
    obs = rng.random((16, 8), dtype=np.float32)
    masks = random_masks(rng, 16, 8)
    saved_actions, _ = old.predict(obs, action_masks=masks)
    old.save(tmp_path / "old")
    old.close()
    state_path = next((tmp_path / "old").rglob("state.json"))
    state = json.loads(state_path.read_text())
    del state["config"]["run"]["mask_input"]  # as a checkpoint written before the field existed
    state_path.write_text(json.dumps(state))

    loaded = PPO.load(tmp_path / "old", trust_code=True)  # its config was edited: no longer the one trusted
    assert loaded._trainer.run.mask_input
    assert np.array_equal(loaded.predict(obs, action_masks=masks)[0], saved_actions)

    new = PPO("distrl_maskenvs:PickBestEnv", n_envs=2, n_steps=16, batch_size=32, seed=1)
    assert not new._trainer.run.mask_input
    widths = [
        {tuple(v.shape) for k, v in model._trainer.agent.params.state_dict().items() if k.endswith("0.weight")}
        for model in (loaded, new)
    ]
    assert widths == [{(64, 16)}, {(64, 8)}]  # the first layers read observation and mask, then the observation alone
    loaded.close()
    new.close()
