"""SAC's fused losses (algos/fused_sac.py) against their definitions in algos/sac.py: a float64 gradient check of
each on random inputs (ties of the two critics included), equality with autograd on the plain losses in float32,
the subgradient at a tie, and SAC trained both ways to equal parameters."""

import numpy as np
import pytest
import torch
from gymnasium import spaces
from test_sac import sample_batch

from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.fused_sac import (
    ActorLossFunction,
    CriticLossFunction,
    TemperatureLossFunction,
    fused_actor_loss,
    fused_critic_loss,
    fused_temperature_loss,
)
from distrl.algos.protocols import LocalSync
from distrl.algos.sac import SACAlgo, actor_loss, critic_loss, temperature_loss
from distrl.config import SACConfig
from distrl.nets.factory import make_sac_networks

ALPHA, TARGET_ENTROPY = 0.3, -2.0


def outputs(b: int, dtype: torch.dtype, seed: int) -> dict:
    """Random Q-values, critic targets and log-probs; every fourth pair of Q-values ties exactly."""
    g = torch.Generator().manual_seed(seed)
    rand = lambda: torch.randn(b, generator=g, dtype=dtype)  # noqa: E731
    q1, q2 = rand(), rand()
    q2[::4] = q1[::4]
    return dict(q1=q1, q2=q2, target=rand(), log_prob=rand() - 1.0, log_alpha=torch.tensor(-0.7, dtype=dtype))


def test_the_critic_loss_passes_a_float64_gradient_check():
    x = outputs(64, torch.float64, seed=1)
    inputs = (x["q1"].requires_grad_(True), x["q2"].requires_grad_(True))
    assert torch.autograd.gradcheck(lambda q1, q2: CriticLossFunction.apply(q1, q2, x["target"]), inputs)


def test_the_temperature_loss_passes_a_float64_gradient_check():
    x = outputs(64, torch.float64, seed=2)
    check = lambda log_alpha: TemperatureLossFunction.apply(log_alpha, x["log_prob"], TARGET_ENTROPY)  # noqa: E731
    assert torch.autograd.gradcheck(check, (x["log_alpha"].requires_grad_(True),))


def test_the_actor_loss_passes_a_float64_gradient_check_ties_included():
    # at a tie a central difference sees the half subgradient, -1/2 to each critic, as the closed form gives it
    x = outputs(64, torch.float64, seed=3)
    assert int((x["q1"] == x["q2"]).sum()) == 16
    inputs = tuple(x[k].requires_grad_(True) for k in ("log_prob", "q1", "q2"))
    assert torch.autograd.gradcheck(lambda *args: ActorLossFunction.apply(*args, ALPHA), inputs)


def plain_and_fused(plain, fused, inputs: tuple, *constants):
    """(plain loss, autograd's gradients on it, fused loss, fused gradients)."""
    leaves_ = leaves(*inputs)
    loss = plain(*leaves_, *constants)
    fused_loss, fused_grads = fused(*inputs, *constants)
    return loss.detach(), output_grads(loss, leaves_), fused_loss, fused_grads


@pytest.mark.parametrize(
    "plain, fused, names, constants",
    [
        (critic_loss, fused_critic_loss, ("q1", "q2"), ("target",)),
        (temperature_loss, fused_temperature_loss, ("log_alpha",), ("log_prob", TARGET_ENTROPY)),
        (actor_loss, fused_actor_loss, ("log_prob", "q1", "q2"), (ALPHA,)),
    ],
    ids=["critic", "temperature", "actor"],
)
def test_the_fused_losses_equal_autograd_on_the_plain_losses_in_float32(plain, fused, names, constants):
    x = outputs(256, torch.float32, seed=4)
    constants = tuple(x[c] if isinstance(c, str) else c for c in constants)
    loss, grads, fused_loss, fused_grads = plain_and_fused(plain, fused, tuple(x[k] for k in names), *constants)
    assert float(fused_loss) == pytest.approx(float(loss), rel=1e-6)
    assert len(fused_grads) == len(grads)
    for mine, theirs in zip(fused_grads, grads):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)


def test_at_a_tie_the_actor_loss_gives_half_to_each_critic_as_autograd_gives_torch_min():
    q1 = torch.tensor([1.0, 2.0, 3.0])
    q2 = torch.tensor([1.0, 1.0, 4.0])
    a, b = leaves(q1, q2)
    torch.min(a, b).sum().backward()  # autograd's rule for the element-wise min: half to each at a tie
    assert a.grad.tolist() == [0.5, 0.0, 1.0] and b.grad.tolist() == [0.5, 1.0, 0.0]
    _, (grad_log_prob, grad_q1, grad_q2) = fused_actor_loss(torch.zeros(3), q1, q2, ALPHA)
    assert grad_q1.tolist() == [-0.5, 0.0, -1.0] and grad_q2.tolist() == [-0.5, -1.0, 0.0]
    assert grad_log_prob.tolist() == pytest.approx([ALPHA] * 3)


class Flat(torch.nn.Flatten):
    """An encoder for flat observations, so that SAC builds its module networks (autograd below the outputs)."""

    features_dim = 3


def sac(fused: bool, modules: bool) -> SACAlgo:
    cfg = SACConfig(batch_size=32, buffer_size=100, net_arch=(16, 16), ent_coef="auto_0.3", fused_loss=fused)
    box = lambda n: spaces.Box(-1, 1, (n,), np.float32)  # noqa: E731
    networks = make_sac_networks(box(3), box(2), cfg, "cpu", seed=1, policy=Flat() if modules else None)
    return SACAlgo(cfg, networks, torch.device("cpu"), seed=1)


@pytest.mark.parametrize("modules", [False, True], ids=["closed-form", "modules"])
def test_training_with_the_fused_losses_equals_training_through_autograd(modules):
    runs = []
    for fused in (True, False):
        algo = sac(fused, modules)
        initial = algo.actor.params.data.clone(), algo.critic.params.data.clone()
        metrics = [algo.update(sample_batch(seed=step), LocalSync()) for step in range(5)]
        final = algo.actor.params.data.clone(), algo.critic.params.data.clone(), algo.critic_target.params.data
        runs.append((initial, final, metrics))
    (initial, fused, fused_metrics), (_, plain, plain_metrics) = runs
    assert float((fused[0] - initial[0]).abs().max()) > 1e-3 and float((fused[1] - initial[1]).abs().max()) > 1e-3
    for mine, theirs in zip(fused, plain):
        torch.testing.assert_close(mine, theirs, rtol=0, atol=1e-6)
    for mine, theirs in zip(fused_metrics, plain_metrics):  # the statistics too, to float rounding
        assert mine == pytest.approx(theirs, rel=1e-5, abs=1e-6)
