"""SAC on the module path: equal to the closed-form networks on the same weights; Dict observations; user modules."""

import gymnasium as gym
import numpy as np
import pytest
import torch

from distrl.algos.protocols import LocalSync
from distrl.algos.sac import SACAlgo
from distrl.config import ConfigError, RunConfig, SACConfig
from distrl.data.replay import Transitions
from distrl.nets.encoders import Flatten
from distrl.nets.factory import make_sac_networks
from distrl.nets.sac import SquashedGaussianActor, TwinQ
from distrl.nets.sac_module import ModuleSquashedActor, ModuleTwinQ, SACActorModule, TwinQModule
from distrl.training import OffPolicyTrainer

OBS, ACT = gym.spaces.Box(-1, 1, (3,), np.float32), gym.spaces.Box(-1, 1, (2,), np.float32)
CFG = SACConfig(batch_size=16, buffer_size=100, net_arch=(16, 16), ent_coef="auto_0.3", learning_rate=3e-3)


def module_names(name: str) -> str:
    """A closed-form SAC parameter's name in the module networks ('actor.1.weight' -> 'head.layers.1.weight')."""
    net, layer, kind = name.split(".")
    if net == "actor":
        return f"head.layers.{layer}.{kind}"
    return f"heads.{int(net[1]) - 1}.layers.{layer}.{kind}"


def copy_into_modules(closed, module) -> None:
    for source, target in (
        (closed.actor, module.actor),
        (closed.critic, module.critic),
        (closed.critic_target, module.critic_target),
    ):
        for name, value in source.params.state_dict().items():
            mapped = name if name == "log_alpha" else module_names(name)
            target.params.view(mapped).copy_(value.t() if name.endswith("weight") else value)


def both_paths():
    closed = SACAlgo(CFG, make_sac_networks(OBS, ACT, CFG, "cpu", 0), torch.device("cpu"), 0)

    def built(o, a, c):
        return SACActorModule(Flatten((3,)), 2, c.net_arch, c.activation), TwinQModule(
            Flatten((3,)), 2, c.net_arch, c.activation
        )

    module = SACAlgo(CFG, make_sac_networks(OBS, ACT, CFG, "cpu", 0, built), torch.device("cpu"), 0)
    assert isinstance(closed.actor, SquashedGaussianActor) and isinstance(closed.critic, TwinQ)
    assert isinstance(module.actor, ModuleSquashedActor) and isinstance(module.critic, ModuleTwinQ)
    copy_into_modules(closed, module)
    return closed, module


def test_sac_modules_match_the_closed_form_networks_step_for_step():
    closed, module = both_paths()
    g = torch.Generator().manual_seed(1)
    for _ in range(4):
        batch = Transitions(
            torch.randn(16, 3, generator=g),
            torch.rand(16, 2, generator=g) * 2 - 1,
            torch.randn(16, generator=g),
            torch.randn(16, 3, generator=g),
            (torch.rand(16, generator=g) < 0.2).float(),
        )
        eps_next, eps_pi = torch.randn(16, 2, generator=g), torch.randn(16, 2, generator=g)
        m_closed = closed.update(batch, LocalSync(), eps_next, eps_pi)
        m_module = module.update(batch, LocalSync(), eps_next, eps_pi)
        assert m_closed["losses/actor_loss"] == pytest.approx(m_module["losses/actor_loss"], abs=1e-5)
    start = SACAlgo(CFG, make_sac_networks(OBS, ACT, CFG, "cpu", 0), torch.device("cpu"), 0)
    assert (closed.actor.params.data - start.actor.params.data).abs().max() > 1e-3  # the actor did move
    for name, value in closed.actor.params.state_dict().items():
        got = module.actor.params.view(module_names(name))
        torch.testing.assert_close(got, value.t() if name.endswith("weight") else value, rtol=0, atol=1e-6)
    for name, value in closed.critic.params.state_dict().items():
        got = module.critic.params.view(name if name == "log_alpha" else module_names(name))
        torch.testing.assert_close(got, value.t() if name.endswith("weight") else value, rtol=0, atol=1e-6)
    obs = np.random.default_rng(0).uniform(-1, 1, (5, 3)).astype(np.float32)
    np.testing.assert_allclose(module.actor.act(obs, None), closed.actor.act(obs, None), rtol=0, atol=1e-6)


