"""GRPO's pipeline paced by max_policy_lag, and DAPO's dynamic sampling under single, ddp and pipeline.

The pipeline runs twice here: on Ray with a forced slow learner (as tests/strategies/test_pipeline.py does), and
on :class:`InProcessEngine`, which runs the real generators, scorer, pool and replay in this process and finishes
their requests in a random order, generator by generator: many schedules in a second each.
"""

import dataclasses
import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from grpo_hooks import train_bandit
from safetensors.torch import load_file

from distributed import run_ranks
from distrl.config import ConfigError, GRPOConfig, StrategyConfig
from distrl.data.versioned import VersionedReplay
from distrl.strategies.actors import RayActors
from distrl.strategies.pipeline import PipelineGroups, check_pipeline
from distrl.training.group import GroupTrainer, train_grpo
from distrl.training.group_sources import LocalGroups
from distrl.training.presets import algo_configs

pytestmark = pytest.mark.multiprocess


def bandit(**changes):
    """GRPO on the bandit: its preset, with small groups (an all-0 or all-1 group is frequent), then ``changes``."""
    run, cfg, _ = algo_configs("grpo", "bandit", run={"quiet": True})
    small = dict(group_size=4, prompts_per_slice=4, slices_per_step=2, slices_per_call=1, learner_steps=30)
    return run, dataclasses.replace(cfg, **{**small, **changes})


def flat(samples):
    """[B] bool: the groups of ``samples`` whose rewards are all equal."""
    rewards = samples.reward.reshape(-1, samples.group_size)
    return rewards.std(axis=1) == 0


def accounted(s):
    """generated = trained + dropped for lag + left in the buffer (each slice trained once, nothing evicted)."""
    return (
        s["slices_evicted"] == 0
        and s["slices_generated"] == s["slices_added"]
        and s["slices_added"] == s["slices_trained"] + s["slices_dropped_for_lag"] + s["slices_left_in_buffer"]
    )


# ---- the scheduling rule, by hand ----


def test_the_due_slices_are_the_earliest_deadlines_the_later_steps_could_not_meet():
    replay = VersionedReplay(capacity=10, max_policy_lag=1)
    for version in (4, 4, 5):
        replay.add(version, f"v{version}")
    # learner version 5, two slices a step, one more slice of version 5 in flight: deadlines 5, 5, 6, 6.
    # N_5 = 2 must go now (0 steps after this one); N_6 = 4 fit 2 now + 2 at step 6: the two of version 4 are due
    assert replay.due(5, [5], per_step=2) == [0, 1]
    assert replay.due(5, [], per_step=4) == [0, 1]  # at lag 1 already: now or never, whatever the step size
    assert replay.due(4, [5], per_step=2) == []  # a step earlier nothing is due: the sample is the unpaced one
    assert [item for _, item in replay.sample(2, 5, [5], per_step=2)] == ["v4", "v4"]
    # a slice of version 4 still in flight is due (deadline 5): the learner waits for it instead of taking v5
    assert replay.due(5, [4], per_step=1) == [-1]
    assert replay.sample(1, 5, [4], per_step=1) is None and len(replay) == 1
    assert replay.due(5, [3], per_step=1) == []  # past the cap already: dropped when it comes, not waited for


def drops_in_a_simulated_pipeline(per_step: int, lag: int = 2, seed: int = 0) -> int:
    """Slices dropped for lag when requests of one slice are handed out at the pacing limit and arrive late in a
    random order, with the learner sampling uniformly; ``per_step`` 0 samples without taking due slices first."""
    rng = np.random.default_rng(seed)
    replay = VersionedReplay(capacity=100, max_policy_lag=lag, sampling="uniform", seed=seed)
    in_flight: list[int] = []
    for version in range(200):
        while replay.untrained() + len(in_flight) + 1 <= (lag + 1) * 2:
            in_flight.append(version)
        for _ in range(1000):
            for i in sorted(np.flatnonzero(rng.random(len(in_flight)) < 0.5), reverse=True):
                replay.add(in_flight.pop(i), None)
            if replay.sample(2, version, in_flight, per_step) is not None:
                break
        else:
            raise AssertionError(f"the simulated learner got no batch at version {version}")
    return replay.dropped_for_lag


