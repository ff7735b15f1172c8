"""The offline algorithms' modules against torch's own distributions, and in bfloat16 against float32."""

import torch

from distrl.algos.offline import make_offline_algo
from distrl.algos.protocols import LocalSync
from distrl.config import CQLConfig
from distrl.data.replay import Transitions
from distrl.nets.offline import LOG_STD_MAX, GaussianActor, TwinCritic, mlp, set_low_precision


def test_gaussian_actor_log_prob_is_torchs_normal_with_the_same_gradients():
    """IQL's policy density in closed form: values and gradients (network and log standard deviation, one
    dimension clamped at its upper bound, where no gradient reaches it) as torch.distributions.Normal gives."""
    torch.manual_seed(0)
    actor = GaussianActor(4, 3, (8,), "relu").double()
    with torch.no_grad():
        actor.log_std.copy_(torch.tensor([-0.5, 0.3, LOG_STD_MAX + 1.0]))
    obs, actions = torch.randn(5, 4, dtype=torch.float64), torch.rand(5, 3, dtype=torch.float64) * 2 - 1

    def grads(log_prob):
        actor.zero_grad()
        (log_prob * torch.arange(1.0, 6.0, dtype=torch.float64)).sum().backward()
        return {name: p.grad.clone() for name, p in actor.named_parameters()}

    ours = actor.log_prob(obs, actions)
    ours_grads = grads(ours)
    std = actor.log_std.clamp(max=LOG_STD_MAX).exp()
    torchs = torch.distributions.Normal(actor(obs), std).log_prob(actions).sum(-1)
    torchs_grads = grads(torchs)
    torch.testing.assert_close(ours, torchs.detach())
    assert ours_grads.keys() == torchs_grads.keys()
    for name, grad in ours_grads.items():
        torch.testing.assert_close(grad, torchs_grads[name], msg=name)
    assert ours_grads["log_std"][2] == 0.0 and (ours_grads["log_std"][:2] != 0).all()  # the clamped dimension


def test_bf16_runs_the_products_in_bfloat16_returns_float32_and_keeps_float32_gradients():
    """``--precision bf16`` for the offline networks: outputs float32 and within bfloat16's rounding of the float32
    ones (not equal to them: the products did run in bfloat16), float32 weight gradients pointing the same way;
    set back to float32, the same values exactly."""
    torch.manual_seed(0)
    critic = TwinCritic(11, 3, (256, 256), "relu")
    obs, actions = torch.randn(512, 11), torch.rand(512, 3) * 2 - 1

    def run():
        critic.zero_grad()
        q1, q2 = critic(obs, actions)
        (q1.square().sum() + q2.sum()).backward()
        return q1.detach(), torch.cat([p.grad.flatten() for p in critic.parameters()])

    q32, g32 = run()
    set_low_precision(critic, torch.bfloat16)
    q16, g16 = run()
    assert q16.dtype == torch.float32 and all(p.grad.dtype == torch.float32 for p in critic.parameters())
    assert not torch.equal(q16, q32)
    torch.testing.assert_close(q16, q32, rtol=0.05, atol=0.02)
    assert torch.nn.functional.cosine_similarity(g16, g32, dim=0) > 0.99
    set_low_precision(critic, None)
    q_back, g_back = run()
    assert torch.equal(q_back, q32) and torch.equal(g_back, g32)


def test_a_large_batch_goes_through_an_mlp_in_chunks_of_rows_with_the_values_and_gradients_of_one_pass():
    """CQL's 7,680 sampled actions through a critic: in chunks of 512 rows in float32 (1,024 in bfloat16, half the
    bytes a row), with the values and weight gradients of one pass over the whole batch."""
    torch.manual_seed(0)
    net = mlp((14, 256, 256, 1), "relu")
    x = torch.randn(7680, 14)
    rows: list[int] = []
    net[0].register_forward_hook(lambda layer, inputs, out: rows.append(inputs[0].shape[0]))

    def run(forward):
        net.zero_grad()
        out = forward(x)
        out.square().sum().backward()
        return out.detach(), torch.cat([p.grad.flatten() for p in net.parameters()])

    chunked, chunked_grads = run(net)
    assert rows == [512] * 15
    rows.clear()
    whole, whole_grads = run(lambda batch: torch.nn.Sequential.forward(net, batch))
    assert rows == [7680]
    torch.testing.assert_close(chunked, whole, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(chunked_grads, whole_grads, rtol=1e-4, atol=1e-4)
    rows.clear()
    set_low_precision(net, torch.bfloat16)
    run(net)
    assert rows == [1024] * 7 + [512]


def test_a_bf16_cql_step_takes_the_float32_steps_gradients():
    """One CQL gradient step from the same weights on the same batch (its 3 x 10 sampled actions per state are the
    large products bfloat16 speeds up): each network's gradient points as the float32 step's does, and the losses
    agree to bfloat16's rounding."""
    cfg = CQLConfig(net_arch=(256, 256))
    generator = torch.Generator().manual_seed(1)
    batch = Transitions(
        obs=torch.randn(256, 11, generator=generator),
        actions=torch.rand(256, 3, generator=generator) * 2 - 1,
        rewards=torch.randn(256, generator=generator),
        next_obs=torch.randn(256, 11, generator=generator),
        terminated=(torch.rand(256, generator=generator) < 0.1).float(),
    )
    grads, losses = {}, {}
    for precision in ("fp32", "bf16"):
        algo = make_offline_algo("cql", cfg, 11, 3, False, torch.device("cpu"), 0, precision)
        losses[precision] = algo.update(batch, LocalSync(), 256)
        grads[precision] = {name: learned.params.grad.clone() for name, learned in algo.learned.items()}
    for name, grad in grads["fp32"].items():
        assert torch.nn.functional.cosine_similarity(grads["bf16"][name], grad, dim=0) > 0.99, name
    for key in ("losses/critic_loss", "losses/cql_penalty", "losses/actor_loss"):
        assert abs(losses["bf16"][key] - losses["fp32"][key]) < 0.01 * abs(losses["fp32"][key]), key
