"""distrl PPO against stable-baselines3 PPO, side by side in one run.

Each measurement runs in its own subprocess (so peak RSS is that run's own), and the two
libraries alternate so that machine noise hits both alike. Both use one torch thread.

    python benchmarks/ppo_vs_sb3.py                 # everything, writes docs/benchmarks.md
    python benchmarks/ppo_vs_sb3.py --quick         # fewer repeats and steps

Needs the bench extra: pip install -e ".[bench,mujoco]".
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ZOO_CARTPOLE = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gae_lambda=0.8, gamma=0.98,
                    learning_rate=1e-3, ent_coef=0.0, clip_range=0.2)  # lr and clip linear from these
SB3_DEFAULTS = dict(n_envs=1, n_steps=2048, batch_size=64, n_epochs=10, gae_lambda=0.95, gamma=0.99,
                    learning_rate=3e-4, ent_coef=0.0, clip_range=0.2)
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
    raise ValueError(task)


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
        from distrl.presets import ppo_configs
        from distrl.training import OnPolicyTrainer

        run, cfg, _ = ppo_configs("CartPole-v1", "auto", {"seed": seed, "quiet": True, "eval_every": EVAL_EVERY,
                                                           "target_return": TARGET, "total_steps": 200_000})
        trainer = OnPolicyTrainer(run, cfg)
        trainer.train()
        solved = trainer.last_eval is not None and trainer.last_eval[0] >= TARGET
        return {"train_s": trainer.train_s if solved else None, "steps": trainer.steps}

    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    model = _sb3_model("CartPole-v1", ZOO_CARTPOLE, linear=True, seed=seed)
    eval_env = make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1_000_000)

    class EvalTimer(BaseCallback):
        def __init__(self):
            super().__init__()
            self.eval_s, self.next_eval, self.solved_at = 0.0, EVAL_EVERY, None

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += EVAL_EVERY
            start = time.perf_counter()
            mean, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=10, deterministic=True)
            self.eval_s += time.perf_counter() - start
            if mean >= TARGET:
                self.solved_at = self.num_timesteps
                return False
            return True

    timer = EvalTimer()
    start = time.perf_counter()
    model.learn(200_000, callback=timer)
    wall = time.perf_counter() - start
    return {"train_s": wall - timer.eval_s if timer.solved_at else None, "steps": model.num_timesteps}


# ---------------------------------------------------------------- parent: alternate, aggregate, report

def measure(lib: str, task: str, seed: int, steps: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", lib, task, str(seed), str(steps)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_task(task: str, repeats: int, steps: int, key: str) -> dict[str, list]:
    results: dict[str, list] = {"distrl": [], "sb3": []}
    rss: dict[str, list] = {"distrl": [], "sb3": []}
    for i in range(repeats):
        for lib in (("distrl", "sb3") if i % 2 == 0 else ("sb3", "distrl")):
            r = measure(lib, task, seed=i, steps=steps)
            results[lib].append(r[key])
            rss[lib].append(r["max_rss_mb"])
            print(f"  {task} {lib:6s} seed {i}: {key}={r[key]} rss={r['max_rss_mb']:.0f} MB", flush=True)
    return {"values": results, "rss": rss}


def median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        lib, task, seed, steps = sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
        result = child(lib, task, seed, steps)
        result["max_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out", default=str(Path(__file__).parents[1] / "docs" / "benchmarks.md"))
    args = parser.parse_args()
    repeats = 2 if args.quick else 5
    rows = []
    tasks = [("sps-cartpole", "sps", 20_000 if args.quick else 50_000, "SPS, CartPole-v1, rl-zoo settings", True),
             ("solve-cartpole", "train_s", 0, "training s to eval >= 475, CartPole-v1", False),
             ("sps-hopper", "sps", 6_144 if args.quick else 20_480, "SPS, Hopper-v5, SB3 default PPO", True)]
    for task, key, steps, label, higher_better in tasks:
        print(f"{label} ...", flush=True)
        res = run_task(task, repeats, steps, key)
        d, s = median(res["values"]["distrl"]), median(res["values"]["sb3"])
        ratio = (d / s if higher_better else s / d) if d and s else None
        rows.append((label, d, s, ratio, median(res["rss"]["distrl"]), median(res["rss"]["sb3"]), res))
    write_report(rows, repeats, Path(args.out))


def write_report(rows: list, repeats: int, out: Path) -> None:
    import distrl
    import stable_baselines3
    import torch

    fmt = lambda v: "n/a" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.2f}")  # noqa: E731
    lines = [
        "## PPO: distrl vs stable-baselines3",
        "",
        f"`python benchmarks/ppo_vs_sb3.py` — {time.strftime('%Y-%m-%d')}, {platform.processor() or platform.machine()}, "
        f"{repeats} runs each (seeds 0..{repeats - 1}), alternating, medians; one torch thread each; "
        f"distrl {distrl.__version__}, stable-baselines3 {stable_baselines3.__version__}, torch {torch.__version__}.",
        "",
        "| measure | distrl | SB3 | distrl advantage | peak RSS distrl / SB3 (MB) |",
        "|---|---|---|---|---|",
    ]
    for label, d, s, ratio, rss_d, rss_s, _ in rows:
        lines.append(f"| {label} | {fmt(d)} | {fmt(s)} | {'n/a' if ratio is None else f'{ratio:.2f}×'} | "
                     f"{rss_d:.0f} / {rss_s:.0f} |")
    lines += [
        "",
        "- rl-zoo CartPole settings: 8 envs, n_steps 32, batch 256, 20 epochs, gae_lambda 0.8, gamma 0.98, "
        "lr and clip linear from 1e-3 and 0.2, ent_coef 0. distrl steps the 8 envs with Gymnasium's native "
        "CartPole vector env, SB3 with its DummyVecEnv.",
        "- Time to solve: 10-episode deterministic evaluation every 10k steps, training seconds until it "
        "reaches 475 (evaluation time excluded). SB3 with the rl-zoo settings; distrl with its own CartPole-v1 "
        "preset (32 native envs, n_steps 16, batch 256, 10 epochs, lr 2e-3 linear, gamma 0.98, gae_lambda 0.8).",
        "- Hopper-v5: SB3's default PPO hyperparameters (1 env, n_steps 2048, batch 64, 10 epochs, lr 3e-4, "
        "64×64 tanh networks) in both libraries.",
        "- Raw values per run:",
        "",
    ]
    for label, *_, res in rows:
        lines.append(f"  - {label}: distrl {res['values']['distrl']}, SB3 {res['values']['sb3']}")
    section = "\n".join(lines) + "\n"
    text = out.read_text() if out.exists() else "# Benchmarks\n\nMeasured on the project's 2-core CI machines.\n\n"
    start = text.find("## PPO: distrl vs stable-baselines3")
    if start >= 0:
        end = text.find("\n## ", start + 1)
        text = text[:start] + section + (text[end + 1:] if end >= 0 else "")
    else:
        text = text.rstrip() + "\n\n" + section
    out.write_text(text)
    print(section)


if __name__ == "__main__":
    main()
