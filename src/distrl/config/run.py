"""Run configuration: what to train, on what, and where its outputs go (how the work is spread is
:mod:`distrl.config.strategy`'s)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any

import tyro

from distrl.config.base import (
    ActionMask,
    AgentPolicies,
    Critic,
    Device,
    OpponentSampling,
    Precision,
    Tracker,
    VecMode,
    require,
    require_fraction,
    require_positive,
)
from distrl.config.offline import OFFLINE_CONFIGS

EVAL_STEPS_PER_STEP = 2
"""The default cap on an evaluation's steps, per training step: an evaluation step does no update and costs
less than a training step (CarRacing, 2,048 steps: 45 training steps/s, 150 evaluation steps/s), so a short
run's evaluation stays shorter than its training."""
EVAL_MAX_STEPS_FLOOR = 2_000
"""The least default cap: ten whole episodes of Pendulum (200 steps each), whatever the run's length."""
OFFLINE_EVAL_STEPS_PER_EPISODE = 1_000
"""An offline run's default cap on an evaluation's steps, per episode (its training steps are gradient steps, which
say nothing of how long the env's episodes are; 1,000 is MuJoCo's time limit)."""


def parse_env_kwargs(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``("continuous=true", "max_episode_steps=500")`` as ``{"continuous": True, "max_episode_steps": 500}``.

    Values are typed: true/false as bools, none as None, ints, floats; anything else stays a string.
    """
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        require(
            bool(sep) and key.isidentifier(),
            "env_kwargs",
            item,
            "key=value items with a Python name as key",
            "e.g. --env-kwargs continuous=true max_episode_steps=500",
        )
        require(key not in kwargs, "env_kwargs", item, f"one value per key ({key!r} is given twice)")
        kwargs[key] = _typed(text.strip())
    return kwargs


def _typed(text: str) -> Any:
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered == "none":
        return None
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return text


def _require_entry_point(field: str, value: str, allowed: str) -> None:
    module, sep, attr = value.partition(":")
    require(bool(sep) and bool(module.strip()) and bool(attr.strip()), field, value, allowed)


@dataclass(frozen=True)
class RunConfig:
    """What to train, for how long, where its outputs go and how it is spread."""

    algo: Annotated[str, tyro.conf.Suppress] = "ppo"
    """Algorithm name (the command line takes it as ALGO)."""
    env: Annotated[str, tyro.conf.Suppress] = "CartPole-v1"
    """Gymnasium id, short name (cartpole, hopper, ...), 'package.module:ClassName' (a gymnasium.Env
    subclass) or 'package.module:function' (a function returning a gymnasium.Env)."""
    env_kwargs: tuple[str, ...] = ()
    """key=value arguments for the env's constructor (or gymnasium.make, e.g. max_episode_steps=500);
    true/false, none, ints and floats are typed, anything else is a string."""
    wrappers: tuple[str, ...] = ()
    """'package.module:function' applied in order to each environment, fn(env) -> env; several are
    given as --wrappers A B, or as --wrapper A --wrapper B."""
    atari_wrappers: bool = True
    """ALE ids: apply the standard Atari preprocessing (84x84 grey, frame skip 4, 4 stacked frames,
    no-op starts, fire on reset; episodic life and reward clipping while training)."""
    policy: str = ""
    """'package.module:function' building the policy/value network (a torch.nn.Module), called with
    the observation space, the action space and the algorithm config; empty: distrl's built-in networks."""
    total_steps: int = 100_000
    """Environment steps to train for, counted over all environments and workers."""
    seed: int = 0
    """Seed for networks, action sampling and environments."""
    run_dir: str = ""
    """Directory for logs and checkpoints; empty means runs/<algo>-<env>-s<seed>-<time>."""
    preset: str = "auto"
    """Hyperparameter preset: 'auto' (the env's tuned preset if any), 'none', or a preset name."""
    device: Device = "auto"
    """Where the update runs: 'auto' picks cuda when available."""
    vec: VecMode = "auto"
    """Vector env: native (gymnasium's vector entry point), sync, async, or envpool (its C++ pool, for
    Atari and the tasks it lists; pip install 'distrl[envpool]'); auto prefers native."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: only the final model). A time also works, for clusters that
    preempt on the clock: --checkpoint-every 10min (or 90s, 2h) sets --checkpoint-every-s."""
    checkpoint_every_s: float = 0.0
    """Also save a checkpoint once this many seconds have passed since the last one (0: never by time)."""
    keep_checkpoints: int = 0
    """Keep only the newest N periodic checkpoints (the final model is always kept); 0 keeps all."""
    resume: str = ""
    """Continue the run in this directory from its latest checkpoint, or from this checkpoint: with
    RUN/checkpoints/step-N, run RUN goes on from step N. auto: the newest checkpoint in --run-dir if
    it holds one, else a fresh start there (one command for the first start and every restart)."""
    eval_every: int = 0
    """Run a deterministic evaluation every this many steps (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation; they run side by side in as many environments."""
    eval_max_steps: int | None = None
    """Environment steps one evaluation may take, over all its environments; it stops once it has taken them
    and reports the episodes it finished (a mean over those alone never reaches --target-return). 0: no cap;
    None: twice total_steps, at least 2,000, so that a short run's evaluation takes less time than its training (offline
    algorithms: at least 1,000 steps per episode)."""
    target_return: float | None = None
    """Stop training once an evaluation reaches this mean return (grpo: once the mean reward of its last
    ten learner steps does)."""
    iterations: int = 0
    """Stop after this many updates instead of at total_steps (0: use total_steps)."""
    plot: bool = False
    """Write the run's reward curve (reward_curve.png) at the end."""
    precision: Precision = "fp32"
    """Arithmetic of the module path's networks (images, Dict observations, --policy) and of GRPO's language
    models: bf16 runs their forward and backward (and generation) under bfloat16 autocast, with float32
    weights, Adam and losses; on a CPU with AVX-512 BF16 it trained the Nature CNN 1.9x faster, while a CPU
    without native bfloat16 (AVX2 only) emulates it about ten times slower, and the run says so. For sac's
    MLPs (flat-vector observations) bf16 multiplies the matrices in bfloat16, the offline algorithms' and td3's
    run under autocast (CQL 2.5x faster with AMX). ppo's and reinforce's MLPs always use float32."""
    action_mask: ActionMask = "auto"
    """Discrete and MultiDiscrete actions: mask illegal choices, read from the observation's action_mask
    key, info["action_mask"] or the env's action_masks() method. auto finds which, and config.json records
    what it found (off: none); --no-action-mask (off) trains as if every action were legal."""
    mask_input: bool = False
    """A mask read from info or action_masks() is also an input of distrl's networks, as in runs saved before it
    stopped being one (a checkpoint without this field loads with it on); by default it only masks the logits."""
    agent_policies: AgentPolicies = "shared"
    """Multi-agent (PettingZoo) envs: one network for every agent (shared; each sees its one-hot agent index)
    or one per agent (per-agent)."""
    agent_groups: tuple[str, ...] = ()
    """Multi-agent envs: one network per named group of agents, as NAME=AGENT,AGENT (e.g. --agent-groups
    attackers=a_0,a_1 defenders=b_0); every agent in exactly one group."""
    critic: Critic = "local"
    """Multi-agent envs: centralised gives each critic the global state (env.state(), else every agent's
    observation side by side) and the agent's index, while actors see their own observation (Yu et al. 2022)."""
    self_play: bool = False
    """Two-player turn-based games (a PettingZoo AEC module such as pettingzoo.classic.tictactoe_v3): play the
    other seat with past copies of the policy being trained instead of random moves (the seats alternate)."""
    opponent_pool: int = 8
    """Self-play: past copies kept as opponents (the oldest leave)."""
    snapshot_every: int = 5
    """Self-play: a new copy joins the pool every this many updates."""
    opponent_sampling: OpponentSampling = "pfsp"
    """Self-play: the opponent of each game, uniformly from the pool or prioritised (pfsp) toward those the
    policy beats least, weight (1 - win rate)^2."""
    random_opponent_share: float = 0.0
    """Self-play: the share of games played against the uniformly random player outright, whatever the
    sampling; the rest are drawn from the whole pool, the random player included."""
    threads: int = 1
    """Intra-op torch threads per process. 1 suits small networks and several workers per machine;
    wide networks (256x256 MLPs, CNNs) gain from more when the process has the cores to itself."""
    flush_denormal: bool = True
    """On the CPU, treat subnormal floats (below about 1.2e-38) as zero. Adam's second-moment
    estimates decay into that range, where x86 arithmetic is tens of times slower (an Adam step
    measured 1.5 ms instead of 0.14 ms)."""
    keep_freed_memory: bool = True
    """On Linux (glibc), fix the C allocator's mmap and trim thresholds at 32 and 64 MiB, so that memory a
    step frees stays in the process for the next step instead of coming back as fresh pages from the
    kernel (up to 850 page faults a gradient step on 256-wide layers, and 15% of its speed). The cost: freed
    memory up to 64 MiB at the heap's top stays with the process. Set for the whole process once a run
    starts."""
    track: tuple[Tracker, ...] = ()
    """Experiment trackers that get what TensorBoard gets, the config and the summary: wandb, mlflow,
    or both as --track wandb --track mlflow. Where they write is their own setting (WANDB_MODE,
    MLFLOW_TRACKING_URI, ...); pip install 'distrl[wandb]' or 'distrl[mlflow]'."""
    track_project: str = "distrl"
    """The W&B project, or the MLflow experiment, of tracked runs."""
    quiet: bool = False
    """No progress display."""
    debug: bool = False
    """Show full tracebacks for errors."""

    def __post_init__(self) -> None:
        require_positive(self, "total_steps", "eval_episodes", "threads")
        require(len(set(self.track)) == len(self.track), "track", self.track, "each tracker once")
        require(self.iterations >= 0, "iterations", self.iterations, ">= 0")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, ">= 0")
        require(self.checkpoint_every_s >= 0, "checkpoint_every_s", self.checkpoint_every_s, ">= 0 seconds")
        require(self.keep_checkpoints >= 0, "keep_checkpoints", self.keep_checkpoints, ">= 0 (0: keep all)")
        require(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0")
        require(self.opponent_pool >= 0, "opponent_pool", self.opponent_pool, ">= 0 (0: the random player alone)")
        require(self.snapshot_every > 0, "snapshot_every", self.snapshot_every, "> 0 updates")
        require_fraction(self, "random_opponent_share")
        if self.eval_max_steps is not None:
            require(
                self.eval_max_steps >= 0,
                "eval_max_steps",
                self.eval_max_steps,
                ">= 0 (0: no cap), or None for the default",
            )
        parse_env_kwargs(self.env_kwargs)
        for wrapper in self.wrappers:
            _require_entry_point("wrappers", wrapper, "'package.module:function'")
        if self.policy:
            _require_entry_point("policy", self.policy, "'package.module:function' or empty")

    @property
    def eval_step_cap(self) -> int:
        """The cap on each evaluation's environment steps (0: none); see ``eval_max_steps``."""
        if self.eval_max_steps is not None:
            return self.eval_max_steps
        if self.algo in OFFLINE_CONFIGS:  # its steps are gradient steps: let each episode run 1,000 steps
            return max(EVAL_STEPS_PER_STEP * self.total_steps, OFFLINE_EVAL_STEPS_PER_EPISODE * self.eval_episodes)
        return max(EVAL_STEPS_PER_STEP * self.total_steps, EVAL_MAX_STEPS_FLOOR)

    @property
    def network_mask(self) -> str:
        """``action_mask`` as distrl's networks take it: with ``mask_input``, a mask moved into the observation from
        info or action_masks() is read as one the env gives there, an input as well as a mask."""
        return "observation" if self.mask_input and self.action_mask in ("info", "method") else self.action_mask

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)
