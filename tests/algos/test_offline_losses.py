"""The offline objectives against values and gradients worked out by hand."""

import math

import pytest
import torch

from distrl.algos.bc import bc_categorical_loss, bc_deterministic_loss
from distrl.algos.cql import cql_alpha_loss, cql_discrete_penalty, cql_penalty
from distrl.algos.iql import expectile_loss, iql_actor_loss, iql_critic_loss, iql_value_loss
from distrl.algos.td3 import td3_actor_loss, td3_critic_loss, td3_target, td3bc_actor_loss

LN2, LN3 = math.log(2.0), math.log(3.0)


def t(*values, grad=False):
    return torch.tensor(values, dtype=torch.float64, requires_grad=grad)


def close(tensor, expected):
    torch.testing.assert_close(tensor, torch.tensor(expected, dtype=tensor.dtype))


# ---- behaviour cloning ----


def test_bc_deterministic_loss_averages_squares_over_dimensions_and_sums_over_samples():
    action = t([0.5, -0.5], [0.0, 1.0], grad=True)
    loss = bc_deterministic_loss(action, t([0.0, 0.0], [0.0, 0.5]))
    assert loss.item() == pytest.approx((0.25 + 0.25) / 2 + (0.0 + 0.25) / 2)
    loss.backward()
    close(action.grad, [[0.5, -0.5], [0.0, 0.5]])  # 2 (pi - a) / A


def test_bc_categorical_loss_is_the_cross_entropy_summed():
    logits = t([0.0, 0.0], [LN3, 0.0], grad=True)  # softmax [1/2, 1/2] and [3/4, 1/4]
    loss = bc_categorical_loss(logits, torch.tensor([0, 1]))
    assert loss.item() == pytest.approx(math.log(2.0) + math.log(4.0))  # -ln(1/2) - ln(1/4) = ln 8
    loss.backward()
    close(logits.grad, [[0.5 - 1.0, 0.5], [0.75, 0.25 - 1.0]])  # softmax - one-hot


# ---- TD3 and TD3+BC ----


def test_td3_target_takes_the_smaller_critic_and_stops_at_termination():
    y = td3_target(t(1.0, 0.5, 0.0), t(0.0, 1.0, 0.0), t(2.0, 4.0, 5.0), t(3.0, 1.0, -1.0), gamma=0.9)
    close(y, [1.0 + 0.9 * 2.0, 0.5, 0.0 + 0.9 * -1.0])


def test_td3_critic_loss_is_each_critics_squared_error_added():
    q1, q2 = t(1.0, 2.0, grad=True), t(0.0, 3.0, grad=True)
    loss = td3_critic_loss(q1, q2, t(1.5, 2.0))
    assert loss.item() == pytest.approx((0.25 + 0.0) + (2.25 + 1.0))  # 3.5
    # over the batch of 2: the reference's mse_loss(Q1, y) + mse_loss(Q2, y) = 0.125 + 1.625
    assert loss.item() / 2 == pytest.approx(0.125 + 1.625)
    loss.backward()
    close(q1.grad, [-1.0, 0.0])  # 2 (Q - y)
    close(q2.grad, [-3.0, 2.0])


def test_td3_actor_loss_is_minus_the_first_critic():
    q1_pi = t(1.0, -2.0, 3.0, grad=True)
    loss = td3_actor_loss(q1_pi)
    assert loss.item() == pytest.approx(-(1.0 - 2.0 + 3.0))
    loss.backward()
    close(q1_pi.grad, [-1.0, -1.0, -1.0])


def test_td3bc_actor_loss_by_hand_with_lambda_a_constant():
    q1_pi = t(2.0, -4.0, grad=True)  # mean |Q| = 3, lambda = 2.5 / 3
    action = t([0.5, 0.0], [1.0, 1.0], grad=True)
    loss = td3bc_actor_loss(q1_pi, action, t([0.0, 0.0], [0.0, 1.0]), alpha=2.5)
    # -(2.5 / 3)(2 - 4) + (0.25 + 0) / 2 + (1 + 0) / 2
    assert loss.item() == pytest.approx(5.0 / 3.0 + 0.125 + 0.5)
    loss.backward()
    # -lambda for every sample; a lambda carrying gradient would give -lambda + (2.5 / 9) * (-2) * sign(Q) / 2 instead
    close(q1_pi.grad, [-2.5 / 3.0, -2.5 / 3.0])
    close(action.grad, [[0.5, 0.0], [1.0, 0.0]])  # 2 (pi - a) / A with A = 2


