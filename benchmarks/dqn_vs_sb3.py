"""distrl DQN against stable-baselines3 DQN on CartPole-v1 and Breakout, side by side in one run.

    python benchmarks/dqn_vs_sb3.py            # writes its section of docs/benchmarks.md
    python benchmarks/dqn_vs_sb3.py --quick    # tiny budgets, prints the section, writes nothing

Identical hyperparameters, given to both libraries under the same (stable-baselines3's) names:
rl-baselines3-zoo's CartPole-v1 DQN (256x256 ReLU, lr 2.3e-3, batch 64, 128 gradient steps every 256
env steps, target copied every 10 steps) and its Atari DQN (the Nature CNN with a linear head, buffer
10k with one copy of each observation, lr 1e-4, batch 32, one gradient step every 4 env steps), the
latter with 1,000 random steps instead of 100k so that the timed window trains. Breakout is
``ALE/Breakout-v5`` (sticky actions 0.25) with the standard preprocessing in both: distrl's Atari
family, and stable-baselines3's ``AtariWrapper`` with ``VecFrameStack(4)``.

Each measurement runs in its own subprocess (peak RSS is its own), libraries alternate, medians are
reported, one torch thread each. One row runs distrl with ``--precision bf16`` (its MLP's matrix
products in bfloat16) against stable-baselines3 in float32.
"""

from __future__ import annotations

import argparse
import platform
import time
from typing import NamedTuple

from harness import (
    alternate,
    child_main,
    comparison_table,
    median,
    raw_values,
    sb3_seconds_to_target,
    write_section,
)

CARTPOLE, BREAKOUT = "CartPole-v1", "ALE/Breakout-v5"


def _preset(name: str, **changes: object) -> dict:
    """A distrl DQN preset's hyperparameters, which both libraries take under the same names."""
    from distrl.training.presets import PRESETS

    values = {k: v for k, v in PRESETS["dqn"][name].items() if k not in ("total_steps", "net_arch")}
    return {**values, **changes}


HP = {
    CARTPOLE: _preset("CartPole-v1"),
    # the zoo's 100k random steps would leave the timed window without a gradient step
    BREAKOUT: _preset("atari", learning_starts=1_000),
}
NET_ARCH = {CARTPOLE: (256, 256), BREAKOUT: ()}  # the presets' networks; SB3: net_arch=[256, 256], CnnPolicy's head
WARMUP = {CARTPOLE: 1_024, BREAKOUT: 1_000}
"""Untimed steps before SPS is measured: past learning_starts at a training-phase boundary, so every timed
phase includes its gradient steps."""
TARGET, SOLVE_BUDGET, EVAL_EVERY = 475.0, 50_000, 5_120
"""Time to solve: a 10-episode deterministic evaluation every 5,120 steps (20 phases of 256), 50k steps at most.
Both libraries collect in whole 256-step phases, so the budget ends at 50,176 steps (196 phases) in each."""


WHY = (
    "- Why the goals are not met: both libraries do the same arithmetic per gradient step, and at these s"
    "ettings it is most of the time. Measured once in this session with throwaway probes (not this script"
    "): on CartPole one gradient step (256×256 network, batch 64) took 0.99-1.05 ms in distrl against 1.5"
    "8-1.74 ms in stable-baselines3's `train()`, alternating in one process, 300 steps × 3; of distrl's, "
    "the four products of a 64×256 batch with a 256×256 weight that a step cannot avoid (the online and t"
    "arget forwards, the weight and input gradients) took 0.36-0.44 ms on one thread, the loss and its au"
    "tograd 77 µs and Adam 54 µs. bf16 is slower than float32 here: at batch 64, rounding the weights to "
    "bfloat16 at every product costs more than the faster product saves (it pays at SAC's batch 256). On "
    "Breakout a cProfile of 2,000 steps spent 7.8 of 22.7 s in the CNN's backward passes and 6.0 s in con"
    "volutions (35 ms per gradient step, one every 4 steps, and a forward per step to act), operations st"
    "able-baselines3 runs the same way."
)
"""What the section says of where the time goes: figures measured with throwaway probes, quoted as measured."""


class Row(NamedTuple):
    """One line of the table, as harness's ``comparison_table`` and ``raw_values`` take it."""

    label: str
    distrl: float | None
    sb3: float | None
    ratio: float | None
    """distrl's advantage: its SPS over SB3's, or SB3's seconds over its own."""
    rss_distrl: float
    rss_sb3: float
    raw: dict
    """``alternate``'s result: every run's value and peak RSS, per library."""
    lib: str
    """distrl's name in ``raw`` (distrl or distrl-bf16)."""


