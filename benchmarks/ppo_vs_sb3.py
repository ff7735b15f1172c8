"""distrl PPO against stable-baselines3 PPO, side by side in one run.

Each measurement runs in its own subprocess (so peak RSS is that run's own), and the two
libraries alternate so that machine noise hits both alike. Both use one torch thread.

    python benchmarks/ppo_vs_sb3.py                 # everything, writes docs/benchmarks.md
    python benchmarks/ppo_vs_sb3.py --quick         # fewer repeats and steps

Needs the bench extra: pip install -e ".[bench,mujoco]".
"""

from __future__ import annotations

import argparse
import platform
import time

from harness import alternate, child_main, comparison_table, median, sb3_seconds_to_target, write_section

ZOO_CARTPOLE = dict(
    n_envs=8,
    n_steps=32,
    batch_size=256,
    n_epochs=20,
    gae_lambda=0.8,
    gamma=0.98,
    learning_rate=1e-3,
    ent_coef=0.0,
    clip_range=0.2,
)  # lr and clip linear from these
SB3_DEFAULTS = dict(
    n_envs=1,
    n_steps=2048,
    batch_size=64,
    n_epochs=10,
    gae_lambda=0.95,
    gamma=0.99,
    learning_rate=3e-4,
    ent_coef=0.0,
    clip_range=0.2,
)
EVAL_EVERY, TARGET = 10_000, 475.0


# ---------------------------------------------------------------- children: one measurement each


