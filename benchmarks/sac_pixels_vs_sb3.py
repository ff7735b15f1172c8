"""distrl SAC from pixels against stable-baselines3 SAC's CnnPolicy on CarRacing-v3, side by side in one run.

    python benchmarks/sac_pixels_vs_sb3.py            # writes its section of docs/benchmarks.md
    python benchmarks/sac_pixels_vs_sb3.py --quick

The same networks on both sides: the Nature CNN (512 features) for the actor and one for the
critic, shared by its two Q heads, each head 256x256 ReLU; batch 256, one gradient step per env
step, automatic entropy. CarRacing-v3 gives 96x96 RGB frames (uint8). Each measurement runs in its
own subprocess on one torch thread, libraries alternate, medians are reported. One row runs distrl
with ``--precision bf16`` (its modules under bfloat16 autocast) against stable-baselines3 in float32.
"""

from __future__ import annotations

import argparse
import platform
import time

from harness import alternate, child_main, comparison_table, median, raw_values, write_section

ENV = "CarRacing-v3"
HP = dict(
    learning_rate=3e-4,
    buffer_size=10_000,
    learning_starts=100,
    batch_size=256,
    tau=0.005,
    gamma=0.99,
    train_freq=1,
    gradient_steps=1,
)
WARMUP = 110
"""Steps before the measured ones: past learning_starts, so every measured step includes a gradient step."""


def child(lib: str, task: str, seed: int, arg: str) -> dict:
    import torch

    torch.set_num_threads(1)
    steps = int(arg)
    if lib.startswith("distrl"):
        from distrl.config import RunConfig, SACConfig
        from distrl.training import OffPolicyTrainer

        run = RunConfig(
            algo="sac",
            env=ENV,
            seed=seed,
            quiet=True,
            threads=1,
            total_steps=WARMUP + steps,
            precision="bf16" if lib == "distrl-bf16" else "fp32",
        )
        trainer = OffPolicyTrainer(run, SACConfig(**HP))
        trainer.train(stop_at=WARMUP)
        s0, t0 = trainer.steps, trainer.train_s
        trainer.train(stop_at=WARMUP + steps)
        sps = (trainer.steps - s0) / (trainer.train_s - t0)
        trainer.close()
        return {"sps": sps}
    from stable_baselines3 import SAC
    from stable_baselines3.common.env_util import make_vec_env

    model = SAC("CnnPolicy", make_vec_env(ENV, n_envs=1, seed=seed), seed=seed, device="cpu", verbose=0, **HP)
    model.learn(WARMUP)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return {"sps": steps / (time.perf_counter() - start)}


def main() -> None:
    if child_main(child):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 2 if args.quick else 3
    steps = 10 if args.quick else 40
    rows = []
    for label, mine in [
        ("SPS, 1 thread each", "distrl"),
        ("SPS, 1 thread each, distrl --precision bf16", "distrl-bf16"),
    ]:
        print(f"{label} ...", flush=True)
        res = alternate(__file__, "sps", repeats, steps, "sps", (mine, "sb3"))
        d, s = median(res["values"][mine]), median(res["values"]["sb3"])
        rows.append(
            (label, d, s, d / s if d and s else None, median(res["rss"][mine]), median(res["rss"]["sb3"]), res, mine)
        )
    import stable_baselines3

    import distrl

    fmt = lambda v: "n/a" if v is None else f"{v:,.2f}"  # noqa: E731
    lines = [
        f"`python benchmarks/sac_pixels_vs_sb3.py` — {time.strftime('%Y-%m-%d')}, {platform.machine()}, {ENV} "
        f"(96×96 RGB frames), {repeats} runs each (seeds 0..{repeats - 1}), alternating, medians; distrl "
        f"{distrl.__version__}, stable-baselines3 {stable_baselines3.__version__} (`CnnPolicy`). The same networks: "
        "a Nature CNN for the actor and one for the critic that its two Q heads share, 256×256 ReLU heads; "
        f"batch {HP['batch_size']}, one gradient step per env step, automatic entropy, buffer "
        f"{HP['buffer_size']:,}.",
        "",
        *comparison_table([r[:7] for r in rows], fmt),
        "",
        f"- SPS over {steps} steps after {WARMUP} (past learning_starts {HP['learning_starts']}), so every measured "
        "step includes one gradient step; the env's own step is about 5 ms of the several hundred each takes.",
        "- One gradient step runs the critic's CNN forward on the batch and on the next observations (target), "
        "the actor's on both, the critic's again for the actor loss, and two backward passes (critic, actor). "
        "stable-baselines3 also sends the actor loss back through the critic's CNN, whose gradient it then "
        "discards; distrl stops that gradient at the action.",
        "- bf16 runs the CNNs and heads under bfloat16 autocast (float32 weights, gradients, Adam and losses); this "
        "CPU has AVX-512 BF16. SB3 has no such option; the float32 row is the like-for-like one. "
        "`tests/nets/test_sac_module.py` checks that the bfloat16 gradient matches the float32 one (cosine > 0.99) and "
        "that SAC learns a Dict-observation task in both precisions.",
        raw_values(rows, 2),
    ]
    write_section("SAC from pixels: distrl vs stable-baselines3", "\n".join(lines))


if __name__ == "__main__":
    main()
