"""DQN's Q networks: closed-form gradients against autograd, the module path, acting, the factory."""

from dataclasses import dataclass

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch import nn

from distrl.config import ConfigError
from distrl.envs.spaces import DictLayout
from distrl.nets.encoders import DictEncoder, Flatten, NatureCNN
from distrl.nets.factory import make_q_network
from distrl.nets.q import QMLP, ModuleQ, QHeadModule

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
IMAGE_OBS = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)


@dataclass(frozen=True)
class QNet:
    """The network fields ``make_q_network`` reads from DQN's config."""

    net_arch: tuple[int, ...] = (16, 16)
    activation: str = "relu"
    encoder: str = "auto"
    dueling: bool = False


def linear_stack(qmlp: QMLP, prefix: str) -> list[nn.Linear]:
    """torch.nn.Linear layers holding a copy of one stream's weights (the buffer stores them [in, out])."""
    layers = []
    i = 0
    while f"{prefix}.{i}.weight" in qmlp.params.shapes:
        weight = qmlp.params.view(f"{prefix}.{i}.weight")
        layer = nn.Linear(*weight.shape)
        with torch.no_grad():
            layer.weight.copy_(weight.t())
            layer.bias.copy_(qmlp.params.view(f"{prefix}.{i}.bias"))
        layers.append(layer)
        i += 1
    return layers


def run_stack(layers: list[nn.Linear], activation: str, x: torch.Tensor) -> torch.Tensor:
    act = torch.tanh if activation == "tanh" else torch.relu
    for i, layer in enumerate(layers):
        x = layer(x)
        if i < len(layers) - 1:
            x = act(x)
    return x


@pytest.mark.parametrize("dueling", [False, True])
@pytest.mark.parametrize("activation", ["tanh", "relu"])
@pytest.mark.parametrize("net_arch", [(), (8,), (8, 6)])
def test_closed_form_gradient_equals_autograd_on_linear_layers(dueling, activation, net_arch):
    qmlp = QMLP(5, 4, net_arch, activation, "cpu", seed=3, dueling=dueling)
    prefixes = ("value", "advantage") if dueling else ("q",)
    stacks = {p: linear_stack(qmlp, p) for p in prefixes}
    g = torch.Generator().manual_seed(0)
    obs, d_q = torch.randn(7, 5, generator=g), torch.randn(7, 4, generator=g)

    if dueling:
        value, advantage = (run_stack(stacks[p], activation, obs) for p in prefixes)
        expected_q = value + advantage - advantage.mean(1, keepdim=True)
    else:
        expected_q = run_stack(stacks["q"], activation, obs)
    (expected_q * d_q).sum().backward()

    qmlp.params.grad.fill_(123.0)  # backward overwrites, it does not add
    fwd = qmlp.forward(obs)
    torch.testing.assert_close(fwd.q, expected_q.detach(), rtol=1e-5, atol=1e-6)
    qmlp.backward(fwd, d_q)
    for prefix, layers in stacks.items():
        for i, layer in enumerate(layers):
            torch.testing.assert_close(qmlp.params.grad_view(f"{prefix}.{i}.weight"), layer.weight.grad.t())
            torch.testing.assert_close(qmlp.params.grad_view(f"{prefix}.{i}.bias"), layer.bias.grad)
    assert qmlp.params.grad.abs().sum() > 0


