"""ddp: equivalence with single, start-up agreement, KL agreement, straggler preemption."""

import dataclasses
import os
import socket
from pathlib import Path

import pytest
import torch
from gymnasium import spaces

from distributed import run_ranks
from distrl.algos.ppo import PPOAlgo
from distrl.algos.protocols import LocalSync
from distrl.config import ConfigError, PPOConfig, REINFORCEConfig, RunConfig, StrategyConfig, scaled
from distrl.data.packed import PackedBatch
from distrl.data.rollout import RolloutBatch
from distrl.nets import ActorCritic
from distrl.strategies.rendezvous import STORE_FD, store_socket
from distrl.training import OnPolicyTrainer
from reference import sac_algo

pytestmark = pytest.mark.multiprocess

N = 64
UPDATE_CFG = PPOConfig(
    n_envs=1,
    n_steps=N,
    batch_size=N,
    n_epochs=4,
    learning_rate=0.01,
    max_grad_norm=0.05,
    ent_coef=0.01,
    clip_range_vf=0.2,
)


def fixed_batch(seed: int = 0, n: int = N) -> RolloutBatch:
    agent = ActorCritic(4, spaces.Discrete(2), (16, 16), seed=0)
    g = torch.Generator().manual_seed(seed)
    obs = torch.randn(n, 4, generator=g)
    actions = torch.randint(0, 2, (n,), generator=g)
    valid = torch.ones(n)
    valid[::7] = 0.0
    return RolloutBatch(
        obs=obs,
        actions=actions,
        log_probs=agent.log_prob(obs, actions) + 0.2 * torch.randn(n, generator=g),
        values=torch.randn(n, generator=g),
        advantages=3 * torch.randn(n, generator=g) + 1,
        returns=torch.randn(n, generator=g),
        valid=valid,
        policy_version=0,
    )


def shard(batch: RolloutBatch, rank: int, world: int) -> RolloutBatch:
    size = batch.size // world
    part = slice(rank * size, (rank + 1) * size)
    tensors = {
        f.name: getattr(batch, f.name)[part]
        for f in dataclasses.fields(batch)
        if isinstance(getattr(batch, f.name), torch.Tensor)
    }
    return dataclasses.replace(batch, **tensors)


