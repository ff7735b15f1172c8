"""Every strategy with the module path: a CNN on uint8 images, a user's module on vectors stepped by
Gymnasium and by envpool, and a recurrent policy on a memory task.

Each distributed run is compared with single-process PPO on the same seed and data, as the
closed-form path's equivalence tests do.
"""

import dataclasses

import pytest
import torch
from test_decoupled import decoupled_rank

from distributed import run_ranks
from distrl.config import PPOConfig, RunConfig, StrategyConfig
from distrl.nets import ModuleAgent
from distrl.training import OnPolicyTrainer

pytestmark = pytest.mark.multiprocess

# A 6x6 uint8 image (the small CNN) passed through env kwargs, so every process must reapply them.
PIXELS = RunConfig(
    env="distrl_spaceenvs:QuadrantEnv", env_kwargs=("size=6", "length=4"), seed=4, vec="sync", quiet=True
)
USER_NET = RunConfig(env="CartPole-v1", policy="distrl_spaceenvs:tiny_net", seed=4, vec="sync", quiet=True)
CFG = PPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=2, learning_rate=3e-3, net_arch=(16,))
# envpool's C++ pool: every process makes its own (env i of a pool seeded s gets s + i, as with Gymnasium's
# vector envs), so the split data equals the single process's.
ENVPOOL = USER_NET.replace(vec="envpool")
# A recurrent policy: sequences travel with their episode starts and initial states (CueEnv's episodes
# of 4 steps end inside every fragment, so the state restarts in them).
MEMORY = RunConfig(env="distrl_memoryenvs:CueEnv", seed=4, vec="sync", quiet=True)
LSTM = dataclasses.replace(CFG, core="lstm", core_size=8)
RUNS = {"pixels": (PIXELS, CFG), "user-net": (USER_NET, CFG), "envpool": (ENVPOOL, CFG), "lstm": (MEMORY, LSTM)}


def single_params(run: RunConfig, cfg: PPOConfig, steps: int) -> torch.Tensor:
    trainer = OnPolicyTrainer(run.replace(total_steps=steps), cfg)
    assert isinstance(trainer.agent, ModuleAgent)
    trainer.train()
    trainer.close()
    assert trainer.steps == steps
    return trainer.agent.params.data.clone()


def ddp_rank(rank, world, run, cfg, iterations):
    from distrl.strategies.ddp import DistributedSync

    trainer = OnPolicyTrainer(
        run.replace(total_steps=iterations * cfg.rollout_size * world),
        cfg,
        sync=DistributedSync(torch.device("cpu"), 30),
    )
    trainer.broadcast_state()
    trainer.train()
    trainer.close()
    return trainer.agent.params.data.clone()


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.heavy
def test_ddp_with_a_module_equals_single_process(name):
    run, cfg = RUNS[name]
    p0, p1 = run_ranks(ddp_rank, 2, run, cfg, 3)
    single = single_params(run, dataclasses.replace(cfg, n_envs=4, batch_size=64), 3 * 64)
    assert torch.equal(p0, p1)
    torch.testing.assert_close(p0, single, rtol=0, atol=2e-5)


@pytest.mark.parametrize(
    "name", [pytest.param(name, marks=() if name == "pixels" else pytest.mark.heavy) for name in RUNS]
)  # decoupled's one equivalence test in the default run: pixels, the others heavy
def test_decoupled_with_a_module_equals_single_process(name):
    # pixels: the rollout's uint8 images are what the player scatters to the trainers
    run, cfg = RUNS[name]
    (history, params), *trainers = run_ranks(decoupled_rank, 3, True, 3, run.replace(total_steps=3 * 32), cfg)
    assert all(trainer == [checksum for _, checksum in history] for trainer in trainers)
    torch.testing.assert_close(params, single_params(run, cfg, 3 * 32), rtol=0, atol=1e-6)


@pytest.mark.heavy
def test_decoupled_scatters_a_recurrent_rollout_in_whole_sequences():
    # two trainers, one environment's sequence each: their summed gradient is the single process's
    run, cfg = RUNS["lstm"]
    (history, params), *trainers = run_ranks(decoupled_rank, 3, False, 3, run.replace(total_steps=3 * 32), cfg)
    assert all(trainer == [checksum for _, checksum in history] for trainer in trainers)
    torch.testing.assert_close(params, single_params(run, cfg, 3 * 32), rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", RUNS)
@pytest.mark.heavy
def test_actor_learner_with_a_module_equals_single_process(ray_local, name):
    from distrl.strategies.actor_learner import RemoteCollector
    from distrl.strategies.actors import RayActors

    run, cfg = RUNS[name]
    strategy = StrategyConfig(strategy="actor-learner", workers=2)
    remote = OnPolicyTrainer(
        run.replace(total_steps=3 * 64),
        cfg,
        strategy=strategy,
        collector_factory=lambda t: RemoteCollector(t, strategy, RayActors(ray_local)),
    )
    remote.train()
    remote.close()
    single = single_params(run, dataclasses.replace(cfg, n_envs=4), 3 * 64)
    torch.testing.assert_close(remote.agent.params.data, single, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", RUNS)
def test_pipeline_with_a_module_one_fragment_ahead_equals_single_process(ray_local, name):
    from distrl.strategies.actors import RayActors
    from distrl.strategies.pipeline_ppo import AsyncCollector

    run, cfg = RUNS[name]
    strategy = StrategyConfig(strategy="pipeline", workers=1, queue_size=1)
    remote = OnPolicyTrainer(
        run.replace(total_steps=4 * 32),
        cfg,
        strategy=strategy,
        collector_factory=lambda t: AsyncCollector(t, strategy, RayActors(ray_local)),
    )
    remote.train()
    remote.close()
    assert remote.policy_version == 4
    torch.testing.assert_close(remote.agent.params.data, single_params(run, cfg, 4 * 32), rtol=0, atol=1e-6)


@pytest.mark.heavy
def test_actor_learner_runs_recurrent_reinforce_deterministically(ray_local):
    from distrl.config import REINFORCEConfig
    from distrl.strategies.actor_learner import RemoteCollector
    from distrl.strategies.actors import RayActors
    from distrl.training import EpisodicTrainer

    def params(seed):
        strategy = StrategyConfig(strategy="actor-learner", workers=2)
        run = MEMORY.replace(algo="reinforce", seed=seed, total_steps=10**9)
        trainer = EpisodicTrainer(
            run,
            REINFORCEConfig(n_envs=2, episodes_per_iter=8, core="lstm", core_size=8),
            strategy=strategy,
            collector_factory=lambda t: RemoteCollector(t, strategy, RayActors(ray_local)),
        )
        for _ in range(3):
            trainer.train(stop_at=trainer.steps + 1)
        trainer.close()
        assert trainer.policy_version == 3
        return trainer.agent.params.data.clone()

    a, b, c = params(0), params(0), params(1)
    assert torch.equal(a, b) and not torch.equal(a, c)
