"""distrl TD3 (online, from scratch) against stable-baselines3 TD3 on Pendulum-v1, side by side in one run.

    python benchmarks/td3_vs_sb3.py            # writes its section of docs/benchmarks.md
    python benchmarks/td3_vs_sb3.py --quick

rl-baselines3-zoo's Pendulum-v1 TD3 (400x300 ReLU networks, learning rate 1e-3, gamma 0.98, buffer 200,000, 10,000
uniformly random steps first, Gaussian exploration noise 0.1), the rest both libraries' shared defaults (batch 256,
tau 0.005, the actor and targets every second step, target smoothing noise 0.2 clipped at 0.5), with one gradient
step after each env step on both sides (the zoo's train_freq of one episode makes as many, in a burst at each
episode's end). Each measurement runs in its own subprocess, libraries alternate, medians are reported; both
libraries run with the same number of torch threads. Steps per second are measured after learning starts, with
100 random steps in place of 10,000 (the same work per step; the random steps would only lengthen the run).
"""

from __future__ import annotations

import argparse
import platform
import time

from harness import child_main, compare_with_sb3, comparison_table, raw_values, sb3_seconds_to_target, write_section

HP = dict(learning_rate=1e-3, gamma=0.98, buffer_size=200_000, learning_starts=10_000, batch_size=256, tau=0.005)
NET = (400, 300)
NOISE = 0.1
EVAL_EVERY, TARGET, BUDGET = 1_000, -200.0, 20_000


def child(lib: str, task: str, seed: int, arg: str) -> dict:
    import torch

    threads, steps = (int(v) for v in arg.split(":"))
    torch.set_num_threads(threads)
    if task == "sps":
        return _sps(lib, seed, steps, threads)
    return _solve(lib, seed, threads)


def _distrl(seed: int, threads: int, precision: str = "fp32", learning_starts: int = HP["learning_starts"], **run):
    from distrl.config import RunConfig, TD3Config
    from distrl.training import OfflineTrainer

    hp = {**HP, "learning_starts": learning_starts}
    return OfflineTrainer(
        RunConfig(
            algo="td3",
            env="Pendulum-v1",
            seed=seed,
            quiet=True,
            threads=threads,
            total_steps=BUDGET,
            precision=precision,
            preset="none",
            **run,
        ),
        TD3Config(**hp, net_arch=NET, exploration_noise=NOISE),
    )


def _sb3(seed: int, learning_starts: int = HP["learning_starts"]):
    import numpy as np
    from stable_baselines3 import TD3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.noise import NormalActionNoise

    env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed)
    noise = NormalActionNoise(np.zeros(1), NOISE * np.ones(1))
    return TD3(
        "MlpPolicy",
        env,
        seed=seed,
        device="cpu",
        verbose=0,
        action_noise=noise,
        policy_kwargs={"net_arch": list(NET)},
        train_freq=1,
        gradient_steps=1,
        **{**HP, "learning_starts": learning_starts},
    )


def _sps(lib: str, seed: int, steps: int, threads: int) -> dict:
    """Steps per second after learning starts: every measured step includes a gradient step."""
    starts, warmup = 100, 500
    if lib.startswith("distrl"):
        trainer = _distrl(seed, threads, "bf16" if lib == "distrl-bf16" else "fp32", learning_starts=starts)
        trainer.train(stop_at=warmup)
        s0, t0 = trainer.steps, trainer.train_s
        trainer.train(stop_at=warmup + steps)
        return {"sps": (trainer.steps - s0) / (trainer.train_s - t0)}
    model = _sb3(seed, learning_starts=starts)
    model.learn(warmup)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return {"sps": steps / (time.perf_counter() - start)}


def _solve(lib: str, seed: int, threads: int) -> dict:
    """Training seconds (evaluation excluded) until a 10-episode deterministic eval >= -200, every 1000 steps."""
    if lib == "distrl":
        trainer = _distrl(seed, threads, eval_every=EVAL_EVERY, target_return=TARGET, eval_episodes=10)
        trainer.train()
        solved = trainer.last_eval is not None and trainer.last_eval[0] >= TARGET
        return {"train_s": trainer.train_s if solved else None, "steps": trainer.steps}

    from stable_baselines3.common.env_util import make_vec_env

    eval_env = make_vec_env("Pendulum-v1", n_envs=1, seed=seed + 1_000_000)
    return sb3_seconds_to_target(_sb3(seed), eval_env, BUDGET, EVAL_EVERY, TARGET)


def main() -> None:
    if child_main(child):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 2 if args.quick else 3
    steps = 1_000 if args.quick else 3_000
    measures = [
        ("SPS, 1 thread each", "sps", f"1:{steps}", "sps", True, "distrl"),
        ("SPS, 2 threads each", "sps", f"2:{steps}", "sps", True, "distrl"),
        ("training s to eval >= -200, 1 thread each", "solve", "1:0", "train_s", False, "distrl"),
        ("SPS, 1 thread each, distrl --precision bf16", "sps", f"1:{steps}", "sps", True, "distrl-bf16"),
    ]
    rows = compare_with_sb3(__file__, measures, repeats)
    import stable_baselines3

    import distrl

    fmt = lambda v: "n/a" if v is None else f"{v:,.1f}"  # noqa: E731
    lines = [
        f"`python benchmarks/td3_vs_sb3.py` — {time.strftime('%Y-%m-%d')}, {platform.machine()}, Pendulum-v1, "
        f"{repeats} runs each (seeds 0..{repeats - 1}), alternating, medians; distrl {distrl.__version__}, "
        f"stable-baselines3 {stable_baselines3.__version__}. Identical hyperparameters: rl-baselines3-zoo's "
        "(400×300 ReLU networks, lr 1e-3, gamma 0.98, 10,000 random steps first, exploration noise 0.1), one "
        "gradient step per env step on both sides.",
        "",
        *comparison_table([r[:7] for r in rows], fmt),
        "",
        "- SPS is measured after learning starts (100 random steps there), so every step includes one gradient step.",
        "- Time to solve: 10-episode deterministic evaluation every 1,000 steps, training seconds until it "
        "reaches -200 (evaluation excluded); the random steps count, in both libraries.",
        raw_values(rows, 1),
    ]
    write_section("TD3: distrl vs stable-baselines3", "\n".join(lines))


if __name__ == "__main__":
    main()