def test_taking_the_due_slices_first_drops_nothing_where_sampling_alone_would():
    assert drops_in_a_simulated_pipeline(per_step=0) > 0
    assert drops_in_a_simulated_pipeline(per_step=2) == 0


def test_a_request_that_could_not_be_trained_within_the_lag_cap_is_refused():
    with pytest.raises(ConfigError, match=r"slices_per_call=4 is not allowed with max_policy_lag=0: must be <= \("):
        check_pipeline(GRPOConfig(slices_per_call=4, slices_per_step=2), StrategyConfig(max_policy_lag=0))
    check_pipeline(GRPOConfig(slices_per_call=4, slices_per_step=2), StrategyConfig(max_policy_lag=1))


# ---- the pipeline, in this process ----


class _Call:
    def __init__(self, actor, method, args):
        self.actor, self.method, self.args = actor, method, args
        self.finished, self.value = False, None

    def finish(self):
        self.value, self.finished = getattr(self.actor, self.method)(*self.args), True


class InProcessEngine:
    """An actor engine running every actor in this process. A generation finishes when a ``wait`` draws it (with
    probability ``p``, or the first to come when a wait must return one), each generator's in the order asked:
    generators of random, uneven speeds, and no processes."""

    name = "in-process"

    def __init__(self, seed: int, p: float):
        self.rng, self.p = np.random.default_rng(seed), p
        self.queues: dict[int, list[_Call]] = {}

    def spawn(self, cls, *args, cpus=0.0, gpus=0.0):
        return cls(*args)

    def call(self, actor, method, *args):
        call = _Call(actor, method, args)
        if method == "generate_scored":
            self.queues.setdefault(id(actor), []).append(call)
        else:
            call.finish()
        return call

    def _finish_through(self, call):
        queue = self.queues[id(call.actor)]
        while not call.finished:
            queue.pop(0).finish()

    def wait(self, pending, timeout, first=False):
        for call in pending:
            if not call.finished and self.rng.random() < self.p:
                self._finish_through(call)
        waiting = [call for call in pending if not call.finished]
        if len(waiting) == len(pending) and waiting and timeout > 0:
            self._finish_through(waiting[self.rng.integers(len(waiting))])
        return [call for call in pending if call.finished]

    def result(self, pending, timeout):
        assert pending.finished
        return pending.value

    def client(self, actor, timeout):
        return actor

    def weights(self, version, flat):
        return np.array(flat, copy=True)

    def shared(self, payload):
        return payload

    def kill(self, actor):
        pass


class RecordedPipeline(PipelineGroups):
    """The pipeline's source, keeping every group it took and every batch it gave."""

    def __init__(self, trainer, strategy, engine):
        super().__init__(trainer, strategy, engine)
        self.taken, self.batches = [], []

    def _take(self, k, version):
        slices = super()._take(k, version)
        self.taken.append(slices)
        return slices

    def next_batch(self, version):
        batch = super().next_batch(version)
        self.batches.append(batch)
        return batch


def in_process_pipeline(strategy, seed=0, p=0.7, **changes):
    run, cfg = bandit(**changes)
    engine = InProcessEngine(seed, p)
    sources = []

    def source(trainer):
        sources.append(RecordedPipeline(trainer, strategy, engine))
        return sources[0]

    return train_grpo(run, cfg, None, strategy=strategy, source_factory=source), sources[0], cfg


@pytest.mark.parametrize("lag", [0, 1, 3])
@pytest.mark.parametrize("sampling", ["uniform", "version"])
def test_paced_generators_hand_out_nothing_that_would_be_trained_past_the_lag_cap(lag, sampling):
    strategy = StrategyConfig(strategy="pipeline", workers=3, max_policy_lag=lag, replay_sampling=sampling)
    for seed in range(3):
        s, source, cfg = in_process_pipeline(strategy, seed)
        assert s["learner_steps"] == cfg.learner_steps and accounted(s), s
        assert s["slices_dropped_for_lag"] == s["completions_dropped_for_lag"] == 0
        assert s["policy_lag_max"] == lag  # the fast generators reach the cap, never pass it
        assert s["queue_depth_max"] <= (lag + 1) * cfg.slices_per_step  # tighter than queue_size (16)
        assert s["trained_mean_length"] == 1.0 and s["completion_length_counts"]["trained"] == {"<=1": s["completions"]}


