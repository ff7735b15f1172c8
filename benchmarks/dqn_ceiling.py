"""DQN's gradient step against its unavoidable arithmetic, in distrl and in stable-baselines3, on one thread.

    python benchmarks/dqn_ceiling.py              # 5 runs each, alternating, medians
    python benchmarks/dqn_ceiling.py --runs 3
    python benchmarks/dqn_ceiling.py --profile    # where distrl's step goes: cProfile over 1,000 steps

At distrl's CartPole-v1 preset (the zoo's settings on a 256x256 network, batch 64) a gradient step multiplies a
64x256 batch by a 256x256 weight four times: the online network's forward, the target network's forward on the next
observations, and the backward pass's two products (the weight's gradient and the input's). The other products
(4x256 in, 256x2 out) are under 3% of those FLOPs. ``products`` times those four alone, back to back: no
implementation's step can be faster. Each library's step is timed over ``STEPS`` gradient steps after a warm-up that
fills the replay, sampling included, as training runs it (distrl: replay sample and ``learner_step``;
stable-baselines3: ``DQN.train(gradient_steps=STEPS)``).
"""

from __future__ import annotations

import argparse
import time

from dqn_vs_sb3 import CARTPOLE, HP, WARMUP, _distrl, _sb3
from harness import alternating, child_main, markdown_table, measure, median

STEPS = 2_000
BATCH, WIDTH = HP[CARTPOLE]["batch_size"], 256


def child(lib: str, task: str, seed: int, arg: str) -> dict:
    import torch

    torch.set_num_threads(1)
    steps = int(arg)
    if lib == "products":
        x, w, out = torch.randn(BATCH, WIDTH), torch.randn(WIDTH, WIDTH), torch.empty(BATCH, WIDTH)
        xt, gw = x.t().contiguous(), torch.empty(WIDTH, WIDTH)
        for _ in range(steps // 10):
            torch.mm(x, w, out=out)
        start = time.perf_counter()
        for _ in range(steps):
            torch.mm(x, w, out=out)  # online forward
            torch.mm(x, w, out=out)  # target forward
            torch.mm(xt, x, out=gw)  # the weight's gradient: [256, 64] @ [64, 256]
            torch.mm(x, w.t(), out=out)  # the input's gradient
        return {"us": (time.perf_counter() - start) / steps * 1e6}
    if lib == "distrl":
        trainer = _distrl(CARTPOLE, seed, WARMUP[CARTPOLE])
        trainer.train()  # fills the replay past learning_starts
        cfg = trainer.cfg
        for _ in range(50):
            batch = trainer.replay.sample(cfg.batch_size, trainer.sample_rng, trainer.device, 1.0)
            trainer.learner_step(batch, 0.5)
        start = time.perf_counter()
        for _ in range(steps):
            batch = trainer.replay.sample(cfg.batch_size, trainer.sample_rng, trainer.device, 1.0)
            trainer.learner_step(batch, 0.5)
        return {"us": (time.perf_counter() - start) / steps * 1e6}
    model = _sb3(CARTPOLE, seed)
    model.learn(WARMUP[CARTPOLE])
    model.train(gradient_steps=50, batch_size=BATCH)
    start = time.perf_counter()
    model.train(gradient_steps=steps, batch_size=BATCH)
    return {"us": (time.perf_counter() - start) / steps * 1e6}


def profile(steps: int = 1_000) -> None:
    """cProfile's table of distrl's learner step (one batch, sampled once: sampling is timed apart)."""
    import cProfile
    import pstats

    import torch

    torch.set_num_threads(1)
    trainer = _distrl(CARTPOLE, 0, WARMUP[CARTPOLE])
    trainer.train()
    batch = trainer.replay.sample(trainer.cfg.batch_size, trainer.sample_rng, trainer.device, 1.0)
    for _ in range(100):
        trainer.learner_step(batch, 0.5)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(steps):
        trainer.learner_step(batch, 0.5)
    profiler.disable()
    print(f"{steps:,} learner steps, times in seconds (per step: divide by {steps:,}):")
    pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


def main() -> None:
    if child_main(child):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--profile", action="store_true", help="profile distrl's learner step instead")
    args = parser.parse_args()
    if args.profile:
        profile()
        return
    us: dict[str, list[float]] = {lib: [] for lib in ("distrl", "sb3", "products")}
    for i, lib in enumerate(alternating(list(us), args.runs)):
        us[lib].append(measure(__file__, lib, "step", i // len(us), STEPS)["us"])
        print(f"  {lib:8s} {us[lib][-1]:8.1f} µs a gradient step", flush=True)
    floor = median(us["products"])
    rows = [
        [name, f"{median(us[lib]):.1f}", f"{median(us[lib]) / floor:.2f}x", f"{floor / median(us[lib]):.0%}"]
        for name, lib in (("distrl", "distrl"), ("stable-baselines3", "sb3"), ("the four products alone", "products"))
    ]
    print(
        "\n".join(markdown_table(["one gradient step", "µs, median", "against the products", "products' share"], rows))
    )
    print(f"distrl against stable-baselines3: {median(us['sb3']) / median(us['distrl']):.2f}x faster a gradient step")


if __name__ == "__main__":
    main()