def child(lib: str, task: str, seed: int, steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    if task == "sps-cartpole":
        return _sps(lib, "CartPole-v1", ZOO_CARTPOLE, linear=True, seed=seed, steps=steps)
    if task == "sps-hopper":
        return _sps(lib, "Hopper-v5", SB3_DEFAULTS, linear=False, seed=seed, steps=steps)
    if task == "solve-cartpole":
        return _solve(lib, seed)
    if task == "sps-appo-cartpole":
        return _appo_sps(seed, steps)
    raise ValueError(task)


def _preset(algo: str, env_id: str, overrides: dict):
    """distrl's configs for ``algo`` on ``env_id`` with its preset, from this tree or an earlier commit's layout."""
    try:
        from distrl.training.presets import algo_configs
    except ImportError:  # a commit from before the package had its folders (against_commit.py measures both)
        from distrl.presets import algo_configs
    return algo_configs(algo, env_id, "auto", overrides)


def _appo_sps(seed: int, steps: int) -> dict:
    """APPO on CartPole-v1 with distrl's preset, ``--strategy single`` (stable-baselines3 has no APPO)."""
    from distrl.training import OnPolicyTrainer

    run, cfg, _ = _preset("appo", "CartPole-v1", {"seed": seed, "quiet": True, "total_steps": 10**9})
    warmup = cfg.n_envs * cfg.n_steps
    trainer = OnPolicyTrainer(run.replace(total_steps=steps + warmup), cfg)
    trainer.train(stop_at=warmup)
    start_steps, start_s = trainer.steps, trainer.train_s
    trainer.train()
    return {"sps": (trainer.steps - start_steps) / (trainer.train_s - start_s)}


def _sps(lib: str, env_id: str, hp: dict, linear: bool, seed: int, steps: int) -> dict:
    warmup = hp["n_envs"] * hp["n_steps"]
    if lib == "distrl":
        from distrl.config import PPOConfig, RunConfig
        from distrl.training import OnPolicyTrainer

        schedule = "linear" if linear else "constant"
        cfg = PPOConfig(**hp, lr_schedule=schedule, clip_schedule=schedule)
        trainer = OnPolicyTrainer(RunConfig(env=env_id, total_steps=steps + warmup, seed=seed, quiet=True), cfg)
        trainer.train(stop_at=warmup)
        start_steps, start_s = trainer.steps, trainer.train_s
        trainer.train()
        return {"sps": (trainer.steps - start_steps) / (trainer.train_s - start_s)}
    model = _sb3_model(env_id, hp, linear, seed)
    model.learn(warmup)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return {"sps": steps / (time.perf_counter() - start)}


def _sb3_model(env_id: str, hp: dict, linear: bool, seed: int):
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    hp = dict(hp)
    n_envs = hp.pop("n_envs")
    lr, clip = hp.pop("learning_rate"), hp.pop("clip_range")
    if linear:
        lr_value, clip_value = lr, clip
        lr = lambda progress: lr_value * progress  # noqa: E731 - SB3 takes schedules as callables
        clip = lambda progress: clip_value * progress  # noqa: E731
    env = make_vec_env(env_id, n_envs=n_envs, seed=seed)
    return PPO("MlpPolicy", env, learning_rate=lr, clip_range=clip, seed=seed, device="cpu", verbose=0, **hp)


def _solve(lib: str, seed: int) -> dict:
    """Training seconds (evaluation excluded) until a 10-episode deterministic eval >= 475."""
    if lib == "distrl":
        from distrl.training import OnPolicyTrainer

        run, cfg, _ = _preset(
            "ppo",
            "CartPole-v1",
            {"seed": seed, "quiet": True, "eval_every": EVAL_EVERY, "target_return": TARGET, "total_steps": 200_000},
        )
        trainer = OnPolicyTrainer(run, cfg)
        trainer.train()
        solved = trainer.last_eval is not None and trainer.last_eval[0] >= TARGET
        return {"train_s": trainer.train_s if solved else None, "steps": trainer.steps}

    from stable_baselines3.common.env_util import make_vec_env

    model = _sb3_model("CartPole-v1", ZOO_CARTPOLE, linear=True, seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1_000_000)
    return sb3_seconds_to_target(model, eval_env, 200_000, EVAL_EVERY, TARGET)


# ---------------------------------------------------------------- parent: alternate, aggregate, report


def main() -> None:
    if child_main(lambda lib, task, seed, steps: child(lib, task, seed, int(steps))):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 2 if args.quick else 5
    rows = []
    tasks = [
        ("sps-cartpole", "sps", 20_000 if args.quick else 50_000, "SPS, CartPole-v1, rl-zoo settings", True),
        ("solve-cartpole", "train_s", 0, "training s to eval >= 475, CartPole-v1", False),
        ("sps-hopper", "sps", 6_144 if args.quick else 20_480, "SPS, Hopper-v5, SB3 default PPO", True),
    ]
    for task, key, steps, label, higher_better in tasks:
        print(f"{label} ...", flush=True)
        res = alternate(__file__, task, repeats, steps, key, ("distrl", "sb3"))
        d, s = median(res["values"]["distrl"]), median(res["values"]["sb3"])
        ratio = (d / s if higher_better else s / d) if d and s else None
        rows.append((label, d, s, ratio, median(res["rss"]["distrl"]), median(res["rss"]["sb3"]), res))
    write_report(rows, repeats)


def write_report(rows: list, repeats: int) -> None:
    import stable_baselines3
    import torch

    import distrl

    fmt = lambda v: "n/a" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.2f}")  # noqa: E731
    lines = [
        f"`python benchmarks/ppo_vs_sb3.py` — {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{repeats} runs each (seeds 0..{repeats - 1}), alternating, medians; one torch thread each; "
        f"distrl {distrl.__version__}, stable-baselines3 {stable_baselines3.__version__}, torch {torch.__version__}.",
        "",
        *comparison_table(rows, fmt),
        "",
        "- rl-zoo CartPole settings: 8 envs, n_steps 32, batch 256, 20 epochs, gae_lambda 0.8, gamma 0.98, "
        "lr and clip linear from 1e-3 and 0.2, ent_coef 0. distrl steps the 8 envs with Gymnasium's native "
        "CartPole vector env, SB3 with its DummyVecEnv.",
        "- Time to solve: 10-episode deterministic evaluation every 10k steps, training seconds until it "
        "reaches 475 (evaluation time excluded). SB3 with the rl-zoo settings; distrl with its own CartPole-v1 "
        "preset (32 native envs, n_steps 16, batch 256, 10 epochs, lr 2e-3 linear, gamma 0.98, gae_lambda 0.8, target_kl 0.02).",
        "- Hopper-v5: SB3's default PPO hyperparameters (1 env, n_steps 2048, batch 64, 10 epochs, lr 3e-4, "
        "64×64 tanh networks) in both libraries.",
        "- Raw values per run:",
        "",
    ]
    for label, *_, res in rows:
        values = {lib: [round(v, 2) if v is not None else None for v in vs] for lib, vs in res["values"].items()}
        lines.append(f"  - {label}: distrl {values['distrl']}, SB3 {values['sb3']}")
    write_section("PPO: distrl vs stable-baselines3", "\n".join(lines))


if __name__ == "__main__":
    main()