def test_td3bc_actor_loss_detaches_a_given_normaliser():
    q_abs_mean = torch.tensor(4.0, dtype=torch.float64, requires_grad=True)
    q1_pi = t(2.0, -4.0, grad=True)
    loss = td3bc_actor_loss(q1_pi, t([0.0], [0.0]), t([0.0], [0.0]), alpha=2.0, q_abs_mean=q_abs_mean)
    assert loss.item() == pytest.approx(-(2.0 / 4.0) * (2.0 - 4.0))  # 1.0
    loss.backward()
    assert q_abs_mean.grad is None
    close(q1_pi.grad, [-0.5, -0.5])


# ---- IQL ----


def test_expectile_loss_weights_and_derivative():
    diff = t(2.0, -1.0, 0.5, grad=True)
    loss = expectile_loss(diff, tau=0.7)
    assert loss.item() == pytest.approx(0.7 * 4.0 + 0.3 * 1.0 + 0.7 * 0.25)  # 3.275
    loss.backward()
    close(diff.grad, [2 * 0.7 * 2.0, 2 * 0.3 * -1.0, 2 * 0.7 * 0.5])  # 2 |tau - 1(d < 0)| d


def test_expectile_loss_at_one_half_is_half_the_squared_error():
    assert float(expectile_loss(t(3.0, -1.0), tau=0.5)) == pytest.approx(0.5 * (9.0 + 1.0))


def test_iql_value_loss_trains_only_the_value():
    q, v = t(3.0, 1.0, grad=True), t(1.0, 2.0, grad=True)  # Q - V = [2, -1]
    loss = iql_value_loss(q, v, tau=0.9)
    assert loss.item() == pytest.approx(0.9 * 4.0 + 0.1 * 1.0)  # 3.7
    loss.backward()
    assert q.grad is None
    close(v.grad, [-2 * 0.9 * 2.0, -2 * 0.1 * -1.0])


def test_iql_critic_loss_bootstraps_from_the_value_of_the_next_state():
    q1, q2, next_v = t(1.0, 0.0, grad=True), t(2.0, 1.0, grad=True), t(2.0, 10.0, grad=True)
    loss = iql_critic_loss(q1, q2, t(1.0, 0.5), t(0.0, 1.0), next_v, gamma=0.5)
    # targets 1 + 0.5 * 2 = 2 and 0.5 (terminated): (1 - 2)^2 + (2 - 2)^2 + (0 - 0.5)^2 + (1 - 0.5)^2
    assert loss.item() == pytest.approx(1.0 + 0.0 + 0.25 + 0.25)
    loss.backward()
    assert next_v.grad is None
    close(q1.grad, [-2.0, -1.0])
    close(q2.grad, [0.0, 1.0])


def test_iql_actor_loss_clips_the_weights_and_passes_no_gradient_to_them():
    log_prob = t(-1.0, -2.0, -0.5, grad=True)
    q, v = t(1.0, 2.0, 10.0, grad=True), t(1.0, 1.0, 0.0, grad=True)  # advantages 0, 1, 10
    loss = iql_actor_loss(log_prob, q, v, beta=LN2)  # weights 2^A: 1, 2, 1024 clipped to 100
    assert loss.item() == pytest.approx(-(1.0 * -1.0 + 2.0 * -2.0 + 100.0 * -0.5))  # 55
    loss.backward()
    close(log_prob.grad, [-1.0, -2.0, -100.0])
    assert q.grad is None and v.grad is None


# ---- CQL ----


def cql_inputs(grad=False):
    """B = 2 states, N = 2 sampled actions each, A = 2: the uniform density is 1/4, so each random sample's
    entry is Q + 2 ln 2 and its exponential 4 exp(Q)."""
    return dict(
        q_random=t([0.0, 0.0], [0.0, 0.0], grad=grad),  # exp: 4, 4 | 4, 4
        q_policy=t([0.0, 0.0], [0.0, 0.0], grad=grad),
        q_next_policy=t([1.0, 1.0], [0.0, 0.0], grad=grad),
        log_prob_policy=t([-LN2, 0.0], [0.0, 0.0], grad=grad),  # exp(Q - log pi): 2, 1 | 1, 1
        log_prob_next_policy=t([1.0, 1.0 - LN3], [0.0, 0.0], grad=grad),  # 1, 3 | 1, 1
        q_data=t(2.0, 0.0, grad=grad),
        action_dim=2,
    )