def test_dueling_output_is_value_plus_advantage_minus_mean_advantage_by_hand():
    qmlp = QMLP(2, 3, (), "relu", "cpu", seed=0, dueling=True)
    with torch.no_grad():
        qmlp.params.view("value.0.weight").copy_(torch.tensor([[1.0], [2.0]]))
        qmlp.params.view("value.0.bias").copy_(torch.tensor([0.5]))
        qmlp.params.view("advantage.0.weight").copy_(torch.tensor([[1.0, 0.0, -1.0], [0.0, 3.0, 0.0]]))
        qmlp.params.view("advantage.0.bias").copy_(torch.tensor([0.0, 0.0, 3.0]))
    obs = torch.tensor([[1.0, 1.0]])
    # V = 1 + 2 + 0.5 = 3.5; A = [1, 3, 2], mean 2; Q = 3.5 + [-1, 1, 0]
    expected = torch.tensor([[2.5, 4.5, 3.5]])
    torch.testing.assert_close(qmlp.forward(obs).q, expected)
    torch.testing.assert_close(qmlp.values(obs), expected)
    np.testing.assert_allclose(qmlp.q_numpy(obs.numpy()), expected.numpy())
    # dQ = [1, 0, 0]: dV = 1, dA = [2/3, -1/3, -1/3]; with a linear stream the weight gradient is obs^T dV.
    qmlp.backward(qmlp.forward(obs), torch.tensor([[1.0, 0.0, 0.0]]))
    torch.testing.assert_close(qmlp.params.grad_view("value.0.bias"), torch.tensor([1.0]))
    torch.testing.assert_close(qmlp.params.grad_view("advantage.0.bias"), torch.tensor([2.0, -1.0, -1.0]) / 3)


def test_bf16_matmuls_stay_close_to_float32():
    fp32 = QMLP(6, 3, (32, 32), "tanh", "cpu", seed=1)
    bf16 = QMLP(6, 3, (32, 32), "tanh", "cpu", seed=1, matmul_dtype=torch.bfloat16)
    obs, d_q = torch.randn(64, 6), torch.randn(64, 3)
    grads = []
    for net in (fp32, bf16):
        fwd = net.forward(obs)
        net.backward(fwd, d_q)
        grads.append(net.params.grad.clone())
    torch.testing.assert_close(bf16.forward(obs).q, fp32.forward(obs).q, rtol=0, atol=0.05)
    assert not torch.equal(grads[0], grads[1])
    assert nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99


