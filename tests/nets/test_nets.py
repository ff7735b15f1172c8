import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from distrl.nets import (
    MLP,
    ActorCritic,
    ParamBuffer,
    categorical_grad,
    categorical_terms,
    gaussian_grad,
    gaussian_terms,
    mlp_shapes,
)
from reference import distribution, functional_params


@pytest.mark.parametrize("activation", ["tanh", "relu"])
def test_mlp_backward_equals_autograd(activation):
    torch.manual_seed(0)
    sizes = (5, 7, 6, 3)
    buf = ParamBuffer(mlp_shapes("m", sizes))
    net = MLP(buf, "m", sizes, activation)
    net.init_orthogonal(math.sqrt(2), 1.0, torch.Generator().manual_seed(0))
    x = torch.randn(11, 5)
    grad_out = torch.randn(11, 3)
    out, inputs = net.forward_cached(x)
    buf.grad.zero_()
    d_input = net.backward(inputs, grad_out, input_grad=True)

    ref_out, ref_grad, ref_input = autograd_mlp(buf, x, grad_out, activation, torch.float32)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(buf.grad, ref_grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d_input, ref_input, rtol=1e-5, atol=1e-6)


def autograd_mlp(buf, x, grad_out, activation, dtype):
    """Output, buffer gradient and input gradient of the 3-layer MLP "m" by autograd, each product's operands
    and result in ``dtype``."""
    flat = buf.data.clone().requires_grad_(True)
    xr = x.clone().requires_grad_(True)
    h = xr
    for i in range(3):
        s, e = buf.offsets[f"m.{i}.weight"]
        w = flat[s:e].view(buf.shapes[f"m.{i}.weight"])
        s, e = buf.offsets[f"m.{i}.bias"]
        h = (h.to(dtype) @ w.to(dtype)).float() + flat[s:e]
        if i < 2:
            h = torch.tanh(h) if activation == "tanh" else torch.relu(h)
    (h * grad_out).sum().backward()
    return h.detach(), flat.grad, xr.grad


