"""DQN without a preset: distrl's fallback for the env's spaces against stable-baselines3's DQN defaults.

    python benchmarks/dqn_fallbacks.py                     # writes its section of docs/benchmarks.md
    python benchmarks/dqn_fallbacks.py --quick             # tiny budgets, prints the section, writes nothing
    python benchmarks/dqn_fallbacks.py --envs MountainCar-v0 --libs distrl --cache runs.json

Four classic-control and Box2D tasks at rl-baselines3-zoo's DQN budgets (50k-120k steps). distrl trains with
the fallback ``--preset auto`` picks from the env's spaces when the env has no preset
(:func:`distrl.training.fallbacks.fallback_for_run`); CartPole-v1 and LunarLander-v3 have presets of their own,
so they are given the same fallback here, as an env of their spaces without a preset would get it.
stable-baselines3 trains ``DQN("MlpPolicy", env)`` with its defaults, which are distrl's library defaults
(``--preset none``). Each run ends with a 10-episode deterministic evaluation on an env seeded apart from
training. One run at a time, each in its own subprocess with one torch thread.

``--cache FILE`` keeps every finished run's result in FILE and reuses it, so that a rerun of one env or one
library leaves the others' runs as they were.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

from harness import child_main, markdown_table, measure, write_section

BUDGETS = {"CartPole-v1": 50_000, "Acrobot-v1": 100_000, "MountainCar-v0": 120_000, "LunarLander-v3": 100_000}
"""rl-baselines3-zoo's n_timesteps in its DQN entries (hyperparams/dqn.yml; LunarLander-v2's on v3)."""
LIBS = ("distrl", "sb3")
EVAL_EPISODES, EVAL_SEED = 10, 1_000_000
TITLE = "DQN without a preset: fallbacks against stable-baselines3's defaults"
TRIED = (
    "- How small-control was chosen (seed 0, `distrl train dqn ENV --preset none` with the values as flags, "
    "one run at a time): first its values with a training phase every 4 env steps of 2 gradient steps (the "
    "Acrobot and LunarLander entries' 4 steps, half their gradient steps): CartPole-v1 500.0, Acrobot-v1 -81.3, "
    "LunarLander-v3 193.8, but MountainCar-v0 -200.0, the flag never reached in training. On MountainCar-v0: "
    "with gamma 0.98 -200.0, with learning rate 4e-3 -200.0; rl-baselines3-zoo's MountainCar entry (lr 4e-3, "
    "gamma 0.98, buffer 10k, target every 600, 8 gradient steps every 16 env steps, epsilon to 0.07 over 20%) "
    "-103.3, and with 2 gradient steps every 4 -200.0; that entry with lr 6.3e-4 -103.8, and with 2 every 4 "
    "-200.0. The 16-step phase is what took the car to the flag, so small-control has it. The zoo's MountainCar "
    "entry on the others: CartPole-v1 95.4, Acrobot-v1 -93.9, LunarLander-v3 143.6."
)
"""How the fallback's values were chosen: throwaway runs of this session, quoted as measured."""
ACROBOT_SEED_0 = (
    "- Acrobot-v1 seed 0: its last 100 training episodes averaged -88.7 (exploring), its greedy evaluation "
    "-209.4 ± 190.7 over the 10 episodes: some ran to the 500-step limit."
)
"""What the first Acrobot-v1 run's figures say (its summary.json, from the run of the same seed and values)."""


def child(lib: str, env_id: str, seed: int, arg: str) -> dict:
    import torch

    torch.set_num_threads(1)
    return (_distrl if lib == "distrl" else _sb3)(env_id, seed, int(arg))


def _distrl(env_id: str, seed: int, steps: int) -> dict:
    from distrl.config import DQNConfig, RunConfig
    from distrl.training import make_trainer
    from distrl.training.fallbacks import fallback_for_run

    run = RunConfig(
        algo="dqn", env=env_id, seed=seed, total_steps=steps, threads=1, quiet=True, preset="none", eval_max_steps=0
    )
    choice = fallback_for_run(run)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        summary = make_trainer("dqn", run, DQNConfig(**choice.values), run_dir=Path(tmp) / "run").run_to_end(
            None, start
        )
    return {
        "mean": summary["final_eval_mean_return"],
        "train_s": summary["train_s"],
        "fallback": choice.fallback.name if choice.fallback else "none",
        "spaces": choice.spaces,
    }


def _sb3(env_id: str, seed: int, steps: int) -> dict:
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy

    model = DQN("MlpPolicy", make_vec_env(env_id, n_envs=1, seed=seed), seed=seed, device="cpu", verbose=0)
    start = time.perf_counter()
    model.learn(steps)
    train_s = time.perf_counter() - start
    eval_env = make_vec_env(env_id, n_envs=1, seed=seed + EVAL_SEED)
    mean, _ = evaluate_policy(model, eval_env, n_eval_episodes=EVAL_EPISODES, deterministic=True)
    return {"mean": float(mean), "train_s": train_s}