def update_on_shard(rank, world, cfg):
    from distrl.strategies.ddp import DistributedSync

    agent = ActorCritic(4, spaces.Discrete(2), (16, 16), seed=0)
    algo = PPOAlgo(dataclasses.replace(cfg, batch_size=cfg.batch_size // world), agent, seed=0)
    sync = DistributedSync(torch.device("cpu"), 60)
    metrics = algo.update(shard(fixed_batch(), rank, world), sync)
    return agent.params.data.clone(), {**metrics, "shared": sync.shared}


def single_update(cfg):
    agent = ActorCritic(4, spaces.Discrete(2), (16, 16), seed=0)
    metrics = PPOAlgo(cfg, agent, seed=0).update(fixed_batch(), LocalSync())
    return agent.params.data.clone(), metrics


def clip_then_average(cfg):
    """What clipping each worker's gradient before averaging would give (the wrong order)."""
    agents = [ActorCritic(4, spaces.Discrete(2), (16, 16), seed=0) for _ in range(2)]
    algos = [PPOAlgo(dataclasses.replace(cfg, batch_size=N // 2), a, seed=0) for a in agents]

    class ClipFirst(LocalSync):
        def gradients(self, grad, stats):
            count = float(stats[0])
            grad.div_(count).mul_(min(1.0, cfg.max_grad_norm / (float(grad.norm()) + 1e-6))).mul_(count)

    batch = fixed_batch()
    shards = [shard(batch, r, 2) for r in range(2)]
    valid_adv = batch.advantages[batch.valid > 0]
    mean_adv, std_adv = valid_adv.mean(), valid_adv.std(unbiased=False)  # global statistics, as ddp uses
    for _ in range(cfg.n_epochs):
        grads = []
        for algo, part in zip(algos, shards):
            table = PackedBatch.pack(part, (part.advantages - mean_adv) / (std_adv + 1e-8) * part.valid)
            stats = algo._minibatch_gradient(table.all_rows(), 0.2)
            ClipFirst().gradients(algo.agent.params.grad, stats)
            grads.append(algo.agent.params.grad / float(stats[0]))
        mean = (grads[0] + grads[1]) / 2
        for algo in algos:
            algo.agent.params.grad.copy_(mean)
            algo.optimizer.max_grad_norm = None
            algo.optimizer.step(cfg.learning_rate)
    return agents[0].params.data.clone()


@pytest.mark.parametrize("transport", ["shm", "gloo"])
def test_one_update_with_two_ranks_equals_single_process_with_binding_clip(transport):
    (p0, m0), (p1, _) = run_ranks(update_on_shard, 2, UPDATE_CFG, env={"DISTRL_DDP_TRANSPORT": transport})
    assert m0["shared"] == (transport == "shm")  # one machine's ranks sum through shared memory unless told not to
    single, metrics = single_update(UPDATE_CFG)
    assert metrics["losses/grad_norm"] > 5 * UPDATE_CFG.max_grad_norm  # the clip binds
    assert torch.equal(p0, p1)
    torch.testing.assert_close(p0, single, rtol=0, atol=1e-6)
    assert m0["losses/gradient_steps"] == metrics["losses/gradient_steps"] == UPDATE_CFG.n_epochs
    wrong = clip_then_average(UPDATE_CFG)
    assert float((wrong - single).abs().max()) > 1e-4  # so clipping before the sync would fail this test


def kl_update(rank, world):
    from distrl.strategies.ddp import DistributedSync

    agent = ActorCritic(4, spaces.Discrete(2), (16, 16), seed=0)
    cfg = PPOConfig(n_envs=1, n_steps=32, batch_size=8, n_epochs=5, learning_rate=1e-3, target_kl=0.02)
    algo = PPOAlgo(cfg, agent, seed=rank)
    batch = shard(fixed_batch(), rank, world)
    if rank == 1:  # far-off behaviour log-probs: a large local KL on this rank only
        batch = dataclasses.replace(batch, log_probs=batch.log_probs - 3.0)
    metrics = algo.update(batch, DistributedSync(torch.device("cpu"), 30))
    return metrics["losses/gradient_steps"], metrics["losses/stopped_early"], metrics["losses/approx_kl"]


def test_target_kl_stop_agrees_on_all_ranks():
    (steps0, stop0, kl0), (steps1, stop1, kl1) = run_ranks(kl_update, 2, timeout=90)
    assert stop0 == stop1 == 1.0
    assert steps0 == steps1 == 0  # the first minibatch already exceeds 1.5 * target_kl globally
    assert kl0 == kl1 > 0.03


def startup(rank, world):
    from distrl.strategies.ddp import DistributedSync, checksum

    run = RunConfig(env="CartPole-v1", total_steps=10_000, seed=rank * 17, vec="sync", quiet=True)
    trainer = OnPolicyTrainer(
        run, PPOConfig(n_envs=2, n_steps=8, batch_size=16), sync=DistributedSync(torch.device("cpu"), 30)
    )
    before = checksum(trainer.agent.params.data)
    trainer.broadcast_state()
    trainer.sync.verify_identical(trainer.agent.params.data, "parameters")
    after = checksum(torch.cat([trainer.agent.params.data, trainer.algo.optimizer.exp_avg]))
    trainer.close()
    return before, after


def test_startup_broadcast_gives_every_rank_rank0s_parameters():
    (before0, after0), (before1, after1) = run_ranks(startup, 2)
    assert before0 != before1  # different seeds: different initial weights
    assert after0 == after1


def whole_run(rank, world, cfg, iterations):
    from distrl.strategies.ddp import DistributedSync

    run = RunConfig(
        env="CartPole-v1", total_steps=iterations * cfg.rollout_size * world, seed=5, vec="sync", quiet=True
    )
    trainer = OnPolicyTrainer(run, cfg, sync=DistributedSync(torch.device("cpu"), 30))
    trainer.broadcast_state()
    trainer.train()
    trainer.close()
    return trainer.agent.params.data.clone(), trainer.steps


@pytest.mark.parametrize("recompute", [False, True], ids=["advantages-once", "recompute-advantage"])
def test_whole_run_with_two_ranks_equals_single_process_on_the_same_envs(recompute):
    cfg = PPOConfig(
        n_envs=4,
        n_steps=16,
        batch_size=64,
        n_epochs=3,
        learning_rate=3e-3,
        normalize_obs=True,
        recompute_advantage=recompute,
    )
    (p0, steps), (p1, _) = run_ranks(whole_run, 2, cfg, 4)
    single_cfg = dataclasses.replace(cfg, n_envs=8, batch_size=128)
    run = RunConfig(env="CartPole-v1", total_steps=steps, seed=5, vec="sync", quiet=True)
    single = OnPolicyTrainer(run, single_cfg)
    single.train()
    single.close()
    assert single.steps == steps == 4 * 128
    assert torch.equal(p0, p1)
    torch.testing.assert_close(p0, single.agent.params.data, rtol=0, atol=2e-5)


def test_one_rank_equals_single_process_bit_for_bit():
    cfg = PPOConfig(n_envs=4, n_steps=16, batch_size=32, n_epochs=2, max_grad_norm=0.1, normalize_obs=True)
    [(params, steps)] = run_ranks(whole_run, 1, cfg, 3)
    single = OnPolicyTrainer(RunConfig(env="CartPole-v1", total_steps=steps, seed=5, vec="sync", quiet=True), cfg)
    single.train()
    single.close()
    assert steps == single.steps == 3 * 64
    assert torch.equal(params, single.agent.params.data)


def straggler(rank, world):
    from distrl.strategies.ddp import DistributedSync

    strategy = StrategyConfig(strategy="ddp", workers=2, sync_frac=0.5, min_rollout_frac=0.25)
    cfg = PPOConfig(n_envs=1, n_steps=64, batch_size=16, n_epochs=1)
    run = RunConfig(env="distrl_testenvs:SlowOnRank1CartPole", total_steps=10**6, seed=0, vec="sync", quiet=True)
    trainer = OnPolicyTrainer(run, cfg, sync=DistributedSync(torch.device("cpu"), 30), strategy=strategy)
    trainer.broadcast_state()
    rows = []
    for _ in range(3):
        trainer.train(stop_at=trainer.steps + 1)
        m = trainer.last_metrics
        rows.append((m["time/collected_steps"], m["charts/local_samples"], m["losses/trained_samples"]))
    trainer.close()
    return rows


def test_straggler_preemption_follows_the_fast_rank_and_trains_on_every_sample():
    fast, slow = run_ranks(straggler, 2, timeout=120)
    for (f_steps, f_samples, total), (s_steps, s_samples, total1) in zip(fast, slow):
        assert f_steps == 64
        # the slow rank stopped when the fast one finished: after at least min_rollout_frac of its rollout, and
        # well short of the whole (its env takes 10 ms a step, the fast rank's whole rollout well under that)
        assert 16 <= s_steps < 64
        assert total == total1 == f_samples + s_samples  # the update saw every collected sample


def test_equivalent_scaling_divides_steps_and_multiplies_lr():
    cfg = PPOConfig(n_envs=2, n_steps=512, batch_size=64, learning_rate=1e-3)
    out = scaled(cfg, StrategyConfig(strategy="ddp", workers=4, scaling="equivalent"), 4)
    assert (out.n_steps, out.learning_rate) == (128, 4e-3)
    assert scaled(cfg, StrategyConfig(strategy="ddp", workers=4), 4) is cfg
    with pytest.raises(ConfigError, match="n_steps=512 .*divisible by the 3 workers"):
        scaled(cfg, StrategyConfig(strategy="ddp", workers=3, scaling="equivalent"), 3)
    with pytest.raises(ConfigError, match="workers=2 .* --strategy ddp"):
        StrategyConfig(workers=2)


def test_equivalent_scaling_of_reinforce_divides_its_episodes_and_keeps_its_learning_rate():
    # One gradient step per iteration, already the mean over every worker's episodes: N workers with
    # episodes_per_iter / N each make the batch and the step of one process.
    cfg = REINFORCEConfig(episodes_per_iter=16, learning_rate=5e-3)
    out = scaled(cfg, StrategyConfig(strategy="ddp", workers=4, scaling="equivalent"), 4)
    assert (out.episodes_per_iter, out.learning_rate) == (4, 5e-3)
    with pytest.raises(ConfigError, match="episodes_per_iter=16 .*divisible by the 3 workers"):
        scaled(cfg, StrategyConfig(strategy="ddp", workers=3, scaling="equivalent"), 3)


def sac_step_on_shard(rank, world, cfg, batch, eps_next, eps_pi):
    from distrl.strategies.ddp import DistributedSync

    half = batch.size // world
    part = slice(rank * half, (rank + 1) * half)
    algo = sac_algo(cfg, seed=0)
    shard_batch = type(batch)(
        *(getattr(batch, f)[part] for f in ("obs", "actions", "rewards", "next_obs", "terminated"))
    )
    algo.update(shard_batch, DistributedSync(torch.device("cpu"), 30), eps_next[part], eps_pi[part])
    return algo.actor.params.data.clone(), algo.critic.params.data.clone(), algo.critic_target.params.data.clone()


def test_one_sac_gradient_step_on_two_ranks_equals_single_process():
    from distrl.config import SACConfig
    from distrl.data.replay import Transitions

    cfg = SACConfig(batch_size=32, buffer_size=100, net_arch=(16, 16), ent_coef="auto_0.3")
    g = torch.Generator().manual_seed(0)
    batch = Transitions(
        torch.randn(32, 3, generator=g),
        torch.rand(32, 2, generator=g) * 2 - 1,
        torch.randn(32, generator=g),
        torch.randn(32, 3, generator=g),
        (torch.rand(32, generator=g) < 0.2).float(),
    )
    eps_next, eps_pi = torch.randn(32, 2, generator=g), torch.randn(32, 2, generator=g)
    results = run_ranks(sac_step_on_shard, 2, cfg, batch, eps_next, eps_pi)
    single = sac_algo(cfg, seed=0)
    single.update(batch, LocalSync(), eps_next, eps_pi)
    for actor, critic, target in results:
        torch.testing.assert_close(actor, single.actor.params.data, rtol=0, atol=1e-6)
        torch.testing.assert_close(critic, single.critic.params.data, rtol=0, atol=1e-6)
        torch.testing.assert_close(target, single.critic_target.params.data, rtol=0, atol=1e-6)
    assert torch.equal(results[0][2], results[1][2])  # target critics identical across ranks
    assert not torch.equal(results[0][1], sac_algo(cfg, seed=0).critic.params.data)


def test_a_restartable_group_on_several_torchrun_nodes_sharing_the_agents_store_is_refused(monkeypatch):
    from distrl.strategies.ddp import join_group

    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv("TORCHELASTIC_MAX_RESTARTS", "2")
    monkeypatch.setenv("GROUP_WORLD_SIZE", "2")
    with pytest.raises(
        ConfigError, match="max_restarts=2 on 2 torchrun nodes needs TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1"
    ):
        join_group("gloo", 5.0)


def shared_sums(rank, world):
    from distrl.strategies.dist_sync import DistributedSync

    sync = DistributedSync(torch.device("cpu"), 2.0)
    out = []
    for step in range(3):  # more calls than the two alternating slot sets
        grad = torch.arange(5, dtype=torch.float32) * (rank + 1) + step
        stats = torch.tensor([float(rank + 1)], dtype=torch.float32)
        sync.gradients(grad, stats)
        out.append((grad.tolist(), stats.tolist()))
    leftovers = [p.name for p in Path("/dev/shm").glob("distrl-*")]
    if rank == 1:
        return out, leftovers, None
    try:  # rank 1 has returned: the next sum waits for it and gives up, naming it
        sync.gradients(torch.zeros(5), torch.zeros(1))
    except RuntimeError as exc:
        return out, leftovers, str(exc)
    return out, leftovers, None


def store_port_and_sum(rank, world):
    import torch.distributed as dist

    total = torch.tensor([rank + 1.0])
    dist.all_reduce(total)
    return int(os.environ["MASTER_PORT"]), STORE_FD in os.environ, total.item()


def test_rank_0_serves_the_store_on_the_socket_its_launcher_bound_so_no_one_can_take_the_port_first():
    held = store_socket()
    with held, socket.socket() as other:
        other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store's own bind does
        with pytest.raises(OSError):  # chosen and held at once: no other process can bind it any more
            other.bind(held.getsockname())
    # run_ranks holds its socket until the ranks are done: a store binding the port itself would fail
    (port0, left0, sum0), (port1, left1, sum1) = run_ranks(store_port_and_sum, 2)
    assert port0 == port1 and sum0 == sum1 == 3.0
    assert not left0 and not left1  # rank 0 took the descriptor over; the others never had it


def test_shared_memory_sums_are_exact_on_every_rank_leave_no_file_and_name_a_rank_that_never_comes():
    (out0, left0, error), (out1, left1, _) = run_ranks(shared_sums, 2)
    for step in range(3):
        expected = [i * 3 + 2 * step for i in range(5)]  # i*1 + step + i*2 + step
        assert out0[step] == out1[step] == (expected, [3.0])
    assert not left0 and not left1  # the file's name goes once both ranks have mapped it
    assert error == "rank(s) [1] did not send their gradients within 2s"


def test_ddp_ranks_on_cuda_need_a_gpu_each(monkeypatch):
    """NCCL refuses two ranks on one GPU (seen on an H200: 'Duplicate GPU detected'): say so before launching."""
    import torch

    from distrl.config import ConfigError, StrategyConfig
    from distrl.strategies.launch import check_gpus_per_rank

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="workers=2 is not allowed with --device cuda here: NCCL needs one GPU"):
        check_gpus_per_rank("cuda", StrategyConfig(strategy="ddp", workers=2))
    check_gpus_per_rank("cuda", StrategyConfig(strategy="ddp", workers=1))
    check_gpus_per_rank("cpu", StrategyConfig(strategy="ddp", workers=2))  # gloo: any number of ranks