def child(lib: str, task: str, seed: int, arg: str) -> dict:
    import torch

    torch.set_num_threads(1)
    if task == "solve":
        budget, every = (int(v) for v in arg.split(":"))
        return _solve(lib, seed, budget, every)
    return _sps(lib, CARTPOLE if task == "sps-cartpole" else BREAKOUT, seed, int(arg))


def _distrl(env_id: str, seed: int, total_steps: int, precision: str = "fp32", **run):
    from distrl.config import DQNConfig, RunConfig
    from distrl.training import DQNTrainer

    return DQNTrainer(
        RunConfig(
            algo="dqn",
            env=env_id,
            seed=seed,
            quiet=True,
            threads=1,
            total_steps=total_steps,
            precision=precision,
            **run,
        ),
        DQNConfig(**HP[env_id], net_arch=NET_ARCH[env_id]),
    )


def _sb3(env_id: str, seed: int):
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    if env_id == CARTPOLE:
        env = make_vec_env(env_id, n_envs=1, seed=seed)
        return DQN(
            "MlpPolicy",
            env,
            policy_kwargs=dict(net_arch=list(NET_ARCH[env_id])),
            seed=seed,
            device="cpu",
            verbose=0,
            **HP[env_id],
        )

    import ale_py
    import gymnasium as gym
    from stable_baselines3.common.env_util import make_atari_env
    from stable_baselines3.common.vec_env import VecFrameStack

    gym.register_envs(ale_py)
    env = VecFrameStack(make_atari_env(env_id, n_envs=1, seed=seed, env_kwargs={"frameskip": 1}), n_stack=4)
    # stable-baselines3 refuses optimize_memory_usage with its timeout handling (DLR-RM/stable-baselines3#934)
    return DQN(
        "CnnPolicy",
        env,
        replay_buffer_kwargs=dict(handle_timeout_termination=False),
        seed=seed,
        device="cpu",
        verbose=0,
        **HP[env_id],
    )


def _sps(lib: str, env_id: str, seed: int, steps: int) -> dict:
    """Steps per second over ``steps`` env steps after ``WARMUP`` untimed ones; exploration anneals over both."""
    warmup = WARMUP[env_id]
    if lib.startswith("distrl"):
        trainer = _distrl(env_id, seed, warmup + steps, "bf16" if lib == "distrl-bf16" else "fp32")
        trainer.train(stop_at=warmup)
        s0, t0 = trainer.steps, trainer.train_s
        trainer.train()
        return {"sps": (trainer.steps - s0) / (trainer.train_s - t0)}
    model = _sb3(env_id, seed)
    model.learn(warmup)
    s0, start = model.num_timesteps, time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return {"sps": (model.num_timesteps - s0) / (time.perf_counter() - start)}


def _solve(lib: str, seed: int, budget: int, every: int) -> dict:
    """Training seconds (evaluation excluded) until a 10-episode deterministic eval on CartPole >= 475."""
    if lib == "distrl":
        trainer = _distrl(CARTPOLE, seed, budget, eval_every=every, target_return=TARGET)
        trainer.train()
        solved = trainer.last_eval is not None and trainer.last_eval[0] >= TARGET
        return {"train_s": trainer.train_s if solved else None, "steps": trainer.steps}

    from stable_baselines3.common.env_util import make_vec_env

    model = _sb3(CARTPOLE, seed)
    eval_env = make_vec_env(CARTPOLE, n_envs=1, seed=seed + 1_000_000)
    # The callback fires on an env step and SB3 trains after each 256-step collection, so at step 5,120
    # it would evaluate before the 20th phase's gradient steps; one step later it sees the same 20 phases
    # as distrl's evaluation at 5,120.
    return sb3_seconds_to_target(model, eval_env, budget, every + 1, TARGET)


def main() -> None:
    if child_main(child):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny budgets; print the section instead of writing it")
    args = parser.parse_args()
    quick = args.quick
    # Breakout's runs take minutes each (a CNN gradient step every 4 env steps): fewer of them
    repeats, breakout_repeats = (1, 1) if quick else (5, 3)
    cartpole_steps = 512 if quick else 20_480  # whole 256-step phases
    breakout_steps = 200 if quick else 10_000
    solve_budget, eval_every = (2_048, 1_024) if quick else (SOLVE_BUDGET, EVAL_EVERY)
    args_of = {"sps-cartpole": cartpole_steps, "solve": f"{solve_budget}:{eval_every}", "sps-breakout": breakout_steps}
    rows = {}
    for name, label, task, mine in [
        ("cartpole", "SPS, CartPole-v1, zoo settings, float32", "sps-cartpole", "distrl"),
        ("solve", "training s to eval >= 475, CartPole-v1", "solve", "distrl"),
        ("bf16", "SPS, CartPole-v1, distrl bf16 vs SB3 float32", "sps-cartpole", "distrl-bf16"),
        ("breakout", "SPS, ALE/Breakout-v5, Atari settings, float32", "sps-breakout", "distrl"),
    ]:
        runs = breakout_repeats if task == "sps-breakout" else repeats
        key = "train_s" if task == "solve" else "sps"
        print(f"{label} ...", flush=True)
        res = alternate(__file__, task, runs, args_of[task], key, (mine, "sb3"))
        d, s = median(res["values"][mine]), median(res["values"]["sb3"])
        ratio = (d / s if key == "sps" else s / d) if d and s else None
        rows[name] = Row(label, d, s, ratio, median(res["rss"][mine]), median(res["rss"]["sb3"]), res, mine)
    body = report(rows, (repeats, breakout_repeats), quick, cartpole_steps, breakout_steps, (solve_budget, eval_every))
    if quick:
        print(body)
    else:
        write_section("DQN: distrl vs stable-baselines3", body)


