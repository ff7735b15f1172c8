"""distrl's recurrent PPO against sb3-contrib's RecurrentPPO on CartPole without velocities, side by side.

    python benchmarks/recurrent_vs_sb3.py            # writes its section of docs/benchmarks.md
    python benchmarks/recurrent_vs_sb3.py --quick

The task is RL Zoo's CartPoleNoVel-v1: CartPole-v1 with the cart and pole velocities zeroed (observation
indices 1 and 3), so the policy must infer them from what it saw before. The settings are the zoo's tuned
RecurrentPPO ones (hyperparams/ppo_lstm.yml): 8 envs, n_steps 32, batch 256 (the whole rollout), 20 epochs,
gamma 0.98, GAE lambda 0.8, ent 0, lr and clip linear from 1e-3 and 0.2, LSTM of 64 units, one 64-unit ReLU
layer per head, no orthogonal initialisation, observations and rewards normalised.

RecurrentPPO runs twice: as the zoo runs it (a second LSTM for the critic, its default) and with one LSTM
shared by both heads (``shared_lstm=True``), which is distrl's network and the same arithmetic; with
``shared_lstm`` RecurrentPPO keeps the value loss out of the LSTM, distrl trains it with both losses.
Each measurement runs in its own subprocess, libraries alternate, medians are reported, one torch thread each.
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np

from harness import alternate, child_main, comparison_table, median, sb3_seconds_to_target, write_section

ZOO = dict(n_envs=8, n_steps=32, batch_size=256, n_epochs=20, gamma=0.98, gae_lambda=0.8, ent_coef=0.0)
LR, CLIP, HIDDEN = 1e-3, 0.2, 64
EVAL_EVERY, TARGET, BUDGET = 10_000, 475.0, 200_000
MASK = np.array([1.0, 0.0, 1.0, 0.0], dtype=np.float32)


def hide_velocity(env):  # noqa: ANN001, ANN201 - RL Zoo's MaskVelocityWrapper for CartPole, as a function
    import gymnasium as gym

    return gym.wrappers.TransformObservation(env, lambda obs: (obs * MASK).astype(np.float32), env.observation_space)


def child(lib: str, task: str, seed: int, steps: int) -> dict:
    import torch

    torch.set_num_threads(1)
    if task == "sps":
        return _sps(lib, seed, steps)
    return _solve(lib, seed)


def _distrl(seed: int, total: int, **run):  # noqa: ANN202
    from distrl import PPO

    return PPO(
        "CartPole-v1",
        wrappers=[hide_velocity],
        core="lstm",
        core_size=HIDDEN,
        **ZOO,
        learning_rate=LR,
        lr_schedule="linear",
        clip_range=CLIP,
        clip_schedule="linear",
        net_arch=(HIDDEN,),
        activation="relu",
        ortho_init=False,
        normalize_obs=True,
        normalize_reward=True,
        seed=seed,
        total_steps=total,
        **run,
    )


def _sb3(lib: str, seed: int):  # noqa: ANN202
    from sb3_contrib import RecurrentPPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize
    from torch import nn

    env = VecNormalize(
        make_vec_env("CartPole-v1", n_envs=ZOO["n_envs"], seed=seed, wrapper_class=hide_velocity), gamma=ZOO["gamma"]
    )
    shared = lib == "sb3-shared"
    policy_kwargs = dict(
        ortho_init=False,
        activation_fn=nn.ReLU,
        lstm_hidden_size=HIDDEN,
        shared_lstm=shared,
        enable_critic_lstm=not shared,
        net_arch=dict(pi=[HIDDEN], vf=[HIDDEN]),
    )
    hp = {k: v for k, v in ZOO.items() if k != "n_envs"}
    return RecurrentPPO(
        "MlpLstmPolicy",
        env,
        learning_rate=lambda p: LR * p,
        clip_range=lambda p: CLIP * p,
        seed=seed,
        device="cpu",
        verbose=0,
        policy_kwargs=policy_kwargs,
        **hp,
    )


def _sps(lib: str, seed: int, steps: int) -> dict:
    warmup = ZOO["n_envs"] * ZOO["n_steps"]
    if lib == "distrl":
        model = _distrl(seed, steps + warmup)
        trainer = model._trainer
        trainer.train(stop_at=warmup)
        start_steps, start_s = trainer.steps, trainer.train_s
        trainer.train()
        return {"sps": (trainer.steps - start_steps) / (trainer.train_s - start_s)}
    model = _sb3(lib, seed)
    model.learn(warmup)
    start = time.perf_counter()
    model.learn(steps, reset_num_timesteps=False)
    return {"sps": steps / (time.perf_counter() - start)}


def _solve(lib: str, seed: int) -> dict:
    """Training seconds (evaluation excluded) until a 10-episode deterministic evaluation reaches 475."""
    if lib == "distrl":
        model = _distrl(seed, BUDGET, eval_every=EVAL_EVERY, eval_episodes=10, target_return=TARGET)
        trainer = model._trainer
        trainer.train()
        solved = trainer.last_eval is not None and trainer.last_eval[0] >= TARGET
        return {"train_s": trainer.train_s if solved else None, "steps": trainer.steps}

    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.vec_env import VecNormalize

    model = _sb3(lib, seed)
    eval_env = VecNormalize(
        make_vec_env("CartPole-v1", n_envs=1, seed=seed + 1_000_000, wrapper_class=hide_velocity),
        training=False,
        norm_reward=False,
    )

    def share_statistics() -> None:  # the training statistics, as the zoo's evaluation uses them
        eval_env.obs_rms = model.get_env().obs_rms

    return sb3_seconds_to_target(model, eval_env, BUDGET, EVAL_EVERY, TARGET, share_statistics)


def main() -> None:
    if child_main(lambda lib, task, seed, steps: child(lib, task, seed, int(steps))):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats = 2 if args.quick else 3
    steps = 5_120 if args.quick else 20_480
    print("SPS ...", flush=True)
    sps = alternate(__file__, "sps", repeats, steps, "sps", ("distrl", "sb3-shared", "sb3"))
    print("time to solve ...", flush=True)
    solve = alternate(__file__, "solve", repeats, 0, "train_s", ("distrl", "sb3"))
    rows = []
    d = median(sps["values"]["distrl"])
    for ref, label in (
        ("sb3-shared", "SPS, one LSTM for both heads (the same network)"),
        ("sb3", "SPS, RecurrentPPO as the zoo runs it (a second LSTM for the critic)"),
    ):
        s = median(sps["values"][ref])
        rows.append(
            (label, d, s, d / s if d and s else None, median(sps["rss"]["distrl"]), median(sps["rss"][ref]), sps)
        )
    d, s = median(solve["values"]["distrl"]), median(solve["values"]["sb3"])
    rows.append(
        (
            "training s to eval >= 475 (zoo's RecurrentPPO)",
            d,
            s,
            s / d if d and s else None,
            median(solve["rss"]["distrl"]),
            median(solve["rss"]["sb3"]),
            solve,
        )
    )
    import sb3_contrib
    import torch

    import distrl

    fmt = lambda v: "n/a" if v is None else (f"{v:,.0f}" if v >= 100 else f"{v:.1f}")  # noqa: E731
    lines = [
        f"`python benchmarks/recurrent_vs_sb3.py{' --quick' if args.quick else ''}` — {time.strftime('%Y-%m-%d')}, "
        f"{platform.machine()}, {repeats} runs each (seeds 0..{repeats - 1}), alternating, medians; one torch "
        f"thread each; distrl {distrl.__version__}, sb3-contrib {sb3_contrib.__version__}, torch {torch.__version__}.",
        "",
        *comparison_table(rows, fmt),
        "",
        "- CartPole-v1 with the velocities zeroed (RL Zoo's CartPoleNoVel-v1) and the zoo's tuned RecurrentPPO "
        "settings: 8 envs, n_steps 32, batch 256, 20 epochs, gamma 0.98, GAE lambda 0.8, ent 0, lr and clip "
        "linear from 1e-3 and 0.2, LSTM 64, one 64-unit ReLU layer per head, no orthogonal init, observations "
        "and rewards normalised (VecNormalize for RecurrentPPO).",
        f"- SPS over {steps:,} steps after one warm-up rollout. distrl runs one LSTM for both heads; the first "
        "row gives RecurrentPPO the same network (`shared_lstm=True`, which keeps the value loss out of the "
        "LSTM), the second its default with a critic LSTM of its own, as the zoo trains it.",
        f"- Time to solve: a 10-episode deterministic evaluation every {EVAL_EVERY:,} steps, training seconds "
        f"until it reaches {TARGET:.0f} (evaluation excluded), within {BUDGET:,} steps; n/a = not reached.",
        "- Why distrl is faster: a sequence runs through torch's LSTM in one call per stretch between episode "
        "starts (RecurrentPPO steps through a minibatch one time step at a time when any episode starts in it), "
        "minibatches are whole environment sequences without padding, and the acting pass records the values "
        "and log-probs that training needs.",
        "- Raw values: SPS "
        + "; ".join(f"{lib} {[round(v) for v in vs]}" for lib, vs in sps["values"].items())
        + "; seconds to solve "
        + "; ".join(f"{lib} {[None if v is None else round(v, 1) for v in vs]}" for lib, vs in solve["values"].items())
        + ".",
    ]
    write_section("Recurrent PPO: distrl vs sb3-contrib's RecurrentPPO", "\n".join(lines))


if __name__ == "__main__":
    main()