@pytest.mark.parametrize("lag", [0, 1])
def test_the_pipeline_with_dynamic_sampling_trains_full_batches_of_informative_groups(lag):
    strategy = StrategyConfig(strategy="pipeline", workers=2, max_policy_lag=lag)
    s, source, cfg = in_process_pipeline(strategy, lag, dynamic_sampling=True, dynamic_sampling_max_draws=3)
    target = cfg.prompts_per_step
    taken_flat = sum(int(flat(slices).sum()) for slices in source.taken)
    short = [batch for batch in source.batches if batch.prompts < target]
    for batch in source.batches:  # informative groups, or none at all (a short step keeps its last draw's)
        assert not flat(batch).any() or (flat(batch).all() and batch in short)
        assert batch.prompts < target + cfg.prompts_per_slice  # the last slice taken is kept whole
    assert taken_flat > 0 and len(source.taken) > cfg.learner_steps  # flat groups came, and were replaced
    assert s["dynamic_sampling_flat_groups_dropped"] == taken_flat - sum(b.prompts for b in short if flat(b).all())
    assert s["dynamic_sampling_draws"] == pytest.approx(len(source.taken) / cfg.learner_steps)
    assert s["dynamic_sampling_short_steps"] == len(short)
    assert s["completions"] == sum(batch.size for batch in source.batches)
    assert s["slices_trained"] == sum(slices.prompts for slices in source.taken) // cfg.prompts_per_slice
    # a draw in the middle of a step hands out only what it and the later steps can train in time
    assert accounted(s) and s["slices_dropped_for_lag"] == 0 and s["policy_lag_max"] == lag


def test_with_reuse_only_slices_already_trained_on_leave_for_lag():
    strategy = StrategyConfig(strategy="pipeline", workers=2, max_policy_lag=4, max_reuse=3)
    s, source, cfg = in_process_pipeline(strategy, p=0.1)  # slow generators: the learner reuses what it holds
    assert s["slices_dropped_for_lag"] > 0 and s["completions_dropped_for_lag"] == 0
    assert s["slice_uses"] == 2 * cfg.learner_steps > s["slices_trained"] and s["policy_lag_max"] <= 4


# ---- the pipeline on Ray, with a slow learner ----


def test_a_slow_learner_with_max_policy_lag_1_trains_nothing_older_and_drops_nothing(ray_local):
    strategy = StrategyConfig(strategy="pipeline", workers=2, max_policy_lag=1)
    s = train_bandit(
        RayActors(ray_local),
        strategy,
        lambda source, version: time.sleep(0.05),  # the learner is the bottleneck: generators would run ahead
        learner_steps=30,
        slices_per_step=2,
        slices_per_call=1,
    )
    assert s["learner_steps"] == 30 and accounted(s)
    assert set(s["policy_lag_counts"]) <= {"0", "1"} and s["policy_lag_counts"].get("1", 0) > 0
    assert s["slices_dropped_for_lag"] == s["completions_dropped_for_lag"] == 0
    assert s["slices_trained"] == 30 * 2 and s["queue_depth_max"] <= 4  # (max_policy_lag + 1) * slices_per_step
    assert s["dropped_for_lag_mean_length"] == 0.0 and s["trained_mean_length"] == 1.0


# ---- dynamic sampling in this process (single) and on ddp ranks ----


class RecordedLocal(LocalGroups):
    """The local source, keeping every draw and every batch."""

    def __init__(self, trainer):
        super().__init__(trainer)
        self.draws, self.batches = [], []

    def _draw(self, counts, version):
        samples = super()._draw(counts, version)
        if samples is not None:
            self.draws.append(samples)
        return samples

    def next_batch(self, version):
        batch = super().next_batch(version)
        self.batches.append(batch)
        return batch