def test_cql_penalty_importance_samples_by_hand():
    loss = cql_penalty(**cql_inputs())
    # ln(4 + 4 + 2 + 1 + 1 + 3) - 2 + ln(4 + 4 + 1 + 1 + 1 + 1) - 0
    assert loss.item() == pytest.approx(math.log(15.0) - 2.0 + math.log(12.0))


def test_cql_penalty_gradients_are_the_softmax_weights_and_skip_the_log_densities():
    inputs = cql_inputs(grad=True)
    cql_penalty(**inputs).backward()
    close(inputs["q_random"].grad, [[4 / 15, 4 / 15], [4 / 12, 4 / 12]])
    close(inputs["q_policy"].grad, [[2 / 15, 1 / 15], [1 / 12, 1 / 12]])
    close(inputs["q_next_policy"].grad, [[1 / 15, 3 / 15], [1 / 12, 1 / 12]])
    close(inputs["q_data"].grad, [-1.0, -1.0])
    assert inputs["log_prob_policy"].grad is None and inputs["log_prob_next_policy"].grad is None


def test_cql_penalty_temperature_divides_the_entries_density_included():
    one = t([0.0])
    loss = cql_penalty(one, one, one, one, one, t(0.5), action_dim=1, temperature=2.0)
    # entries 0 + ln 2, 0, 0, each halved: 2 ln(exp(ln 2 / 2) + 1 + 1) - 0.5 = 2 ln(sqrt 2 + 2) - 0.5
    assert loss.item() == pytest.approx(2.0 * math.log(math.sqrt(2.0) + 2.0) - 0.5)


def test_cql_alpha_loss_raises_alpha_while_the_penalty_exceeds_the_gap():
    log_alpha = torch.tensor(LN2, dtype=torch.float64, requires_grad=True)  # alpha' = 2
    penalty_sum = t(3.5 + 3.5, grad=True).sum()  # mean penalty 3.5 over 2 samples
    loss = cql_alpha_loss(log_alpha, penalty_sum, count=2, target_action_gap=1.5)
    assert loss.item() == pytest.approx(-2.0 * (7.0 - 2 * 1.5))  # -8
    assert loss.item() / 2 == pytest.approx(-2.0 * (3.5 - 1.5))  # the reference's -alpha' (mean - gap)
    loss.backward()
    assert float(log_alpha.grad) == pytest.approx(-8.0)
    before = log_alpha.item()
    torch.optim.SGD([log_alpha], lr=0.01).step()
    assert log_alpha.item() > before

    log_alpha.grad = None
    cql_alpha_loss(log_alpha, t(1.0).sum(), count=2, target_action_gap=1.5).backward()  # mean 0.5 below the gap
    assert float(log_alpha.grad) > 0.0  # descent lowers alpha'


def test_cql_alpha_is_clamped_at_a_million():
    log_alpha = torch.tensor(20.0, dtype=torch.float64, requires_grad=True)  # exp(20) > 4e8
    loss = cql_alpha_loss(log_alpha, torch.tensor(3.0, dtype=torch.float64), count=1, target_action_gap=1.0)
    assert loss.item() == pytest.approx(-1e6 * 2.0)
    loss.backward()
    assert float(log_alpha.grad) == 0.0


def test_cql_discrete_penalty_by_hand():
    q_all = t([0.0, LN3], [1.0, 1.0], grad=True)
    loss = cql_discrete_penalty(q_all, torch.tensor([0, 1]))
    # ln(1 + 3) - 0 + (1 + ln 2) - 1 = ln 8
    assert loss.item() == pytest.approx(3 * LN2)
    loss.backward()
    close(q_all.grad, [[0.25 - 1.0, 0.75], [0.5, 0.5 - 1.0]])  # softmax - one-hot


# ---- the distributed contract: a batch split over workers sums to the whole batch's loss ----


