"""The module path: any torch.nn.Module on the flat buffer, equal to the closed-form MLPs where both apply."""

import dataclasses

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl.config import ConfigError, PPOConfig, REINFORCEConfig, RunConfig
from distrl.envs.spaces import DictLayout, action_spec
from distrl.nets import ActorCritic, ModuleAgent, make_agent
from distrl.nets.encoders import ActorCriticModule, Flatten, NatureCNN, SmallCNN, make_encoder
from distrl.training import EpisodicTrainer, OnPolicyTrainer

SEED = 3


def builtin_mlp(observation_space, action_space, cfg):
    """The built-in MLP actor-critic as a module, initialised as the closed-form one is."""
    net = ActorCriticModule(
        Flatten(observation_space.shape), action_spec(action_space).head_size, cfg.net_arch, cfg.activation
    )
    net.init_orthogonal(torch.Generator().manual_seed(SEED))
    return net


def as_closed_form_names(agent: ModuleAgent) -> dict[str, torch.Tensor]:
    """The module agent's parameters under the closed-form network's names and layout ([in, out])."""
    out = {}
    for name, value in agent.params.state_dict().items():
        if name == "log_std":
            out["policy.log_std"] = value
        else:
            trunk, _, layer, kind = name.split(".")
            out[f"{trunk}.{layer}.{kind}"] = value.t() if kind == "weight" else value
    return out


def assert_same_parameters(closed: ActorCritic, module: ModuleAgent, atol: float) -> None:
    expected = closed.params.state_dict()
    got = as_closed_form_names(module)
    assert set(got) == set(expected)
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("env", ["CartPole-v1", "Pendulum-v1"])
def test_an_mlp_through_the_module_path_matches_the_closed_form_path_under_ppo(env):
    cfg = PPOConfig(
        n_envs=4,
        n_steps=32,
        batch_size=32,
        n_epochs=3,
        learning_rate=3e-3,
        ent_coef=0.01,
        clip_range_vf=0.2,
        normalize_obs=True,
        net_arch=(32, 32),
    )
    run = RunConfig(env=env, total_steps=3 * 128, seed=SEED, vec="sync", quiet=True)
    closed = OnPolicyTrainer(run, cfg)
    module = OnPolicyTrainer(run, cfg, policy=builtin_mlp)
    assert isinstance(closed.agent, ActorCritic) and isinstance(module.agent, ModuleAgent)
    assert_same_parameters(closed.agent, module.agent, atol=0)  # the same initial weights, exactly
    closed.train()
    module.train()
    assert closed.steps == module.steps == 384
    moved = (
        (
            closed.agent.params.data
            - ActorCritic(closed.obs_dim, closed.env.single_action_space, cfg.net_arch, seed=SEED).params.data
        )
        .abs()
        .max()
    )
    assert moved > 1e-2  # training moved the weights: the comparison below is not of two untouched networks
    assert_same_parameters(closed.agent, module.agent, atol=1e-6)
    closed.close()
    module.close()


def test_an_mlp_through_the_module_path_matches_the_closed_form_path_under_reinforce():
    cfg = REINFORCEConfig(
        n_envs=2, episodes_per_iter=4, learning_rate=1e-2, baseline=True, ent_coef=0.01, net_arch=(16,)
    )
    run = RunConfig(env="CartPole-v1", total_steps=10_000, iterations=4, seed=SEED, vec="sync", quiet=True)
    closed = EpisodicTrainer(run, cfg)
    module = EpisodicTrainer(run, cfg, policy=builtin_mlp)
    closed.train()
    module.train()
    assert closed.steps == module.steps and closed.iteration == 4
    assert_same_parameters(closed.agent, module.agent, atol=1e-6)
    closed.close()
    module.close()


def test_the_vector_jacobian_product_is_the_gradient_of_the_stated_loss():
    space = gym.spaces.Box(-1, 1, (5,), np.float32)
    agent = make_agent(
        space, gym.spaces.MultiDiscrete([3, 2]), PPOConfig(net_arch=(8,)), "cpu", 0, "distrl_spaceenvs:TinyEncoder"
    )
    obs = torch.randn(6, 5)
    actions = torch.tensor([[0, 1], [2, 0], [1, 1], [0, 0], [2, 1], [1, 0]])
    d_lp, d_ent, d_v = torch.randn(6), torch.randn(6), torch.randn(6)
    fwd = agent.forward_train(obs)
    agent.backward(fwd, agent.dist_terms(fwd, actions), actions, d_lp, d_ent, d_v)
    # the same loss written plainly through torch.distributions, on an ordinary copy of the module
    param = agent.params.data.clone().requires_grad_(True)
    views = {n: param[a:b].view(agent.params.shapes[n]) for n, (a, b) in agent.params.offsets.items()}
    head, value = torch.func.functional_call(agent.module, views, (obs,))
    dists = [torch.distributions.Categorical(logits=part) for part in head.split([3, 2], -1)]
    log_prob = sum(d.log_prob(actions[:, j]) for j, d in enumerate(dists))
    entropy = sum(d.entropy() for d in dists)
    loss = (d_lp * log_prob + d_ent * entropy + d_v * value.reshape(-1)).sum()
    (expected,) = torch.autograd.grad(loss, param)
    torch.testing.assert_close(agent.params.grad, expected, rtol=1e-5, atol=1e-6)
    assert expected.abs().sum() > 0