def test_dynamic_sampling_replaces_flat_groups_with_fresh_prompts_and_counts_them():
    run, cfg = bandit(learner_steps=40, dynamic_sampling=True, dynamic_sampling_max_draws=3)
    trainer = GroupTrainer(run, cfg, log=False, source_factory=RecordedLocal)
    trainer.train()
    s = trainer.finish(0.0)
    source = trainer.source
    target = cfg.prompts_per_step
    drawn = np.concatenate([d.positions for d in source.draws])
    assert np.array_equal(drawn, np.arange(len(drawn))) and trainer.sampling.cursor == len(drawn)  # no prompt twice
    assert len(drawn) > 40 * target  # fresh prompts replaced flat groups
    short = [batch for batch in source.batches if batch.prompts < target]
    assert 0 < len(short) < 40  # three draws were not always enough
    for batch in source.batches:
        assert batch.prompts <= target and not flat(batch).any()  # never a flat group, full unless short
    flat_drawn = sum(int(flat(d).sum()) for d in source.draws)
    assert s["dynamic_sampling_flat_groups_dropped"] == flat_drawn > 0
    assert s["dynamic_sampling_draws"] == pytest.approx(len(source.draws) / 40)
    assert s["dynamic_sampling_short_steps"] == len(short)
    assert s["completions"] == sum(batch.size for batch in source.batches) < 40 * target * cfg.group_size
    assert {"dynamic_sampling/draws", "dynamic_sampling/dropped_groups"} <= source.last_metrics.keys()


def policy_params(run_dir: Path):
    return {
        k: v for k, v in load_file(str(run_dir / "model" / "tensors.safetensors")).items() if k.startswith("params/")
    }


def test_dynamic_sampling_resumed_goes_on_exactly_as_the_uninterrupted_run(tmp_path):
    run, cfg = bandit(learner_steps=20, dynamic_sampling=True)
    run_dir = tmp_path / "run"
    whole = train_grpo(run.replace(checkpoint_every=10), cfg, run_dir)
    expected = policy_params(run_dir)
    step10 = run_dir / "checkpoints" / "step-000000000010"
    cursor = json.loads((step10 / "state.json").read_text())["sampling"]["cursor"]
    assert cursor > 10 * cfg.prompts_per_step  # the extra draws took the cursor past where the steps alone put it
    shutil.rmtree(run_dir / "model")
    resumed = train_grpo(run, cfg, run_dir, resume_path=step10)
    got = policy_params(run_dir)
    assert expected and expected.keys() == got.keys() and all(torch.equal(expected[k], got[k]) for k in expected)
    for key in ("completions", "dynamic_sampling_flat_groups_dropped", "dynamic_sampling_draws"):
        assert resumed[key] == whole[key]


def ddp_rank(rank, world, run, cfg):
    from distrl.strategies.ddp import DistributedSync

    trainer = GroupTrainer(run, cfg, sync=DistributedSync(torch.device("cpu"), 30), log=False)
    trainer.broadcast_state()
    trainer.train()
    trainer.close()
    return trainer.policy.params.data.clone(), dataclasses.asdict(trainer.sampling), trainer.completions


def test_ddp_with_dynamic_sampling_draws_and_trains_what_single_does():
    run, cfg = bandit(learner_steps=12, dynamic_sampling=True)
    (p0, sampling0, completions), (p1, sampling1, _) = run_ranks(
        ddp_rank, 2, run, dataclasses.replace(cfg, slices_per_step=1), timeout=120
    )
    single = GroupTrainer(run, cfg, log=False)
    single.train()
    single.close()
    assert torch.equal(p0, p1) and sampling0 == sampling1
    assert sampling0 == dataclasses.asdict(single.sampling) and sampling0["flat_groups_dropped"] > 0
    assert completions == single.completions
    torch.testing.assert_close(p0, single.policy.params.data, rtol=0, atol=2e-5)
