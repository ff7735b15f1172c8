"""The pipeline on Monarch (``--engine monarch``): same actors, process meshes, weights through RDMA buffers."""

import os
import signal

import numpy as np
import pytest
import torch

from distrl.config import ConfigError, PPOConfig, RunConfig, StrategyConfig

pytestmark = pytest.mark.multiprocess
monarch = pytest.importorskip("monarch", reason="Monarch is optional: pip install 'distrl[monarch]'")

from distrl.strategies.monarch_engine import monarch_session  # noqa: E402
from distrl.strategies.pipeline_ppo import AsyncCollector  # noqa: E402
from distrl.training import OnPolicyTrainer  # noqa: E402


def alive(pid):
    import psutil

    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_published_weights_are_one_version_each_and_never_rewritten():
    with monarch_session() as engine:
        flat = np.arange(6, dtype=np.float32)
        v1 = engine.weights(1, flat)
        flat += 100  # the learner's array moves on...
        v2 = engine.weights(2, flat)
        assert engine.weights(2, flat) is v2  # one buffer per version, shared by every generator
        np.testing.assert_array_equal(v1.fetch(), np.arange(6))  # ...version 1's buffer does not
        np.testing.assert_array_equal(v2.fetch(), np.arange(6) + 100)


# the pool restarts a killed generator on Ray in the default run (test_pipeline); Monarch runs it there too
@pytest.mark.slow
def test_grpo_pipeline_on_monarch_restarts_a_killed_generator_and_leaves_no_process():
    from grpo_hooks import train_bandit

    seen = {}

    def kill_and_watch(source, version):
        if version == 20:
            seen["killed"] = source.engine.result(source.engine.call(source.pool.actors[0], "pid"), 60)
            os.kill(seen["killed"], signal.SIGKILL)
        if version is None:  # the end, generations drained: the actors now (one generator replaced)
            seen["pids"] = [
                source.engine.result(source.engine.call(a, "pid"), 60) for a in [*source.pool.actors, source.scorer]
            ]

    with monarch_session() as engine:
        summary = train_bandit(
            engine, StrategyConfig(strategy="pipeline", workers=2, engine="monarch"), kill_and_watch, learner_steps=60
        )
        assert engine.faults  # the driver got the failure through the hook instead of exiting
    assert summary["learner_steps"] == 60 and summary["generator_restarts"] == 1
    assert summary["events"][0].split(" ", 2)[2].startswith("generator 0 died")
    assert (
        summary["slices_generated"]
        == summary["slices_added"]
        == (
            summary["slices_retired"]
            + summary["slices_evicted"]
            + summary["slices_dropped_for_lag"]
            + summary["slices_left_in_buffer"]
        )
    )
    pid, pids = seen["killed"], seen["pids"]
    assert len(set(pids)) == 3 and pid not in pids  # 2 generators (one replaced) and the scorer
    assert not any(alive(p) for p in [pid, *pids])  # and after the close, none of them is left


def test_async_ppo_on_monarch_one_fragment_ahead_reproduces_single_process():
    cfg = PPOConfig(n_envs=2, n_steps=16, batch_size=32, n_epochs=2, normalize_obs=True)
    run = RunConfig(env="CartPole-v1", seed=3, vec="sync", quiet=True, total_steps=4 * 32)
    strategy = StrategyConfig(strategy="pipeline", workers=1, queue_size=1, engine="monarch")
    with monarch_session() as engine:
        remote = OnPolicyTrainer(
            run, cfg, strategy=strategy, collector_factory=lambda t: AsyncCollector(t, strategy, engine)
        )
        remote.train()
        remote.close()
    single = OnPolicyTrainer(run, cfg)
    single.train()
    single.close()
    assert remote.steps == single.steps == 128
    torch.testing.assert_close(remote.agent.params.data, single.agent.params.data, rtol=0, atol=1e-6)


def test_monarch_engine_only_runs_the_pipeline():
    with pytest.raises(ConfigError, match="engine='monarch' is not allowed: must be ray with --strategy actor-learner"):
        StrategyConfig(strategy="actor-learner", workers=2, engine="monarch")


def test_without_monarch_installed_the_error_names_the_extra(monkeypatch):
    from distrl.strategies import monarch_engine

    monkeypatch.setattr(monarch_engine, "_MonarchActor", None)
    with pytest.raises(ConfigError, match=r"engine='monarch' needs Monarch.*pip install 'distrl\[monarch\]'"):
        monarch_engine.MonarchActors()
