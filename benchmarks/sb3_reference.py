"""stable-baselines3 PPO or DQN with a distrl preset: a reference run on the same env version.

    python benchmarks/sb3_reference.py Hopper-v5 --seed 0 --steps 1000000 [--preset hopper-zoo]
    python benchmarks/sb3_reference.py LunarLander-v3 --algo dqn --seed 0 --steps 100000
    python benchmarks/results.py      # lists the kept reference runs in docs/results.md

The published figures distrl's presets come from were measured on v3/v4 MuJoCo envs. This
trains stable-baselines3 with exactly the hyperparameters of ``distrl train ALGO ENV --preset
PRESET`` (``auto`` by default; translated field by field, VecNormalize for PPO's normalisers)
on the env distrl uses, and keeps its episode log and a summary under
docs/results/sb3/sb3-ALGO-ENV-PRESET-sSEED/.
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

ROOT = Path(__file__).parents[1]
OUT = ROOT / "docs" / "results" / "sb3"


def sb3_ppo(env_id: str, seed: int, preset: str = "auto"):
    """An SB3 PPO model and its VecNormalize'd env, configured like distrl's ``preset`` for ``env_id``."""
    import torch
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    from distrl.training.presets import algo_configs

    _, cfg, _ = algo_configs("ppo", env_id, preset)
    env = make_vec_env(env_id, n_envs=cfg.n_envs, seed=seed)
    if cfg.normalize_obs or cfg.normalize_reward:
        env = VecNormalize(
            env, norm_obs=cfg.normalize_obs, norm_reward=cfg.normalize_reward, clip_obs=cfg.clip_obs, gamma=cfg.gamma
        )
    lr = cfg.learning_rate if cfg.lr_schedule != "linear" else (lambda remaining: cfg.learning_rate * remaining)
    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[cfg.activation]
    model = PPO(
        "MlpPolicy",
        env,
        n_steps=cfg.n_steps,
        batch_size=cfg.batch_size,
        n_epochs=cfg.n_epochs,
        gamma=cfg.gamma,
        gae_lambda=cfg.gae_lambda,
        learning_rate=lr,
        clip_range=cfg.clip_range,
        ent_coef=cfg.ent_coef,
        vf_coef=cfg.vf_coef,
        max_grad_norm=cfg.max_grad_norm,
        target_kl=cfg.target_kl,
        normalize_advantage=cfg.normalize_advantage,
        seed=seed,
        device="cpu",
        policy_kwargs=dict(
            log_std_init=cfg.log_std_init,
            ortho_init=cfg.ortho_init,
            activation_fn=activation,
            net_arch=dict(pi=list(cfg.net_arch), vf=list(cfg.net_arch)),
        ),
    )
    return model


def sb3_dqn(env_id: str, seed: int, preset: str = "auto"):
    """An SB3 DQN model configured like distrl's ``preset`` for ``env_id`` (vector observations: MlpPolicy)."""
    import torch
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    from distrl.training.presets import algo_configs

    _, cfg, _ = algo_configs("dqn", env_id, preset)
    if cfg.double_q or cfg.dueling or cfg.prioritized_replay or cfg.n_steps > 1:
        raise SystemExit(
            "sb3_reference.py: stable-baselines3's DQN has no double, dueling, prioritised or n-step option"
        )
    activation = {"tanh": torch.nn.Tanh, "relu": torch.nn.ReLU}[cfg.activation]
    return DQN(
        "MlpPolicy",
        make_vec_env(env_id, n_envs=cfg.n_envs, seed=seed),
        learning_rate=cfg.learning_rate,
        buffer_size=cfg.buffer_size,
        learning_starts=cfg.learning_starts,
        batch_size=cfg.batch_size,
        tau=cfg.tau,
        gamma=cfg.gamma,
        train_freq=cfg.train_freq,
        gradient_steps=cfg.gradient_steps,
        target_update_interval=cfg.target_update_interval,
        exploration_fraction=cfg.exploration_fraction,
        exploration_initial_eps=cfg.exploration_initial_eps,
        exploration_final_eps=cfg.exploration_final_eps,
        max_grad_norm=cfg.max_grad_norm,
        seed=seed,
        device="cpu",
        policy_kwargs=dict(net_arch=list(cfg.net_arch), activation_fn=activation),
    )


def main() -> None:
    import torch
    from stable_baselines3.common.callbacks import BaseCallback

    parser = argparse.ArgumentParser()
    parser.add_argument("env")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--steps", type=int, default=1_000_000)
    parser.add_argument("--preset", default="auto")
    parser.add_argument("--algo", choices=("ppo", "dqn"), default="ppo")
    args = parser.parse_args()
    from distrl.training.presets import resolve_preset

    preset, _ = resolve_preset(args.algo, args.env, args.preset)
    torch.set_num_threads(1)
    out = OUT / f"sb3-{args.algo}-{args.env}-{preset}-s{args.seed}"
    out.mkdir(parents=True, exist_ok=True)
    model = (sb3_ppo if args.algo == "ppo" else sb3_dqn)(args.env, args.seed, preset)
    start = time.perf_counter()

    class EpisodeLog(BaseCallback):
        def _on_training_start(self) -> None:
            self.file = open(out / "monitor.csv", "w", newline="")
            self.file.write("#" + json.dumps({"t_start": time.time(), "env_id": args.env}) + "\n")  # Monitor format
            self.writer = csv.writer(self.file)
            self.writer.writerow(["r", "l", "t"])

        def _on_step(self) -> bool:
            for info in self.locals["infos"]:
                if "episode" in info:
                    self.writer.writerow(
                        [info["episode"]["r"], info["episode"]["l"], round(time.perf_counter() - start, 1)]
                    )
            return True

        def _on_training_end(self) -> None:
            self.file.close()

    model.learn(args.steps, callback=EpisodeLog())
    wall = time.perf_counter() - start
    import stable_baselines3

    (out / "summary.json").write_text(
        json.dumps(
            {
                "library": f"stable-baselines3 {stable_baselines3.__version__}",
                "algo": args.algo,
                "env": args.env,
                "seed": args.seed,
                "total_steps": args.steps,
                "wall_s": wall,
                "sps": args.steps / wall,
                "preset": preset,
                "hyperparameters": f"distrl's {preset} preset",
            },
            indent=1,
        )
    )
    print(f"kept {out}")


if __name__ == "__main__":
    main()
