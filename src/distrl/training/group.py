"""GRPO on group tasks: the synchronous loop (``single``) and the run directory of every GRPO run.

``single`` generates a slice, scores it and learns from it in turn, in this process, with the
same Generator, Scorer and learner step as ``pipeline`` — the baseline the pipeline's
throughput is measured against.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import distrl
from distrl import checkpoint
from distrl.config import GRPOConfig, RunConfig, StrategyConfig, to_dict
from distrl.logs import Console, write_json_atomic
from distrl.training.common import set_cpu_options
from distrl.tasks import make_task

EVAL_STATES = 1024


def run_synchronous(task: str, cfg: GRPOConfig, run: RunConfig, on_step: Any = None) -> tuple[dict[str, Any], Any]:
    """Generate → score → learn, one after the other; returns (summary, learner)."""
    from distrl.algos.grpo import GRPOAlgo
    from distrl.strategies.pipeline import Generator, Scorer, split_slices, stack

    task_obj = make_task(task, run.seed)
    algo = GRPOAlgo(task_obj.obs_dim, task_obj.n_actions, cfg, run.seed)
    generator, scorer = Generator(task, cfg, run.seed, 0), Scorer(task, run.seed)
    start, busy, slices = time.perf_counter(), 0.0, 0
    while algo.version < cfg.learner_steps:
        scored, = scorer.score(generator.generate(algo.version, algo.flat_weights(), cfg.slices_per_step))
        slices += cfg.slices_per_step
        step_start = time.perf_counter()
        metrics = algo.update(stack([(algo.version, s) for s in split_slices(scored)]))
        busy += time.perf_counter() - step_start
        if on_step is not None:
            on_step(algo.version, metrics)
    wall = time.perf_counter() - start
    return {"learner_steps": algo.version, "wall_s": wall, "learner_steps_per_s": algo.version / wall,
            "learner_busy_fraction": busy / wall, "slices_generated": slices, "slices_per_s": slices / wall,
            "slices_trained": slices}, algo


def greedy_reward_fraction(task: str, policy: Any, seed: int) -> dict[str, float]:
    """Mean reward of the most likely action on fresh states, and its share of the optimum over random."""
    task_obj = make_task(task, seed)
    states = task_obj.states(EVAL_STATES, np.random.default_rng(seed + 1_000_000))
    with torch.inference_mode():
        greedy = policy.logits(torch.from_numpy(states)).argmax(dim=1, keepdim=True).numpy()
    reward = float(task_obj.rewards(states, greedy).mean())
    every = np.tile(np.arange(task_obj.n_actions), (len(states), 1))
    random_reward = float(task_obj.rewards(states, every).mean())
    optimal = task_obj.optimal_reward(states)
    return {"eval_reward": reward, "optimal_reward": optimal, "random_reward": random_reward,
            "eval_fraction_of_optimal": (reward - random_reward) / (optimal - random_reward)}


def train_grpo(run: RunConfig, strategy: StrategyConfig, cfg: GRPOConfig, run_dir: Path) -> dict[str, Any]:
    """Train GRPO on the group task ``run.env`` and write the run directory."""
    task = run.env
    make_task(task)  # an unknown task fails before anything starts
    if strategy.strategy == "pipeline":
        from distrl.strategies.pipeline import check_pipeline

        check_pipeline(cfg, strategy)
    checkpoint.check_new_run_dir(run_dir, None)
    run_dir.mkdir(parents=True, exist_ok=True)
    config = {"run": to_dict(run), "strategy": to_dict(strategy), "grpo": to_dict(cfg)}
    write_json_atomic(run_dir / "config.json", config)
    from torch.utils.tensorboard import SummaryWriter

    from distrl.tracking import close_trackers, open_trackers

    trackers = open_trackers(run.track, run_dir, run.track_project, config)
    tb = SummaryWriter(str(run_dir))
    console = Console(cfg.learner_steps, "learner steps", run.quiet)
    every = max(1, cfg.learner_steps // 20)

    def on_step(version: int, metrics: dict[str, float]) -> None:
        if version % 10 == 0 or version == cfg.learner_steps:
            for key, value in metrics.items():
                tb.add_scalar(f"train/{key}", value, version)
            for tracker in trackers:
                tracker.scalars({f"train/{key}": value for key, value in metrics.items()}, version)
        if version % every == 0 or version == cfg.learner_steps:
            console.line(f"step {version}/{cfg.learner_steps}: mean reward {metrics['mean_reward']:.3f}, "
                         f"lag {metrics['lag_mean']:.2f}, kl_ref {metrics['kl_ref']:.4f}")

    set_cpu_options(run)
    start = time.perf_counter()
    try:
        if strategy.strategy == "pipeline":
            from distrl.strategies.pipeline import run_pipeline

            summary, algo = run_pipeline(task, cfg, run, strategy, run_dir, on_step)
        else:
            summary, algo = run_synchronous(task, cfg, run, on_step)
        evaluation = greedy_reward_fraction(task, algo.policy, run.seed)
        for key, value in summary.items():
            if isinstance(value, (int, float)):
                tb.add_scalar(f"pipeline/{key}", value, algo.version)
    except BaseException:
        close_trackers(trackers)
        raise
    finally:
        tb.close()
    summary = {"algo": "grpo", "env": task, "strategy": strategy.strategy,
               "workers": strategy.workers if strategy.strategy == "pipeline" else 1,
               **summary, **evaluation, "total_wall_s": time.perf_counter() - start,
               "distrl_version": distrl.__version__}
    checkpoint.save(run_dir / checkpoint.MODEL_DIR, algo.weights(),
                    {"algo": "grpo", "task": task, "policy_version": algo.version, "grpo": to_dict(cfg)})
    write_json_atomic(run_dir / "summary.json", summary)
    for tracker in trackers:
        tracker.summary(summary)
    close_trackers(trackers)
    console.line(f"done: {algo.version} learner steps in {summary['wall_s']:.1f}s, greedy reward "
                 f"{evaluation['eval_reward']:.3f} ({evaluation['eval_fraction_of_optimal']:.0%} of the way from "
                 f"random to optimal), run dir {run_dir}")
    return summary
