"""The tuned hyperparameters per algorithm and environment that ``--preset`` names (:data:`PRESETS`), each with
where it comes from; :mod:`distrl.training.presets` resolves them.

Each entry sets the algorithm's fields and may set run settings (``total_steps`` and the like) besides.
"""

from __future__ import annotations

from typing import Any

# The network and normalisation of rl-baselines3-zoo's tuned MuJoCo v3 PPO entries (1M steps).
_MUJOCO_PPO = dict(
    normalize_obs=True,
    normalize_reward=True,
    n_envs=1,
    n_steps=512,
    activation="relu",
    net_arch=(256, 256),
    log_std_init=-2.0,
    ortho_init=False,
)

# CleanRL's continuous-action PPO settings (1M steps): on Hopper-v5 and Walker2d-v5 they learn
# to move far better than rl-baselines3-zoo's tuned v3 values (kept as hopper-zoo, walker2d-zoo).
_CLEANRL_PPO = dict(
    total_steps=1_000_000,
    normalize_obs=True,
    normalize_reward=True,
    n_envs=1,
    n_steps=2048,
    batch_size=64,
    n_epochs=10,
    learning_rate=3e-4,
    lr_schedule="linear",
    gamma=0.99,
    gae_lambda=0.95,
    clip_range=0.2,
    clip_range_vf=0.2,
    ent_coef=0.0,
    vf_coef=0.5,
    max_grad_norm=0.5,
    net_arch=(64, 64),
    activation="tanh",
    log_std_init=0.0,
    ortho_init=True,
)

# Tianshou's MuJoCo PPO benchmark settings (thu-ml/tianshou examples/mujoco/mujoco_ppo.py at its PPO
# benchmark, 1M-step figures on v3: HalfCheetah 5,784, Ant 3,258): 64 envs x 32 steps, advantages recomputed
# before every epoch and not normalised, value loss weight 0.25 without clipping, initial log std -0.5.
# distrl scales the rewards by the return's running std where Tianshou scales the value targets.
_TIANSHOU_PPO = dict(
    total_steps=1_000_000,
    normalize_obs=True,
    normalize_reward=True,
    n_envs=64,
    n_steps=32,
    batch_size=64,
    n_epochs=10,
    learning_rate=3e-4,
    lr_schedule="linear",
    gamma=0.99,
    gae_lambda=0.95,
    clip_range=0.2,
    clip_range_vf=None,
    ent_coef=0.0,
    vf_coef=0.25,
    max_grad_norm=0.5,
    normalize_advantage=False,
    recompute_advantage=True,
    net_arch=(64, 64),
    activation="tanh",
    log_std_init=-0.5,
    ortho_init=True,
)

# PPO on Atari (Schulman et al. 2017, arXiv:1707.06347, Table 5; openai/baselines ppo2's atari defaults,
# which CleanRL's ppo_atari.py follows): 8 envs x 128 steps, 4 epochs of 4 minibatches (256), Adam 2.5e-4
# annealed linearly, clip 0.1, entropy 0.01, value 0.5, 10M steps. The paper anneals the clip range with the
# learning rate (0.1 x alpha); baselines and CleanRL keep it constant; distrl follows the paper here.
# The network is theirs: the Nature CNN's 512 features shared by a linear policy head and a linear value
# head (net_arch=()). Applied by --preset auto to every Atari game (distrl.envs.vector.is_atari).
_ATARI_PPO = dict(
    total_steps=10_000_000,
    n_envs=8,
    n_steps=128,
    n_epochs=4,
    batch_size=256,
    learning_rate=2.5e-4,
    lr_schedule="linear",
    clip_range=0.1,
    clip_schedule="linear",
    ent_coef=0.01,
    vf_coef=0.5,
    gamma=0.99,
    gae_lambda=0.95,
    max_grad_norm=0.5,
    net_arch=(),
)