def test_the_factory_takes_the_closed_form_path_only_where_it_applies():
    cfg = PPOConfig()
    box = gym.spaces.Box(-1, 1, (4,), np.float32)
    image = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    assert isinstance(make_agent(box, gym.spaces.Discrete(2), cfg, "cpu", 0), ActorCritic)
    for obs, act, policy in [
        (box, gym.spaces.MultiDiscrete([2, 3]), None),
        (image, gym.spaces.Discrete(4), None),
        (box, gym.spaces.Discrete(2), "distrl_spaceenvs:tiny_net"),
        (gym.spaces.Discrete(5), gym.spaces.Discrete(2), None),
    ]:
        assert isinstance(make_agent(obs, act, cfg, "cpu", 0, policy), ModuleAgent)
    assert isinstance(
        make_agent(box, gym.spaces.Discrete(2), dataclasses.replace(cfg, encoder="impala"), "cpu", 0), ModuleAgent
    )


class UsersEncoder(torch.nn.Module):
    features_dim = 16

    def __init__(self, observation_space, action_space, cfg):
        super().__init__()
        self.net = torch.nn.Linear(int(np.prod(observation_space.shape)), 16)  # default (global-generator) init

    def forward(self, obs):
        return self.net(obs.flatten(1))


@pytest.mark.parametrize(
    "cfg, policy",
    [
        (PPOConfig(core="lstm", ortho_init=False, n_steps=8, batch_size=8), None),  # default initialisation throughout
        (PPOConfig(), UsersEncoder),  # the user's layer and distrl's heads
    ],
    ids=["builtin-lstm-without-ortho-init", "users-encoder"],
)
def test_a_modules_initial_weights_depend_on_the_seed_alone_and_leave_torchs_generator_as_it_was(cfg, policy):
    box = gym.spaces.Box(-1, 1, (4,), np.float32)

    def weights(seed: int) -> torch.Tensor:
        torch.rand(int(torch.randint(1, 100, ()).item()))  # what ran before in the process draws a varying amount
        before = torch.get_rng_state()
        agent = make_agent(box, gym.spaces.Discrete(2), cfg, "cpu", seed, policy)
        assert torch.equal(torch.get_rng_state(), before)
        return agent.params.data.clone()

    torch.manual_seed(123)
    first = weights(0)
    assert torch.equal(weights(0), first)
    assert not torch.equal(weights(1), first)


def test_encoders_are_chosen_from_the_space():
    assert isinstance(make_encoder(gym.spaces.Box(0, 255, (84, 84, 3), np.uint8)), NatureCNN)
    assert isinstance(make_encoder(gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)), NatureCNN)
    small = make_encoder(gym.spaces.Box(0, 255, (10, 10, 3), np.uint8))
    assert isinstance(small, SmallCNN)  # the Nature CNN's 8x8 kernel does not fit a 10x10 grid
    assert small(torch.zeros(2, 10, 10, 3, dtype=torch.uint8)).shape == (2, small.features_dim)
    assert isinstance(make_encoder(gym.spaces.Box(0, 1, (84, 84, 3), np.float32)), Flatten)
    with pytest.raises(ConfigError, match="encoder='nature' does not fit a 8x8 image"):
        make_encoder(gym.spaces.Box(0, 255, (8, 8, 3), np.uint8), "nature")


def test_both_image_layouts_give_the_same_features_for_the_same_picture():
    hwc = NatureCNN((84, 84, 3))
    chw = NatureCNN((3, 84, 84))
    chw.load_state_dict(hwc.state_dict())
    picture = torch.randint(0, 256, (2, 84, 84, 3), dtype=torch.uint8)
    torch.testing.assert_close(hwc(picture), chw(picture.permute(0, 3, 1, 2).contiguous()))