def test_bf16_products_round_their_operands_keep_float32_around_them_and_see_buffer_writes_at_once():
    torch.manual_seed(0)
    sizes = (17, 256, 256, 6)
    buf = ParamBuffer(mlp_shapes("m", sizes))
    half, full = MLP(buf, "m", sizes, "relu", torch.bfloat16), MLP(buf, "m", sizes, "relu")
    half.init_uniform(torch.Generator().manual_seed(0))
    x, grad_out = torch.randn(64, 17), torch.randn(64, 6)

    out, inputs = half.forward_cached(x)
    buf.grad.zero_()
    d_input = half.backward(inputs, grad_out, input_grad=True)
    assert out.dtype == buf.grad.dtype == d_input.dtype == torch.float32
    ref_out, ref_grad, ref_input = autograd_mlp(buf, x, grad_out, "relu", torch.bfloat16)
    torch.testing.assert_close(out, ref_out, rtol=1e-2, atol=1e-3)
    torch.testing.assert_close(buf.grad, ref_grad, rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(d_input, ref_input, rtol=2e-2, atol=1e-3)
    full_out, full_grad, _ = autograd_mlp(buf, x, grad_out, "relu", torch.float32)
    assert not torch.equal(out, full_out)  # rounded, so not float32's result...
    torch.testing.assert_close(out, full_out, rtol=5e-2, atol=5e-3)  # ...but the same function
    assert torch.nn.functional.cosine_similarity(buf.grad, full_grad, dim=0) > 0.999
    buf.view("m.2.bias").add_(1.0)  # an optimizer step, a Polyak update: seen by the next product
    torch.testing.assert_close(half(x), out + 1.0)
    torch.testing.assert_close(full(x), full_out + 1.0)


def test_backward_overwrite_mode_ignores_stale_gradients():
    sizes = (3, 4, 2)
    buf = ParamBuffer(mlp_shapes("m", sizes))
    net = MLP(buf, "m", sizes, "tanh")
    net.init_orthogonal(1.0, 1.0, torch.Generator().manual_seed(1))
    x, g = torch.randn(6, 3), torch.randn(6, 2)
    _, inputs = net.forward_cached(x)
    buf.grad.zero_()
    net.backward(inputs, g)
    expected = buf.grad.clone()
    buf.grad.fill_(123.0)
    net.backward(inputs, g, accumulate=False)
    torch.testing.assert_close(buf.grad, expected)


def test_categorical_terms_and_gradient_match_torch_distributions():
    torch.manual_seed(0)
    logits = torch.randn(9, 4, requires_grad=True)
    actions = torch.randint(0, 4, (9,))
    d_lp, d_ent = torch.randn(9), torch.randn(9)
    dist = torch.distributions.Categorical(logits=logits)
    ref = (dist.log_prob(actions) * d_lp + dist.entropy() * d_ent).sum()
    ref.backward()
    terms = categorical_terms(logits.detach(), actions)
    torch.testing.assert_close(terms.log_prob, dist.log_prob(actions).detach())
    torch.testing.assert_close(terms.entropy, dist.entropy().detach())
    torch.testing.assert_close(categorical_grad(terms, actions, d_lp, d_ent), logits.grad, rtol=1e-5, atol=1e-6)


def test_gaussian_terms_and_gradient_match_torch_distributions():
    torch.manual_seed(0)
    mean = torch.randn(7, 3, requires_grad=True)
    log_std = torch.tensor([-0.5, 0.0, 0.3], requires_grad=True)
    actions = torch.randn(7, 3)
    d_lp, d_ent = torch.randn(7), torch.randn(7)
    dist = torch.distributions.Independent(torch.distributions.Normal(mean, log_std.exp()), 1)
    ((dist.log_prob(actions) * d_lp) + dist.entropy() * d_ent).sum().backward()
    terms = gaussian_terms(mean.detach(), log_std.detach(), actions)
    torch.testing.assert_close(terms.log_prob, dist.log_prob(actions).detach())
    torch.testing.assert_close(terms.entropy, dist.entropy().detach())
    d_mean, d_log_std = gaussian_grad(terms, d_lp, d_ent)
    torch.testing.assert_close(d_mean, mean.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d_log_std, log_std.grad, rtol=1e-5, atol=1e-6)


def test_gaussian_log_prob_by_hand():
    # N(0.5 | mean 0, std 1): -0.5 * 0.25 - 0.5 log(2 pi)
    terms = gaussian_terms(torch.zeros(1, 1), torch.zeros(1), torch.full((1, 1), 0.5))
    assert float(terms.log_prob) == pytest.approx(-0.125 - 0.5 * math.log(2 * math.pi))


def test_act_samples_by_inverse_cdf_and_deterministic_argmax():
    agent = ActorCritic(2, spaces.Discrete(3), (8,), seed=0)
    obs = np.zeros((1, 2), np.float32)
    with torch.no_grad():
        agent.params.view("policy.1.weight").zero_()
        agent.params.view("policy.1.bias").copy_(torch.log(torch.tensor([0.2, 0.5, 0.3])))
    assert agent.act(obs, None)[0] == 1
    picks = [int(agent.act(obs, np.array([u], np.float32))[0]) for u in (0.1, 0.25, 0.69, 0.71, 0.99)]
    assert picks == [0, 1, 1, 2, 2]


def test_gaussian_actions_are_clipped_for_the_env_only():
    space = spaces.Box(-1.0, 1.0, (2,), np.float32)
    agent = ActorCritic(3, space, (8,), log_std_init=0.0, seed=0)
    raw = agent.act(np.zeros((4, 3), np.float32), np.full((4, 2), 5.0, np.float32))
    assert (np.abs(raw) > 1.0).all()
    assert (np.abs(agent.env_action(raw)) <= 1.0).all()


def test_orthogonal_init_gains_and_seed_determinism():
    a = ActorCritic(4, spaces.Discrete(2), (64, 64), seed=3)
    b = ActorCritic(4, spaces.Discrete(2), (64, 64), seed=3)
    torch.testing.assert_close(a.params.data, b.params.data, rtol=0, atol=0)
    w = a.params.view("policy.1.weight")  # [64, 64], gain sqrt(2): W^T W = 2 I
    torch.testing.assert_close(w.t() @ w, 2 * torch.eye(64), atol=1e-4, rtol=0)
    head = a.params.view("policy.2.weight")
    assert float(head.norm(dim=0).max()) == pytest.approx(0.01, rel=1e-3)


def test_reference_distribution_helper_agrees_with_agent_log_prob():
    agent = ActorCritic(4, spaces.Discrete(2), (16,), seed=0)
    obs, actions = torch.randn(5, 4), torch.randint(0, 2, (5,))
    _, views = functional_params(agent)
    torch.testing.assert_close(agent.log_prob(obs, actions), distribution(agent, views, obs).log_prob(actions).detach())
