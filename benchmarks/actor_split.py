"""Where an actor's time goes: acting (the policy's forward pass) against stepping its environments.

    python benchmarks/actor_split.py            # writes its section of docs/benchmarks.md
    python benchmarks/actor_split.py --quick    # short, prints the section, writes nothing

Double-buffered collection (Sample Factory's: step half of an actor's environments while the policy computes
the other half's actions) can hide at most the smaller of the two shares, and only where the two run on
different cores or the environment waits without computing. This measures both shares in one actor, as the
pipeline's actors run (one thread, their collector), for three environments: CartPole-v1 (cheap steps, tiny
MLP), ``slow_envs:SleepyCartPole`` (4 ms of waiting per step: a remote simulator) and ALE/Breakout-v5 with the
Atari wrappers and the Nature CNN (CPU-heavy steps and acting).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from harness import markdown_table, write_section

CASES = {
    "CartPole-v1": (["appo", "CartPole-v1"], {}),
    "SleepyCartPole (4 ms)": (["appo", "slow_envs:SleepyCartPole"], {"env_kwargs": ("step_ms=4",)}),
    "ALE/Breakout-v5": (["appo", "ALE/Breakout-v5"], {}),
}


class Timed:
    """Wraps a callable and adds the seconds spent in it."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn, self.seconds = fn, 0.0

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.fn(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start


def split(algo: str, env: str, run_overrides: dict[str, Any], fragments: int) -> dict[str, float]:
    """Seconds acting and stepping over ``fragments`` fragments of one actor with the env's preset."""
    from distrl.strategies.actor_learner import RolloutWorker, WorkerSpec
    from distrl.training.presets import algo_configs

    run, cfg, _ = algo_configs(algo, env, "auto", run={"quiet": True, **run_overrides})
    worker = RolloutWorker(WorkerSpec(algo, run, cfg, 0))
    worker.reset(run.seed, 0)
    payload = {"version": 0}
    worker.collect(payload, 0, True)  # warm-up
    worker.agent.act_step = act = Timed(worker.agent.act_step)  # type: ignore[method-assign]
    worker.env.step = step = Timed(worker.env.step)  # type: ignore[method-assign]
    start = time.perf_counter()
    steps = 0
    for _ in range(fragments):
        steps += worker.collect(payload, 0, True).steps
    wall = time.perf_counter() - start
    return {"wall_s": wall, "act_s": act.seconds, "step_s": step.seconds, "steps": steps, "n_envs": cfg.n_envs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rows = []
    for name, ((algo, env), overrides) in CASES.items():
        fragments = 2 if args.quick else 10
        r = split(algo, env, overrides, fragments)
        other = r["wall_s"] - r["act_s"] - r["step_s"]
        print(f"  {name}: {r}", flush=True)
        rows.append(
            [
                name,
                str(r["n_envs"]),
                f"{r['steps'] / r['wall_s']:,.0f}",
                f"{100 * r['act_s'] / r['wall_s']:.1f}%",
                f"{100 * r['step_s'] / r['wall_s']:.1f}%",
                f"{100 * other / r['wall_s']:.1f}%",
                f"{100 * min(r['act_s'], r['step_s']) / r['wall_s']:.1f}%",
            ]
        )
    body = "\n".join(
        [
            "One pipeline actor (its collector, one thread) with each env's APPO preset; shares of its collection "
            "time. Reproduce: `cd benchmarks && python actor_split.py`.",
            "",
            *markdown_table(
                [
                    "env",
                    "envs per actor",
                    "steps/s",
                    "acting",
                    "env steps",
                    "rest",
                    "most double-buffering could hide",
                ],
                rows,
            ),
        ]
    )
    if args.quick:
        print(body)
    else:
        write_section("APPO actors: acting against stepping (double-buffering)", body)


if __name__ == "__main__":
    main()