# The V-trace actor-critics on Atari, with the Nature CNN as PPO's preset. APPO: PPO's Atari settings above with
# V-trace targets (lambda 1, as the V-trace paper). IMPALA: RLlib's tuned Atari example
# (rllib/tuned_examples/impala/pong-impala-fast.yaml: fragments of 50 steps, batches of 500, lr 5e-4 decayed
# to 0, RMSProp with epsilon 0.1, entropy 0.01, value coefficient 0.5, gradient norm 40), with 8 envs per actor.
_ATARI_APPO = dict(_ATARI_PPO, gae_lambda=1.0)
_ATARI_IMPALA = dict(
    total_steps=10_000_000,
    n_envs=8,
    n_steps=50,
    batch_size=400,
    learning_rate=5e-4,
    lr_schedule="linear",
    optimizer="rmsprop",
    rmsprop_eps=0.1,
    ent_coef=0.01,
    vf_coef=0.5,
    max_grad_norm=40.0,
    net_arch=(),
)

# MuJoCo SAC settings follow rl-baselines3-zoo: library defaults, 10k random steps first.
_MUJOCO_SAC = dict(total_steps=1_000_000, learning_starts=10_000)

# rl-baselines3-zoo's DQN entries (hyperparams/dqn.yml): its CartPole-v1 one, and its Atari one (the Nature CNN
# with no hidden layer after it, as stable-baselines3's CnnPolicy; 10M steps).
_ZOO_DQN_ATARI = dict(
    total_steps=10_000_000,
    buffer_size=10_000,
    learning_rate=1e-4,
    batch_size=32,
    learning_starts=100_000,
    target_update_interval=1_000,
    train_freq=4,
    gradient_steps=1,
    exploration_fraction=0.1,
    exploration_final_eps=0.01,
    optimize_memory_usage=True,
    net_arch=(),
)

# GRPO on the numeric group tasks: one-token answers from a small MLP, which learns far faster than a
# language model (the GRPOConfig defaults are TRL's, for language models).
_GROUP_TASK_GRPO = dict(
    prompts_per_slice=16,
    slices_per_step=4,
    slices_per_call=4,
    group_size=8,
    learner_steps=600,
    learning_rate=3e-3,
    beta=0.01,
    max_new_tokens=1,
)


SELF_PLAY = "self-play"
"""PPO's preset for a turn-based game under ``--self-play`` that has no preset of its own."""

