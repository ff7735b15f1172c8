"""The offline algorithms' modules against torch's own distributions."""

import torch

from distrl.nets.offline import LOG_STD_MAX, GaussianActor


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
