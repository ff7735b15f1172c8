import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.algos.dqn import DQNAlgo, td_loss, td_target
from distrl.algos.nstep import NStepAccumulator
from distrl.algos.protocols import LocalSync
from distrl.config import ConfigError, DQNConfig
from distrl.data.replay import Transitions
from distrl.nets import make_q_network

OBS = spaces.Box(-1.0, 1.0, (3,), np.float32)
ACTIONS = spaces.Discrete(2)


def test_td_target_by_hand_termination_truncation_and_double_q():
    rewards = torch.tensor([1.0, 1.0, 0.5])
    terminated = torch.tensor([0.0, 1.0, 0.0])
    next_target = torch.tensor([[2.0, 3.0], [2.0, 3.0], [4.0, -1.0]])
    # DQN: max of the target network; the terminated row keeps its reward; the third row bootstraps (a truncation)
    y = td_target(rewards, 0.9, terminated, next_target)
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * 3.0, 1.0, 0.5 + 0.9 * 4.0]))
    # Double DQN: the online network picks action 0, 0, 1; the target network values them
    online = torch.tensor([[5.0, 0.0], [5.0, 0.0], [0.0, 1.0]])
    y = td_target(rewards, 0.9, terminated, next_target, online)
    torch.testing.assert_close(y, torch.tensor([1.0 + 0.9 * 2.0, 1.0, 0.5 + 0.9 * -1.0]))
    # per-transition discounts (n-step): gamma^2 and gamma^1
    y = td_target(rewards[:2] * 0, torch.tensor([0.81, 0.9]), torch.zeros(2), next_target[:2])
    torch.testing.assert_close(y, torch.tensor([0.81 * 3.0, 0.9 * 3.0]))


def test_n_step_target_across_an_episode_end_by_hand():
    # one env, n=3, gamma 0.5: rewards 1, 2, 4 then a termination on the third step
    acc = NStepAccumulator(1, 3, 0.5)
    obs = [np.array([[float(t)]], np.float32) for t in range(4)]
    out = []
    for t, (reward, term) in enumerate([(1.0, False), (2.0, False), (4.0, True)]):
        out.append(
            acc.add(
                obs[t],
                np.array([0]),
                np.array([reward]),
                obs[t + 1],
                np.array([term]),
                np.array([False]),
                np.ones(1, bool),
            )
        )
    batch = out[-1]
    # all three transitions end at the termination: 1 + 0.5*2 + 0.25*4 = 3, 2 + 0.5*4 = 4, 4
    np.testing.assert_allclose(batch.returns, [3.0, 4.0, 4.0])
    np.testing.assert_allclose(batch.discounts, [0.125, 0.25, 0.5])
    y = td_target(
        torch.from_numpy(batch.returns),
        torch.from_numpy(batch.discounts),
        torch.from_numpy(batch.terminated),
        torch.full((3, 2), 10.0),
    )
    torch.testing.assert_close(y, torch.tensor([3.0, 4.0, 4.0]))  # terminated: no bootstrap anywhere


def test_td_loss_huber_and_mse_by_hand():
    q = torch.tensor([[0.0, 3.0], [1.0, 0.0]])
    actions = torch.tensor([1, 0])
    target = torch.tensor([0.5, 1.2])  # errors 2.5 and -0.2
    loss, errors = td_loss(q, actions, target, None, "huber")
    assert float(loss) == pytest.approx((2.5 - 0.5) + 0.5 * 0.2**2)
    torch.testing.assert_close(errors, torch.tensor([2.5, -0.2]))
    loss, _ = td_loss(q, actions, target, torch.tensor([0.5, 1.0]), "mse")
    assert float(loss) == pytest.approx(0.5 * 2.5**2 + 0.2**2)


def _batch(n: int, seed: int, discounts: bool = False, weights: bool = False) -> Transitions:
    g = torch.Generator().manual_seed(seed)
    return Transitions(
        obs=torch.rand(n, 3, generator=g) * 2 - 1,
        actions=torch.randint(0, 2, (n,), generator=g),
        rewards=torch.randn(n, generator=g),
        next_obs=torch.rand(n, 3, generator=g) * 2 - 1,
        terminated=(torch.rand(n, generator=g) < 0.3).float(),
        discounts=torch.full((n,), 0.9**3) if discounts else None,
        weights=torch.rand(n, generator=g) if weights else None,
    )