def test_a_dict_observation_round_trips_through_its_packed_row():
    space = gym.spaces.Dict(
        {
            "image": gym.spaces.Box(0, 255, (3, 4, 1), np.uint8),
            "pos": gym.spaces.Box(-5, 5, (2,), np.float32),
            "room": gym.spaces.Discrete(7),
        }
    )
    layout = DictLayout(space)
    batch = {
        "image": np.arange(24, dtype=np.uint8).reshape(2, 3, 4, 1),
        "pos": np.array([[1.5, -2.25], [3.0, 4.0]], np.float32),
        "room": np.array([6, 2]),
    }
    rows = layout.pack(batch)
    assert rows.dtype == np.uint8 and rows.shape == (2, layout.nbytes)
    for key, value in layout.unpack(torch.from_numpy(rows)).items():
        np.testing.assert_array_equal(value.numpy(), batch[key])
        assert value.numpy().dtype == np.asarray(batch[key]).dtype or key == "room"


@pytest.mark.slow  # learning
@pytest.mark.parametrize(
    "env,steps,target",
    [
        ("distrl_spaceenvs:QuadrantEnv", 8192, 7.0),  # pixels only (8 steps, 1 per right quadrant; guessing: 2)
        ("distrl_spaceenvs:DictSignEnv", 8192, 7.0),  # image + vector keys (either alone: 4)
        ("distrl_spaceenvs:SignsEnv", 4096, 7.5),  # MultiDiscrete actions (guessing: 4)
    ],
)
def test_ppo_learns_tasks_that_need_the_new_spaces(env, steps, target):
    cfg = PPOConfig(n_envs=8, n_steps=32, batch_size=64, n_epochs=4, learning_rate=1e-3, net_arch=(64,), gamma=0.9)
    trainer = OnPolicyTrainer(RunConfig(env=env, total_steps=steps, seed=0, vec="sync", quiet=True), cfg)
    trainer.train()
    mean, _ = trainer.evaluate_now()
    trainer.close()
    assert mean >= target


def test_reinforce_learns_multibinary_actions_with_a_users_network():
    cfg = REINFORCEConfig(n_envs=4, episodes_per_iter=8, learning_rate=1e-2)
    run = RunConfig(
        env="distrl_spaceenvs:SignsEnv",
        env_kwargs=("binary=true",),
        total_steps=50_000,
        iterations=40,
        seed=0,
        vec="sync",
        quiet=True,
    )
    trainer = EpisodicTrainer(run, cfg, policy=lambda o, a, c: __import__("distrl_spaceenvs").TinyNet(3, 6))
    assert isinstance(trainer.env.single_action_space, gym.spaces.MultiBinary)
    assert trainer.agent.spec.kind == "multi_categorical" and trainer.agent.spec.nvec == (2, 2, 2)
    trainer.train()
    mean, _ = trainer.evaluate_now()
    trainer.close()
    assert mean >= 7.5


def test_images_stay_uint8_in_the_rollout():
    cfg = PPOConfig(n_envs=2, n_steps=8, batch_size=16, n_epochs=1)
    trainer = OnPolicyTrainer(
        RunConfig(env="distrl_spaceenvs:QuadrantEnv", total_steps=16, vec="sync", quiet=True), cfg
    )
    rollout = trainer.collector.collect(0)
    assert rollout.obs.dtype == np.uint8 and rollout.obs.shape == (9, 2, 10, 10, 1)
    batch = trainer.algo.prepare(rollout)
    assert batch.obs.dtype == torch.uint8
    trainer.close()


@pytest.mark.parametrize(
    "policy,message",
    [
        ("distrl_spaceenvs:not_a_module", "returned str, not a torch.nn.Module"),
        ("distrl_spaceenvs:no_such_factory", "has no callable 'no_such_factory'"),
        ("no_such_module_anywhere:f", "cannot import module"),
    ],
)
def test_a_policy_that_is_not_a_network_is_a_clear_error(policy, message):
    with pytest.raises(ConfigError, match=message):
        make_agent(gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Discrete(2), PPOConfig(), "cpu", 0, policy)


def test_a_module_with_the_wrong_head_size_names_the_expected_shapes():
    agent = make_agent(
        gym.spaces.Box(-1, 1, (3,), np.float32),
        gym.spaces.MultiDiscrete([2, 2, 2]),
        PPOConfig(),
        "cpu",
        0,
        lambda o, a, c: __import__("distrl_spaceenvs").TinyNet(3, 2),
    )
    with pytest.raises(ConfigError, match=r"returned head \(1, 2\).*needs head \(1, 6\)"):
        agent.act(np.zeros((1, 3), np.float32), None)