@pytest.mark.parametrize("dueling", [False, True])
def test_qmlp_acts_greedily_on_its_values(dueling):
    qmlp = QMLP(4, 5, (16,), "tanh", "cpu", seed=2, dueling=dueling)
    obs = np.random.default_rng(0).normal(size=(32, 4)).astype(np.float32)
    values = qmlp.values(torch.from_numpy(obs))
    q = qmlp.q_numpy(obs)
    assert q.dtype == np.float32 and q.shape == (32, 5)
    np.testing.assert_allclose(q, values.numpy(), rtol=1e-5, atol=1e-6)
    actions = qmlp.act(obs)
    assert actions.dtype == np.int64
    np.testing.assert_array_equal(actions, values.argmax(1).numpy())
    assert len(set(actions.tolist())) > 1  # the check could fail: actions differ between observations
    with torch.no_grad():
        qmlp.params.data.mul_(-1.0)  # acting on the CPU reads the buffer itself
    np.testing.assert_allclose(qmlp.q_numpy(obs), qmlp.values(torch.from_numpy(obs)).numpy(), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dueling", [False, True])
def test_ties_go_to_the_lowest_action_index(dueling):
    qmlp = QMLP(3, 4, (), "relu", "cpu", seed=0, dueling=dueling)
    with torch.no_grad():
        qmlp.params.data.zero_()
        qmlp.params.view("advantage.0.bias" if dueling else "q.0.bias").copy_(torch.tensor([1.0, 3.0, 3.0, 0.0]))
    assert qmlp.act(np.ones((2, 3), np.float32)).tolist() == [1, 1]
    with torch.no_grad():
        qmlp.params.data.zero_()  # all equal
    assert qmlp.act(np.ones((2, 3), np.float32)).tolist() == [0, 0]

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.bias = nn.Parameter(torch.tensor([0.0, 2.0, 2.0]))

        def forward(self, obs):
            return self.bias.expand(obs.shape[0], 3)

    assert ModuleQ(Tied(), 3, "cpu").act(np.zeros((2, 1), np.float32)).tolist() == [1, 1]


def small_module(dueling: bool) -> nn.Module:
    torch.manual_seed(0)
    return QHeadModule(Flatten((5,)), 4, (8,), "tanh", dueling)


@pytest.mark.parametrize("dueling", [False, True])
def test_module_q_gradient_equals_autograd_through_the_module(dueling):
    module = small_module(dueling)
    q_net = ModuleQ(module, 4, "cpu")
    obs, d_q = torch.randn(6, 5), torch.randn(6, 4)
    (module(obs) * d_q).sum().backward()  # the module's own parameters, equal to the buffer's copy
    q_net.params.grad.fill_(123.0)
    fwd = q_net.forward(obs)
    torch.testing.assert_close(fwd.q, module(obs).detach())
    q_net.backward(fwd, d_q)
    for name, p in module.named_parameters():
        torch.testing.assert_close(q_net.params.grad_view(name), p.grad)
    assert q_net.params.grad.abs().sum() > 0
    np.testing.assert_array_equal(q_net.act(obs.numpy()), q_net.values(obs).argmax(1).numpy())
    np.testing.assert_allclose(q_net.q_numpy(obs.numpy()), q_net.values(obs).numpy())


def test_module_q_bf16_autocast_runs_in_bfloat16_and_stays_close():
    module = small_module(dueling=True)
    fp32, bf16 = ModuleQ(module, 4, "cpu"), ModuleQ(module, 4, "cpu", autocast=torch.bfloat16)
    dtypes = set()
    module.advantage.layers[0].register_forward_hook(lambda m, i, o: dtypes.add(o.dtype))
    obs, d_q = torch.randn(32, 5), torch.randn(32, 4)
    grads, qs = [], []
    for net in (fp32, bf16):
        fwd = net.forward(obs)
        assert fwd.q.dtype == torch.float32
        net.backward(fwd, d_q)
        grads.append(net.params.grad.clone())
        qs.append(fwd.q.detach())
    assert dtypes == {torch.float32, torch.bfloat16}
    assert bf16.params.grad.dtype == torch.float32
    torch.testing.assert_close(qs[1], qs[0], rtol=0, atol=0.05)
    assert not torch.equal(grads[0], grads[1])
    assert nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99


def test_factory_builds_the_closed_form_for_cartpole_observations():
    net = make_q_network(CARTPOLE_OBS, gym.spaces.Discrete(2), QNet(dueling=True), "cpu", 0)
    assert isinstance(net, QMLP) and net.n_actions == 2 and net.dueling
    assert net.params.shapes["value.0.weight"] == (4, 16) and net.params.shapes["advantage.2.weight"] == (16, 2)
    low = make_q_network(CARTPOLE_OBS, gym.spaces.Discrete(2), QNet(), "cpu", 0, precision="bf16")
    assert isinstance(low, QMLP) and low.nets[0].matmul_dtype == torch.bfloat16


@pytest.mark.parametrize("encoder", ["nature", "auto"])
def test_factory_puts_the_nature_cnn_under_a_q_head_for_atari_frames(encoder):
    net = make_q_network(IMAGE_OBS, gym.spaces.Discrete(6), QNet(net_arch=(), encoder=encoder), "cpu", 0)
    assert isinstance(net, ModuleQ) and isinstance(net.module, QHeadModule)
    assert isinstance(net.module.encoder, NatureCNN)
    obs = np.random.default_rng(0).integers(0, 256, (3, 84, 84, 4), dtype=np.uint8)
    assert net.q_numpy(obs).shape == (3, 6) and net.act(obs).shape == (3,)


def test_factory_encodes_dict_observations_from_packed_rows():
    space = gym.spaces.Dict({"x": gym.spaces.Box(-1, 1, (2,), np.float32), "flag": gym.spaces.Discrete(3)})
    net = make_q_network(space, gym.spaces.Discrete(4), QNet(dueling=True), "cpu", 0)
    assert isinstance(net, ModuleQ) and isinstance(net.module.encoder, DictEncoder)
    rows = DictLayout(space).pack({"x": np.array([[0.5, -0.5], [0.1, 0.2]], np.float32), "flag": np.array([0, 2])})
    q = net.q_numpy(rows)
    assert q.shape == (2, 4) and q.dtype == np.float32
    assert not np.allclose(q[0], q[1])  # the two observations are told apart


class Encoder(nn.Module):
    """A user's encoder: distrl adds the Q head."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 10)
        self.features_dim = 10

    def forward(self, obs):
        return torch.relu(self.linear(obs))


def test_a_user_encoder_with_features_dim_gets_distrls_head():
    def factory(observation_space, action_space, config):
        return Encoder()

    net = make_q_network(CARTPOLE_OBS, gym.spaces.Discrete(3), QNet(net_arch=(8,)), "cpu", 0, policy=factory)
    assert isinstance(net, ModuleQ) and isinstance(net.module, QHeadModule)
    assert isinstance(net.module.encoder, Encoder) and net.params.shapes["q.layers.0.weight"] == (8, 10)
    assert net.values(torch.zeros(2, 4)).shape == (2, 3)


def test_a_user_module_is_the_whole_q_function_and_its_shape_is_checked():
    whole = make_q_network(
        CARTPOLE_OBS, gym.spaces.Discrete(3), QNet(), "cpu", 0, policy=lambda o, a, c: nn.Linear(4, 3)
    )
    assert isinstance(whole.module, nn.Linear) and whole.values(torch.zeros(2, 4)).shape == (2, 3)
    wrong = make_q_network(
        CARTPOLE_OBS, gym.spaces.Discrete(3), QNet(), "cpu", 0, policy=lambda o, a, c: nn.Linear(4, 2)
    )
    with pytest.raises(ConfigError, match=r"must return \[batch, n_actions\] = \[2, 3\]"):
        wrong.values(torch.zeros(2, 4))
    with pytest.raises(ConfigError, match="for dqn a policy factory returns a torch.nn.Module"):
        make_q_network(CARTPOLE_OBS, gym.spaces.Discrete(3), QNet(), "cpu", 0, policy=lambda o, a, c: "not a net")
    with pytest.raises(ConfigError, match="policy=.* is not allowed: must be"):
        make_q_network(CARTPOLE_OBS, gym.spaces.Discrete(3), QNet(), "cpu", 0, policy=lambda o: nn.Linear(4, 3))


def test_a_box_action_space_is_refused_naming_discrete():
    with pytest.raises(ConfigError, match="a Box action space is not allowed: dqn needs Discrete actions"):
        make_q_network(CARTPOLE_OBS, gym.spaces.Box(-1, 1, (2,)), QNet(), "cpu", 0)


def test_actions_are_indices_whatever_the_spaces_start():
    net = make_q_network(CARTPOLE_OBS, gym.spaces.Discrete(3, start=-1), QNet(), "cpu", 0)
    actions = net.act(np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32))
    assert net.n_actions == 3 and set(actions.tolist()) <= {0, 1, 2}


@pytest.mark.parametrize(
    "space, cfg",
    [
        (CARTPOLE_OBS, QNet(dueling=True)),
        (gym.spaces.Box(0, 255, (36, 36, 4), np.uint8), QNet(net_arch=(8,), dueling=True)),
        (gym.spaces.Discrete(5), QNet()),
    ],
)
def test_the_same_seed_gives_the_same_weights(space, cfg):
    a, b = (make_q_network(space, gym.spaces.Discrete(3), cfg, "cpu", 7) for _ in range(2))
    c = make_q_network(space, gym.spaces.Discrete(3), cfg, "cpu", 8)
    assert torch.equal(a.params.data, b.params.data)
    assert not torch.equal(a.params.data, c.params.data)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("space", [CARTPOLE_OBS, gym.spaces.Box(0, 255, (36, 36, 4), np.uint8)])
def test_on_a_gpu_acting_follows_the_weights_after_a_refresh(space):
    net = make_q_network(space, gym.spaces.Discrete(3), QNet(dueling=True), "cuda", 0)
    obs = space.sample()[None].repeat(8, 0)
    with torch.no_grad():
        net.params.data.mul_(-2.0)
    net.refresh_acting_copy()
    expected = net.values(torch.as_tensor(obs)).cpu().numpy()
    np.testing.assert_allclose(net.q_numpy(obs), expected, rtol=1e-4, atol=1e-5)
    fwd = net.forward(torch.as_tensor(obs))
    net.backward(fwd, torch.ones_like(fwd.q))
    assert net.params.grad.is_cuda and net.params.grad.abs().sum() > 0