class _TorchQ(torch.nn.Module):
    """An independent Q network: nn.Linear layers holding the closed-form MLP's weights ([in, out] transposed)."""

    def __init__(self, params, prefix: str, sizes: tuple[int, ...]):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:]))
        with torch.no_grad():
            for i, layer in enumerate(self.layers):
                layer.weight.copy_(params.view(f"{prefix}.{i}.weight").t())
                layer.bias.copy_(params.view(f"{prefix}.{i}.bias"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.relu(x)
        return x


@pytest.mark.parametrize("double_q", [False, True])
@pytest.mark.parametrize("extras", [False, True])
def test_dqn_gradient_equals_autograd_on_an_independent_computation(double_q, extras):
    cfg = DQNConfig(net_arch=(8,), double_q=double_q, max_grad_norm=1e9, learning_rate=1e-3)
    q = make_q_network(OBS, ACTIONS, cfg, "cpu", 0)
    q_target = make_q_network(OBS, ACTIONS, cfg, "cpu", 0)
    algo = DQNAlgo(cfg, q, q_target, torch.device("cpu"))
    q_target.params.data.mul_(0.5)  # a target network that differs from the Q network
    batch = _batch(16, 1, discounts=extras, weights=extras)
    sizes = (3, 8, 2)
    online, target = _TorchQ(q.params, "q", sizes), _TorchQ(q_target.params, "q", sizes)
    with torch.no_grad():
        next_values = target(batch.next_obs)
        if double_q:
            best = online(batch.next_obs).argmax(1)
            next_value = next_values[torch.arange(16), best]
        else:
            next_value = next_values.max(1).values
        discount = batch.discounts if extras else 0.99
        y = batch.rewards + discount * (1 - batch.terminated) * next_value
    taken = online(batch.obs)[torch.arange(16), batch.actions]
    per_sample = torch.nn.functional.smooth_l1_loss(taken, y, reduction="none")
    expected_loss = (per_sample * batch.weights).mean() if extras else per_sample.mean()
    expected_loss.backward()
    expected = torch.cat([torch.cat([layer.weight.grad.t().reshape(-1), layer.bias.grad]) for layer in online.layers])
    metrics, errors = algo.update(batch, LocalSync())
    torch.testing.assert_close(q.params.grad, expected, rtol=1e-4, atol=1e-6)  # the step's (mean) gradient
    assert metrics["losses/loss"] == pytest.approx(float(expected_loss.detach()), rel=1e-5)
    torch.testing.assert_close(torch.from_numpy(errors), (taken - y).detach())


def test_target_updates_hard_and_polyak_repeated():
    cfg = DQNConfig(net_arch=(4,), tau=0.5)
    q, q_target = (make_q_network(OBS, ACTIONS, cfg, "cpu", s) for s in (0, 1))
    algo = DQNAlgo(cfg, q, q_target, torch.device("cpu"))
    torch.testing.assert_close(q_target.params.data, q.params.data)  # starts as a copy
    q_target.params.data.zero_()
    algo.update_target(2)  # two Polyak steps towards q: 1 - 0.5^2 of the way
    torch.testing.assert_close(q_target.params.data, 0.75 * q.params.data)
    algo.update_target(0)
    torch.testing.assert_close(q_target.params.data, 0.75 * q.params.data)


def test_epsilon_and_beta_schedules_by_hand():
    cfg = DQNConfig(exploration_fraction=0.2, exploration_initial_eps=1.0, exploration_final_eps=0.1)
    assert cfg.epsilon(0.0) == 1.0
    assert cfg.epsilon(0.1) == pytest.approx(0.55)
    assert cfg.epsilon(0.2) == pytest.approx(0.1) and cfg.epsilon(0.9) == pytest.approx(0.1)
    assert cfg.beta(0.5) == pytest.approx(0.7) and cfg.beta(2.0) == 1.0
    assert DQNConfig(train_freq=16, n_envs=2, gradient_steps=-1).gradient_steps_per_phase() == 32


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(gradient_steps=0), "gradient_steps=0"),
        (dict(exploration_final_eps=1.5), "exploration_final_eps=1.5"),
        (dict(n_steps=3, optimize_memory_usage=True), "optimize_memory_usage=True"),
        (dict(buffer_size=10, batch_size=32), "buffer_size=10"),
        (dict(tau=0.0), "tau=0.0"),
    ],
)
def test_bad_dqn_settings_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        DQNConfig(**kwargs)