@pytest.mark.parametrize(
    "space,message",
    [
        (gym.spaces.Tuple([gym.spaces.Discrete(2)]), "Tuple .* not supported.*FlattenObservation"),
        (gym.spaces.Dict({"words": gym.spaces.Text(5)}), "Text \\(key 'words' of a Dict\\) is not supported"),
    ],
)
def test_a_space_distrl_cannot_encode_names_the_key_and_a_wrapper(space, message):
    with pytest.raises(ConfigError, match=message):
        make_agent(space, gym.spaces.Discrete(2), PPOConfig(), "cpu", 0)


def test_normalising_images_is_refused_before_training():
    with pytest.raises(ConfigError, match="normalize_obs=True is not allowed"):
        OnPolicyTrainer(
            RunConfig(env="distrl_spaceenvs:QuadrantEnv", vec="sync", quiet=True),
            PPOConfig(n_envs=2, n_steps=8, batch_size=16, normalize_obs=True),
        )


def test_normalising_a_dict_observation_touches_its_vector_parts_only():
    from distrl.data.normalize import ObsNormalizer
    from distrl_spaceenvs import DictSignEnv

    space = DictSignEnv().observation_space
    layout = DictLayout(space)
    norm = ObsNormalizer.for_space(space, enabled=True)
    images = np.random.default_rng(0).integers(0, 256, (4, 8, 8, 1)).astype(np.uint8)
    signs = np.array([[0.5], [1.0], [-1.0], [0.0]], np.float32)
    rows = layout.pack({"image": images, "sign": signs})
    norm.update(norm.moments(rows))
    assert norm.stats.mean.shape == (1,)  # statistics of the one vector value, not of the image's bytes
    out = layout.unpack_numpy(norm(rows))
    np.testing.assert_array_equal(out["image"], images)
    mean, var = 0.125, (0.25 + 1 + 1 + 0) / 4 - 0.125**2  # worked by hand; the prior count is 1e-4
    np.testing.assert_allclose(out["sign"], (signs - mean) / np.sqrt(var), rtol=1e-3)


def test_ppo_trains_on_dict_observations_with_normalisation():
    cfg = PPOConfig(n_envs=4, n_steps=16, batch_size=32, n_epochs=1, normalize_obs=True)
    trainer = OnPolicyTrainer(
        RunConfig(env="distrl_spaceenvs:DictSignEnv", total_steps=128, vec="sync", quiet=True), cfg
    )
    trainer.train()
    assert trainer.obs_normalizer.stats.count > 100  # the vector part's statistics were gathered
    trainer.close()


def test_bf16_autocast_runs_the_module_in_bfloat16_and_keeps_float32_gradients():
    space = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)
    cfg = PPOConfig(net_arch=())
    full = make_agent(space, gym.spaces.Discrete(4), cfg, "cpu", 0)
    half = make_agent(space, gym.spaces.Discrete(4), cfg, "cpu", 0, precision="bf16")
    obs = torch.randint(0, 256, (16, 4, 36, 36), dtype=torch.uint8)
    actions = torch.randint(0, 4, (16,))
    grads = []
    for agent in (full, half):
        fwd = agent.forward_train(obs)
        agent.backward(fwd, agent.dist_terms(fwd, actions), actions, torch.ones(16), None, torch.ones(16))
        grads.append(agent.params.grad.clone())
        assert fwd.head.dtype == torch.float32 and agent.params.grad.dtype == torch.float32
    assert not torch.equal(grads[0], grads[1])  # the arithmetic differed...
    cosine = torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0)
    assert cosine > 0.99  # ...by bfloat16 rounding only


def test_sac_bf16_runs_its_modules_under_autocast_and_multiplies_its_mlps_in_bfloat16():
    from distrl.config import SACConfig
    from distrl.training import OffPolicyTrainer

    trainer = OffPolicyTrainer(
        RunConfig(algo="sac", env="distrl_spaceenvs:DictTargetEnv", precision="bf16", quiet=True), SACConfig()
    )
    assert {net.autocast for net in (trainer.algo.actor, trainer.algo.critic, trainer.algo.critic_target)} == {
        torch.bfloat16
    }
    trainer.close()
    trainer = OffPolicyTrainer(RunConfig(algo="sac", env="Pendulum-v1", precision="bf16", quiet=True), SACConfig())
    assert {
        net.matmul_dtype
        for net in (
            trainer.algo.actor.net,
            trainer.algo.critic.q1,
            trainer.algo.critic.q2,
            trainer.algo.critic_target.q1,
        )
    } == {torch.bfloat16}
    trainer.close()