PRESETS: dict[str, dict[str, dict[str, Any]]] = {
    "grpo": {"toy": dict(_GROUP_TASK_GRPO), "bandit": dict(_GROUP_TASK_GRPO)},
    "dqn": {
        "atari": dict(_ZOO_DQN_ATARI),
        "CartPole-v1": dict(
            total_steps=50_000,
            learning_rate=2.3e-3,
            batch_size=64,
            buffer_size=100_000,
            learning_starts=1_000,
            gamma=0.99,
            target_update_interval=10,
            train_freq=256,
            gradient_steps=128,
            exploration_fraction=0.16,
            exploration_final_eps=0.04,
            net_arch=(256, 256),
        ),
        # the zoo's LunarLander-v2 entry, on v3 (the same task; v2 left Gymnasium)
        "LunarLander-v3": dict(
            total_steps=100_000,
            learning_rate=6.3e-4,
            batch_size=128,
            buffer_size=50_000,
            learning_starts=0,
            gamma=0.99,
            target_update_interval=250,
            train_freq=4,
            gradient_steps=-1,
            exploration_fraction=0.12,
            exploration_final_eps=0.1,
            net_arch=(256, 256),
        ),
    },
    "reinforce": {
        "CartPole-v1": dict(
            total_steps=300_000, n_envs=8, episodes_per_iter=16, learning_rate=5e-3, gamma=0.99, baseline=True
        ),
    },
    "sac": {
        "Pendulum-v1": dict(total_steps=20_000, learning_rate=1e-3),
        # rl-baselines3-zoo's setting without gSDE (distrl has none): exploration may stall.
        "MountainCarContinuous-v0": dict(
            total_steps=50_000,
            learning_rate=3e-4,
            buffer_size=50_000,
            batch_size=512,
            ent_coef="0.1",
            train_freq=32,
            gradient_steps=32,
            gamma=0.9999,
            tau=0.01,
            learning_starts=0,
            net_arch=(64, 64),
        ),
        "Hopper-v5": dict(_MUJOCO_SAC),
        "HalfCheetah-v5": dict(_MUJOCO_SAC),
        "Walker2d-v5": dict(_MUJOCO_SAC),
        "Ant-v5": dict(_MUJOCO_SAC),
    },
    # distrl's own CartPole settings for the V-trace actor-critics, per actor (16 envs x 32 steps). APPO's final
    # 10-episode eval was 500 on seeds 0-2 at 100k steps under --strategy single. IMPALA's, under its default
    # strategy (pipeline, 2 actors), seeds 0-7: 449-497 (mean 471) and 362-475 (mean 426) in two sweeps, and
    # 376-494 (mean 451) under single; the settings before (200k steps, gamma 0.99, entropy 0.01, gradient norm
    # 40) gave 169-500 (mean 382) and 272-491 (mean 422): its one step per batch needs the normalised advantages,
    # the decay and a tight gradient clip, and no entropy bonus late in the run.
    "appo": {
        "atari": dict(_ATARI_APPO),
        "CartPole-v1": dict(
            total_steps=100_000,
            n_envs=16,
            n_steps=32,
            batch_size=256,
            n_epochs=4,
            learning_rate=1e-3,
            gamma=0.98,
            clip_range=0.2,
            ent_coef=0.0,
        ),
    },
    "impala": {
        "atari": dict(_ATARI_IMPALA),
        "CartPole-v1": dict(
            total_steps=300_000,
            n_envs=16,
            n_steps=32,
            batch_size=512,
            learning_rate=7e-4,
            lr_schedule="linear",
            normalize_advantage=True,
            gamma=0.98,
            max_grad_norm=0.5,
            ent_coef=0.0,
        ),
    },
    "ppo": {
        "atari": dict(_ATARI_PPO),
        # What --self-play gets on a turn-based game that has no preset of its own (and --preset self-play by
        # name): the settings of docs/results.md's self-play runs. Tic-tac-toe at 300k steps lost 3.0-4.5% of
        # 400 games to the random player on seeds 0-2; PPO's library defaults (1 env, 2,048-step rollouts) had
        # lost 11 of 100 after a 100k-step run.
        SELF_PLAY: dict(
            total_steps=300_000,
            n_envs=8,
            n_steps=64,
            batch_size=128,
            learning_rate=1e-3,
            lr_schedule="linear",
            ent_coef=0.01,
            random_opponent_share=0.5,
        ),
        # distrl's own fast CartPole settings: 32 native envs, short rollouts. First solved
        # (10-episode eval >= 475) at 20-60k steps on seeds 0-7. The target-KL stop keeps the
        # policy from collapsing after it is solved (without it seeds 1 and 5 ended below 475):
        # final eval 500 on seeds 0-7.
        "CartPole-v1": dict(
            total_steps=100_000,
            n_envs=32,
            n_steps=16,
            batch_size=256,
            n_epochs=10,
            learning_rate=2e-3,
            lr_schedule="linear",
            gamma=0.98,
            gae_lambda=0.8,
            clip_range=0.2,
            clip_schedule="linear",
            ent_coef=0.0,
            target_kl=0.02,
        ),
        # rl-baselines3-zoo's CartPole-v1 settings, for side-by-side comparisons.
        "cartpole-zoo": dict(
            total_steps=100_000,
            n_envs=8,
            n_steps=32,
            batch_size=256,
            n_epochs=20,
            learning_rate=1e-3,
            lr_schedule="linear",
            gamma=0.98,
            gae_lambda=0.8,
            clip_range=0.2,
            clip_schedule="linear",
            ent_coef=0.0,
        ),
        # rl-baselines3-zoo's setting (hopper-zoo) stands still on v5 for the healthy reward, at about
        # 1,000, in distrl and in stable-baselines3 alike; CleanRL's hops: eval 3,459-3,717 at 1M, seeds 0-2.
        "Hopper-v5": dict(_CLEANRL_PPO),
        "hopper-zoo": dict(
            _MUJOCO_PPO,
            total_steps=1_000_000,
            batch_size=32,
            gamma=0.999,
            learning_rate=9.80828e-05,
            ent_coef=0.00229519,
            clip_range=0.2,
            n_epochs=5,
            gae_lambda=0.99,
            max_grad_norm=0.7,
            vf_coef=0.835671,
        ),
        # Tianshou's settings on 256x256 networks (distrl's choice): far above both their 64x64 networks
        # (halfcheetah-tianshou) and rl-baselines3-zoo's setting (halfcheetah-zoo) on v5; see docs/results.md.
        "HalfCheetah-v5": dict(_TIANSHOU_PPO, net_arch=(256, 256)),
        "halfcheetah-zoo": dict(
            _MUJOCO_PPO,
            total_steps=1_000_000,
            batch_size=64,
            gamma=0.98,
            learning_rate=2.0633e-05,
            ent_coef=0.000401762,
            clip_range=0.1,
            n_epochs=20,
            gae_lambda=0.92,
            max_grad_norm=0.8,
            vf_coef=0.58096,
        ),
        # Tianshou's settings on 256x256 networks, as HalfCheetah-v5's: ahead of CleanRL's (walker2d-cleanrl),
        # Tianshou's own 64x64 (walker2d-tianshou) and rl-baselines3-zoo's (walker2d-zoo) on v5.
        "Walker2d-v5": dict(_TIANSHOU_PPO, net_arch=(256, 256)),
        "walker2d-cleanrl": dict(_CLEANRL_PPO),
        "walker2d-tianshou": dict(_TIANSHOU_PPO),
        "walker2d-zoo": dict(
            _MUJOCO_PPO,
            total_steps=1_000_000,
            batch_size=32,
            gamma=0.99,
            learning_rate=5.05041e-05,
            ent_coef=0.000585045,
            clip_range=0.1,
            n_epochs=20,
            gae_lambda=0.95,
            max_grad_norm=1.0,
            vf_coef=0.871923,
        ),
        # Tianshou's settings with a small initial action noise (log std -2, distrl's choice): every unit of
        # noise variance costs Ant-v5 0.5 x 8 per step in control cost, which the training returns pay.
        "Ant-v5": dict(_TIANSHOU_PPO, log_std_init=-2.0),
        # distrl's earlier values on the zoo's tuned MuJoCo network: evaluation 1,181 +- 246 at 1M steps, seeds 0-2.
        "ant-relu256": dict(
            _MUJOCO_PPO,
            total_steps=1_000_000,
            batch_size=32,
            gamma=0.99,
            learning_rate=5e-5,
            ent_coef=0.0,
            clip_range=0.2,
            n_epochs=10,
            gae_lambda=0.95,
            max_grad_norm=0.5,
            vf_coef=0.5,
        ),
        # rl-baselines3-zoo's Ant-v3 entry, which its 1M-step benchmark figure (1,327) comes from: the
        # library's PPO defaults (which are distrl's) with observation and reward normalisation.
        "ant-zoo": dict(total_steps=1_000_000, normalize_obs=True, normalize_reward=True),
        # CleanRL's continuous-action settings, as Hopper-v5's and walker2d-cleanrl's.
        "ant-cleanrl": dict(_CLEANRL_PPO),
        "ant-tianshou": dict(_TIANSHOU_PPO),
        "halfcheetah-tianshou": dict(_TIANSHOU_PPO),
    },
}