def test_the_critics_action_gradient_reaches_the_actor_and_leaves_the_critic_alone():
    _, module = both_paths()
    obs, eps = torch.randn(4, 3), torch.randn(4, 2)
    pi = module.actor.sample(obs, eps)
    fwd = module.critic.forward(obs, pi.action)
    expected = torch.autograd.grad(-fwd.q1.sum(), fwd.action, retain_graph=True)[0]
    module.critic.params.grad.fill_(7.0)
    d_action = module.critic.action_grad(fwd, -torch.ones(4), torch.zeros(4))
    assert torch.all(module.critic.params.grad == 7.0)  # the critic's own gradient untouched
    torch.testing.assert_close(d_action, expected)
    module.actor.backward(pi, d_action, torch.zeros(4))
    assert module.actor.params.grad.abs().sum() > 0


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_sac_learns_a_task_that_needs_both_keys_of_a_dict_observation(precision):
    run = RunConfig(
        algo="sac",
        env="distrl_spaceenvs:DictTargetEnv",
        total_steps=2_500,
        seed=0,
        vec="sync",
        quiet=True,
        precision=precision,
    )
    trainer = OffPolicyTrainer(
        run, SACConfig(net_arch=(64, 64), learning_rate=1e-3, batch_size=64, learning_starts=200, buffer_size=10_000)
    )
    assert isinstance(trainer.algo.actor, ModuleSquashedActor)
    assert trainer.replay.obs.dtype == np.uint8  # Dict observations stored as packed rows
    trainer.train()
    mean, _ = trainer.evaluate_now()
    trainer.close()
    assert mean > -1.0  # 8 steps; ignoring "flip" costs about -4, random actions about -5


def test_a_sac_policy_of_the_wrong_kind_is_a_clear_error():
    with pytest.raises(ConfigError, match="for sac a policy factory returns \\(actor, critic\\) modules"):
        make_sac_networks(OBS, ACT, CFG, "cpu", 0, lambda o, a, c: torch.nn.Linear(3, 4))
    actor = ModuleSquashedActor(torch.nn.Linear(3, 3), 2, torch.device("cpu"))
    with pytest.raises(ConfigError, match="must return \\[batch, 4\\]"):
        actor.act(np.zeros((1, 3), np.float32), None)


def test_sac_refuses_discrete_actions_before_training():
    with pytest.raises(ConfigError, match="Discrete action space; sac needs Box"):
        OffPolicyTrainer(RunConfig(algo="sac", env="distrl_spaceenvs:QuadrantEnv", vec="sync", quiet=True), SACConfig())


def test_bf16_runs_sacs_modules_in_bfloat16_and_keeps_parameters_gradients_and_outputs_float32():
    space = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)  # the Nature CNN's smallest input
    cfg = SACConfig(batch_size=16, buffer_size=100, net_arch=(32,), ent_coef="auto_0.3")
    algos = {
        p: SACAlgo(cfg, make_sac_networks(space, ACT, cfg, "cpu", 0, precision=p), torch.device("cpu"), 0)
        for p in ("fp32", "bf16")
    }
    assert torch.equal(algos["fp32"].critic.params.data, algos["bf16"].critic.params.data)  # one initialisation
    conv_out = {p: set() for p in algos}
    for p, algo in algos.items():
        for net in (algo.actor.module, algo.critic.module):
            for layer in net.modules():
                if isinstance(layer, torch.nn.Conv2d):
                    layer.register_forward_hook(lambda m, i, o, p=p: conv_out[p].add(o.dtype))
    g = torch.Generator().manual_seed(0)
    obs, next_obs = (torch.randint(0, 256, (16, 4, 36, 36), generator=g, dtype=torch.uint8) for _ in range(2))
    batch = Transitions(
        obs, torch.rand(16, 2, generator=g) * 2 - 1, torch.randn(16, generator=g), next_obs, torch.zeros(16)
    )
    eps_next, eps_pi = torch.randn(16, 2, generator=g), torch.randn(16, 2, generator=g)
    losses, grads = {}, {}
    for p, algo in algos.items():
        metrics = algo.update(batch, LocalSync(), eps_next, eps_pi)
        losses[p] = metrics["losses/critic_loss"]
        grads[p] = torch.cat([algo.critic.params.grad, algo.actor.params.grad])
        assert algo.critic.params.data.dtype == grads[p].dtype == torch.float32
        assert algo.actor.act(obs.numpy()[:2], None).dtype == np.float32
    assert conv_out == {"fp32": {torch.float32}, "bf16": {torch.bfloat16}}
    assert not torch.equal(grads["fp32"], grads["bf16"])  # the arithmetic differed...
    assert torch.nn.functional.cosine_similarity(grads["fp32"], grads["bf16"], dim=0) > 0.99  # ...by rounding only
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)