def main() -> None:
    if child_main(child):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="tiny budgets; print the section instead of writing it")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per env and library, from 0")
    parser.add_argument("--envs", nargs="+", default=list(BUDGETS), choices=list(BUDGETS))
    parser.add_argument("--libs", nargs="+", default=list(LIBS), choices=list(LIBS), help="libraries to run now")
    parser.add_argument("--cache", type=Path, help="JSON file of finished runs, read and written")
    args = parser.parse_args()
    seeds = 1 if args.quick else args.seeds
    cache = json.loads(args.cache.read_text()) if args.cache and args.cache.exists() else {}
    for env_id in args.envs:
        steps = 2_000 if args.quick else BUDGETS[env_id]
        for seed in range(seeds):
            for lib in args.libs:
                key = f"{lib}/{env_id}/{seed}/{steps}"
                if key not in cache:
                    cache[key] = measure(__file__, lib, env_id, seed, steps)
                    if args.cache:
                        args.cache.write_text(json.dumps(cache, indent=1))
                result = cache[key]
                print(f"  {env_id} {lib:6s} seed {seed}: {result['mean']:.1f} in {result['train_s']:.0f} s", flush=True)
    body = report(cache, args.quick)
    if args.quick:
        print(body)
    else:
        write_section(TITLE, body)


def _cell(results: list[dict]) -> tuple[str, str]:
    """Every seed's final evaluation, and their mean ± std (std over seeds, n-1; none for one seed)."""
    means = [r["mean"] for r in results]
    per_seed = ", ".join(f"{m:.1f}" for m in means)
    if len(means) < 2:
        return per_seed, f"{means[0]:.1f}" if means else "n/a"
    return per_seed, f"{statistics.mean(means):.1f} ± {statistics.stdev(means):.1f}"


def _is_run(key: str, lib: str, env_id: str, steps: int) -> bool:
    """Whether a cache key (``lib/env/seed/steps``) is a run of ``lib`` on ``env_id`` at ``steps``."""
    return key.startswith(f"{lib}/{env_id}/") and key.endswith(f"/{steps}")


def report(cache: dict, quick: bool) -> str:
    """The section's text from every cached run at this script's budgets (``quick``: its tiny ones)."""
    import stable_baselines3
    import torch

    import distrl

    rows, counts = [], []
    for env_id, budget in BUDGETS.items():
        steps = 2_000 if quick else budget
        found = {lib: [cache[k] for k in sorted(cache) if _is_run(k, lib, env_id, steps)] for lib in LIBS}
        if not any(found.values()):
            continue
        fallback = next((f"{r['fallback']} ({r['spaces']})" for r in found["distrl"]), "n/a")
        d_seeds, d_mean = _cell(found["distrl"])
        s_seeds, s_mean = _cell(found["sb3"])
        minutes = lambda rs: f"{statistics.mean(r['train_s'] for r in rs) / 60:.1f}" if rs else "n/a"  # noqa: E731
        rows.append(
            [
                f"{env_id} ({steps // 1000}k)",
                fallback,
                d_seeds,
                d_mean,
                s_seeds,
                s_mean,
                f"{minutes(found['distrl'])} / {minutes(found['sb3'])}",
            ]
        )
        counts.append(f"{env_id} {len(found['distrl'])} and {len(found['sb3'])}")
    header = [
        "env (steps)",
        "distrl fallback (spaces)",
        "distrl: eval per seed",
        "distrl: mean ± std",
        "SB3 defaults: eval per seed",
        "SB3 defaults: mean ± std",
        "training min per run, distrl / SB3",
    ]
    lines = [
        f"`python benchmarks/dqn_fallbacks.py{' --quick' if quick else ''}` — {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()}, runs one at a time, one torch thread each; seeds from 0 (runs per env, distrl "
        f"and SB3: {'; '.join(counts)}); distrl {distrl.__version__}, stable-baselines3 "
        f"{stable_baselines3.__version__}, torch {torch.__version__}.",
        "",
        *markdown_table(header, rows),
        "",
        "- Each cell is the final evaluation: the mean return of 10 deterministic episodes on an env seeded apart "
        "from training; mean ± std over seeds.",
        "- distrl: the fallback `--preset auto` picks from the env's spaces where the env has no preset "
        "(`distrl train dqn acrobot` prints it as its first line). CartPole-v1 and LunarLander-v3 have presets; "
        'here they get the fallback as an env of their spaces without one would. SB3: `DQN("MlpPolicy", env)`, '
        "its defaults, which are distrl's library defaults (`--preset none`): Adam 1e-4, a 1M buffer, the "
        "target copied every 10,000 steps, epsilon to 0.05 over 10% of the run, 64×64.",
        "- Budgets: rl-baselines3-zoo's for its tuned DQN entries (hyperparams/dqn.yml, n_timesteps).",
        TRIED,
        ACROBOT_SEED_0,
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