def goal(ratio: float | None, wanted: float) -> str:
    """How a measured ratio stands against its goal, in words."""
    if ratio is None:
        return f"no ratio measured (goal: at least {wanted:g}×)"
    return f"{ratio:.2f}× SB3's, against a goal of at least {wanted:g}×: {'met' if ratio >= wanted else 'not met'}"


def settings(hp: dict) -> str:
    """Hyperparameters as the section lists them: ``name value, ...``."""
    return ", ".join(f"{k} {v}" if isinstance(v, bool) else f"{k} {v:g}" for k, v in hp.items())


def report(
    rows: dict[str, Row],
    repeats: tuple[int, int],
    quick: bool,
    cartpole_steps: int,
    breakout_steps: int,
    solve: tuple[int, int],
) -> str:
    """The section's text; ``repeats`` is the runs per library on CartPole and on Breakout, ``solve`` the time to
    solve's step budget and evaluation interval."""
    import stable_baselines3
    import torch

    import distrl

    def solved(lib: str) -> str:
        times = rows["solve"].raw["values"][lib]
        return f"{sum(t is not None for t in times)} of {len(times)}"

    fmt = lambda v: "n/a" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}")  # noqa: E731
    lines = [
        f"`python benchmarks/dqn_vs_sb3.py{' --quick' if quick else ''}` — {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()}, {repeats[0]} runs each on CartPole and {repeats[1]} on Breakout (seeds from 0), "
        f"alternating, medians; one torch thread each; distrl {distrl.__version__}, "
        f"stable-baselines3 {stable_baselines3.__version__}, torch {torch.__version__}.",
        "",
        *comparison_table([r[:7] for r in rows.values()], fmt),
        "",
        f"- Goals, float32: CartPole SPS {goal(rows['cartpole'].ratio, 3)}; "
        f"Breakout SPS {goal(rows['breakout'].ratio, 1.5)}.",
        WHY,
        "- CartPole-v1: rl-baselines3-zoo's DQN settings in both, 1 env: "
        + settings(HP[CARTPOLE])
        + f", 256×256 ReLU. SPS over {cartpole_steps:,} steps after {WARMUP[CARTPOLE]:,} untimed ones (past "
        "learning_starts), so the timed steps include 128 gradient steps per 256 env steps.",
        f"- Time to solve: 10-episode deterministic evaluation every {solve[1]:,} steps (whole collections of 256; "
        f"SB3's callback fires one step later, after the same training phases), training seconds until it "
        f"reaches {TARGET:g} (evaluation excluded), {solve[0]:,} steps at most. Reached in {solved('distrl')} "
        f"runs of distrl and {solved('sb3')} of SB3; the median is over the runs that reached it (n/a: none did).",
        "- bf16 runs distrl's MLP matrix products in bfloat16 (float32 weights, Adam and losses); "
        "SB3 has no such option, the float32 row is the like-for-like one.",
        f"- Breakout: `{BREAKOUT}` (sticky actions 0.25), the standard preprocessing (no-ops, frame skip 4 with "
        "max-pooling, episodic life, FIRE at reset, 84×84 grey, 4 frames stacked, reward clipping): distrl's "
        "Atari family, SB3's `AtariWrapper` + `VecFrameStack(4)`. rl-baselines3-zoo's Atari DQN, 1 env: "
        + settings(HP[BREAKOUT])
        + " (the zoo's learning_starts is 100k), the Nature CNN with a linear head (SB3's `CnnPolicy`). SPS over "
        f"{breakout_steps:,} steps after {WARMUP[BREAKOUT]:,} random ones. SB3's compact buffer needs "
        f"`handle_timeout_termination=False`. Peak RSS includes the replay, "
        f"{'full' if WARMUP[BREAKOUT] + breakout_steps >= HP[BREAKOUT]['buffer_size'] else 'partly filled'} "
        "by the end.",
        raw_values(list(rows.values()), 1),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