def random_batch(n=4, action_dim=2, samples=3, seed=0):
    g = torch.Generator().manual_seed(seed)

    def normal(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    return dict(
        q1=normal(n),
        q2=normal(n),
        target=normal(n),
        rewards=normal(n),
        terminated=(torch.rand(n, generator=g) < 0.5).double(),
        log_prob=normal(n),
        action=normal(n, action_dim),
        dataset_action=normal(n, action_dim),
        logits=normal(n, 3),
        discrete_actions=torch.randint(0, 3, (n,), generator=g),
        q_samples=[normal(n, samples) for _ in range(5)],
    )


LOSSES = {
    "bc_deterministic": lambda b: bc_deterministic_loss(b["action"], b["dataset_action"]),
    "bc_categorical": lambda b: bc_categorical_loss(b["logits"], b["discrete_actions"]),
    "td3_critic": lambda b: td3_critic_loss(b["q1"], b["q2"], b["target"]),
    "td3_actor": lambda b: td3_actor_loss(b["q1"]),
    "expectile": lambda b: expectile_loss(b["q1"] - b["q2"], 0.7),
    "iql_value": lambda b: iql_value_loss(b["q1"], b["q2"], 0.7),
    "iql_critic": lambda b: iql_critic_loss(b["q1"], b["q2"], b["rewards"], b["terminated"], b["target"], 0.99),
    "iql_actor": lambda b: iql_actor_loss(b["log_prob"], b["q1"], b["q2"], 3.0),
    "cql": lambda b: cql_penalty(*b["q_samples"], b["q1"], action_dim=2),
    "cql_discrete": lambda b: cql_discrete_penalty(b["logits"], b["discrete_actions"]),
}


def halves(batch):
    def part(value, rows):
        return [part(v, rows) for v in value] if isinstance(value, list) else value[rows]

    return ({k: part(v, slice(0, 2)) for k, v in batch.items()}, {k: part(v, slice(2, 4)) for k, v in batch.items()})


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_losses_summed_over_two_halves_equal_the_whole_batchs(name):
    loss, batch = LOSSES[name], random_batch()
    first, second = halves(batch)
    assert float(loss(first) + loss(second)) == pytest.approx(float(loss(batch)), rel=1e-12)


def test_td3bc_halves_sum_to_the_whole_when_given_the_whole_batchs_q_scale():
    batch = random_batch()
    first, second = halves(batch)
    q_abs_mean = float(batch["q1"].abs().mean())  # what an all-reduce of sum |Q| and count gives

    def loss(b, scale=None):
        return td3bc_actor_loss(b["q1"], b["action"], b["dataset_action"], alpha=2.5, q_abs_mean=scale)

    whole = float(loss(batch))
    assert float(loss(first, q_abs_mean) + loss(second, q_abs_mean)) == pytest.approx(whole, rel=1e-12)
    assert float(loss(first) + loss(second)) != pytest.approx(whole, rel=1e-6)  # each half's own scale differs


def test_cql_alpha_loss_halves_sum_to_the_whole():
    log_alpha = torch.tensor(0.3, dtype=torch.float64)
    penalty = random_batch()["q1"]  # per-sample penalties
    whole = cql_alpha_loss(log_alpha, penalty.sum(), 4, 0.5)
    parts = cql_alpha_loss(log_alpha, penalty[:2].sum(), 2, 0.5) + cql_alpha_loss(log_alpha, penalty[2:].sum(), 2, 0.5)
    assert float(parts) == pytest.approx(float(whole), rel=1e-12)


def test_batch_statistics_stay_on_the_batchs_device():
    """The sample count joins the losses' sums on their device (a CUDA batch once met a count made on the CPU and
    every offline step failed there); the meta device stands in for a GPU."""
    from distrl.algos.learned import batch_stats
    from distrl.data.replay import Transitions

    obs = torch.empty(5, 3, device="meta")
    batch = Transitions(obs, torch.empty(5, 1, device="meta"), torch.empty(5, device="meta"), obs, obs[:, 0])
    stats = batch_stats(batch, torch.empty((), device="meta"), torch.empty((), device="meta"))
    assert stats.device.type == "meta" and stats.shape == (3,) and stats.dtype == torch.float64
    cpu = Transitions(torch.zeros(5, 3), torch.zeros(5, 1), torch.zeros(5), torch.zeros(5, 3), torch.zeros(5))
    assert batch_stats(cpu, torch.tensor(2.5)).tolist() == [5.0, 2.5]
