"""Run and algorithm configuration: frozen dataclasses validated at construction.

Every field has a docstring; the command line turns them into ``--help``. A value out
of range raises :class:`ConfigError` whose message names the field, the value and what
is allowed, so the command line can print it as one line and exit with status 2.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import tyro

Schedule = Literal["constant", "linear"]
Strategy = Literal["single", "ddp", "actor-learner", "decoupled", "pipeline"]
ReplaySampling = Literal["uniform", "version"]
Engine = Literal["ray", "monarch"]
OnWorkerError = Literal["restart", "abort"]
Scaling = Literal["per-worker", "equivalent"]
Launcher = Literal["auto", "local", "ray", "spark"]
Device = Literal["auto", "cpu", "cuda"]
VecMode = Literal["auto", "native", "sync", "async"]
Activation = Literal["tanh", "relu"]
Encoder = Literal["auto", "mlp", "nature", "small", "impala"]
Precision = Literal["fp32", "bf16"]


class ConfigError(Exception):
    """A mistake in what the user asked for; printed as one line, exit status 2.

    Deliberately not a ValueError: the command-line parser would catch it and print a
    multi-line box instead of distrl's one-line message.
    """


def require(ok: bool, field: str, value: Any, allowed: str, fix: str = "") -> None:
    """Raise a ConfigError naming ``field``, ``value`` and the allowed range unless ``ok``."""
    if not ok:
        message = f"{field}={value!r} is not allowed: must be {allowed}"
        raise ConfigError(f"{message}; {fix}" if fix else message)


def _positive(cfg: Any, *names: str) -> None:
    for name in names:
        value = getattr(cfg, name)
        require(value > 0, name, value, "> 0")


def _fraction(cfg: Any, name: str, *, inclusive_zero: bool = True) -> None:
    value = getattr(cfg, name)
    low_ok = value >= 0 if inclusive_zero else value > 0
    require(low_ok and value <= 1, name, value, "in [0, 1]" if inclusive_zero else "in (0, 1]")


@dataclass(frozen=True)
class PPOConfig:
    """Proximal Policy Optimization (Schulman et al. 2017, arXiv:1707.06347).

    Names and defaults follow stable-baselines3, so its users can carry settings over.
    """

    n_envs: int = 1
    """Environments stepped together by each worker."""
    n_steps: int = 2048
    """Steps per environment per rollout; a rollout holds n_envs * n_steps transitions."""
    batch_size: int = 64
    """Minibatch size; must divide n_envs * n_steps."""
    n_epochs: int = 10
    """Passes over each rollout."""
    learning_rate: float = 3e-4
    """Adam step size (start value when lr_schedule is linear)."""
    lr_schedule: Schedule = "constant"
    """'linear' anneals the learning rate to 0 over total_steps."""
    gamma: float = 0.99
    """Discount factor."""
    gae_lambda: float = 0.95
    """GAE(lambda) bias/variance trade-off (Schulman et al. 2015, arXiv:1506.02438)."""
    clip_range: float = 0.2
    """Policy ratio clip (start value when clip_schedule is linear)."""
    clip_schedule: Schedule = "constant"
    """'linear' anneals clip_range to 0 over total_steps."""
    clip_range_vf: float | None = None
    """Clip the value update to this distance from the rollout's values; None disables."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    vf_coef: float = 0.5
    """Value loss coefficient (the value loss is a mean squared error)."""
    max_grad_norm: float = 0.5
    """Clip the global gradient norm (after averaging across workers) to this value."""
    target_kl: float | None = None
    """Stop the epochs of an update once approx-KL exceeds 1.5 * target_kl; None disables."""
    normalize_advantage: bool = True
    """Normalise advantages with the mean and std of the whole rollout (all workers)."""
    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layer sizes of the policy and of the critic (separate networks; after the encoder's
    features for images and Dict observations, where () gives linear heads)."""
    activation: Activation = "tanh"
    """Hidden activation."""
    encoder: Encoder = "auto"
    """Observation encoder: auto picks the Nature CNN for images of at least 36x36, a small CNN for
    smaller ones, one encoder per key for Dict observations, and the closed-form MLPs for flat vectors;
    nature, small or impala (the IMPALA ResNet) ask for that CNN; mlp flattens images too."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian policies."""
    ortho_init: bool = True
    """Orthogonal initialisation (gain sqrt(2) hidden, 0.01 policy output, 1 value output)."""
    normalize_obs: bool = False
    """Normalise observations with running mean/std (saved with the model)."""
    normalize_reward: bool = False
    """Scale rewards by the running std of the discounted return (saved with the model)."""
    clip_obs: float = 10.0
    """Clip normalised observations to [-clip_obs, clip_obs]."""

    def __post_init__(self) -> None:
        _positive(self, "n_envs", "n_steps", "batch_size", "n_epochs", "learning_rate")
        _positive(self, "clip_range", "max_grad_norm", "clip_obs")
        _fraction(self, "gamma")
        _fraction(self, "gae_lambda")
        require(self.ent_coef >= 0, "ent_coef", self.ent_coef, ">= 0")
        require(self.vf_coef >= 0, "vf_coef", self.vf_coef, ">= 0")
        if self.clip_range_vf is not None:
            require(self.clip_range_vf > 0, "clip_range_vf", self.clip_range_vf, "> 0 or None")
        if self.target_kl is not None:
            require(self.target_kl > 0, "target_kl", self.target_kl, "> 0 or None")
        require(all(h > 0 for h in self.net_arch),
                "net_arch", self.net_arch, "positive layer sizes (none: linear heads)")
        rollout = self.n_envs * self.n_steps
        require(rollout % self.batch_size == 0, "batch_size", self.batch_size,
                f"a divisor of n_envs * n_steps = {rollout}",
                f"e.g. --batch-size {_nearest_divisor(rollout, self.batch_size)}")

    @property
    def rollout_size(self) -> int:
        """Transitions collected per rollout by one worker."""
        return self.n_envs * self.n_steps


@dataclass(frozen=True)
class SACConfig:
    """Soft Actor-Critic (Haarnoja et al. 2018, arXiv:1801.01290 and arXiv:1812.05905).

    Names and defaults follow stable-baselines3.
    """

    n_envs: int = 1
    """Environments stepped together by each worker."""
    learning_rate: float = 3e-4
    """Adam step size for actor, critics and entropy coefficient."""
    buffer_size: int = 1_000_000
    """Replay capacity in transitions (over all envs of a worker)."""
    learning_starts: int = 100
    """Steps of uniformly random actions before learning starts."""
    batch_size: int = 256
    """Transitions per gradient step."""
    tau: float = 0.005
    """Polyak coefficient of the target critics."""
    gamma: float = 0.99
    """Discount factor."""
    train_freq: int = 1
    """Vector steps between training phases."""
    gradient_steps: int = 1
    """Gradient steps per training phase."""
    ent_coef: str = "auto"
    """'auto' (learned, starting at 1.0), 'auto_0.1' (learned, starting at 0.1) or a fixed value like '0.2'."""
    target_entropy: float | None = None
    """Entropy target of the automatic tuning; None means -action_dim."""
    target_update_interval: int = 1
    """Gradient steps between target-critic updates."""
    net_arch: tuple[int, ...] = (256, 256)
    """Hidden layers of the actor and of each critic."""
    activation: Activation = "relu"
    """Hidden activation."""
    encoder: Encoder = "auto"
    """Observation encoder, as for PPO: the closed-form MLPs for flat vectors; for images and Dict
    observations the actor and each critic get their own encoder (auto, nature, small or impala)."""
    save_replay: bool = False
    """Store the replay buffer with each checkpoint (safetensors) so --resume restores it."""

    def __post_init__(self) -> None:
        _positive(self, "n_envs", "learning_rate", "buffer_size", "batch_size", "train_freq", "gradient_steps",
                  "target_update_interval")
        require(self.learning_starts >= 0, "learning_starts", self.learning_starts, ">= 0")
        _fraction(self, "tau", inclusive_zero=False)
        _fraction(self, "gamma")
        require(self.buffer_size >= self.batch_size, "buffer_size", self.buffer_size,
                f">= batch_size ({self.batch_size})", "a buffer smaller than a batch cannot be sampled")
        require(len(self.net_arch) > 0 and all(h > 0 for h in self.net_arch),
                "net_arch", self.net_arch, "one or more positive layer sizes")
        self.entropy_setting()  # validates ent_coef

    def entropy_setting(self) -> tuple[bool, float]:
        """(learned?, initial or fixed value) parsed from ``ent_coef``."""
        text = self.ent_coef.strip()
        learned = text.startswith("auto")
        value_text = text[5:] if text.startswith("auto_") else ("1.0" if learned else text)
        try:
            value = float(value_text)
        except ValueError:
            value = -1.0
        require(value > 0, "ent_coef", self.ent_coef, "'auto', 'auto_<initial value>' or a positive number")
        return learned, value


@dataclass(frozen=True)
class REINFORCEConfig:
    """REINFORCE (Williams 1992): the policy gradient of whole episodes' discounted returns."""

    n_envs: int = 1
    """Environments stepped together by each collector."""
    episodes_per_iter: int = 16
    """Whole episodes per update (over all workers)."""
    learning_rate: float = 1e-3
    """Adam step size."""
    gamma: float = 0.99
    """Discount factor of the returns."""
    normalize_returns: bool = True
    """Standardise the returns (or advantages, with a baseline) over the batch."""
    baseline: bool = False
    """Learn a state-value baseline and use G - V(s) as the advantage."""
    vf_coef: float = 0.5
    """Weight of the baseline's squared error."""
    ent_coef: float = 0.0
    """Entropy bonus coefficient."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value."""
    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layers of the policy (and of the baseline)."""
    activation: Activation = "tanh"
    """Hidden activation."""
    encoder: Encoder = "auto"
    """Observation encoder: auto picks the Nature CNN for images of at least 36x36, a small CNN for
    smaller ones, one encoder per key for Dict observations, and the closed-form MLPs for flat vectors;
    nature, small or impala (the IMPALA ResNet) ask for that CNN; mlp flattens images too."""
    log_std_init: float = 0.0
    """Initial log standard deviation of Gaussian policies (the std is learned)."""
    max_episode_steps: int = 10_000
    """Steps after which an unfinished episode is cut (guards against envs that never end)."""

    def __post_init__(self) -> None:
        _positive(self, "n_envs", "episodes_per_iter", "learning_rate", "max_grad_norm", "max_episode_steps")
        _fraction(self, "gamma")
        require(self.vf_coef >= 0, "vf_coef", self.vf_coef, ">= 0")
        require(self.ent_coef >= 0, "ent_coef", self.ent_coef, ">= 0")
        require(all(h > 0 for h in self.net_arch),
                "net_arch", self.net_arch, "positive layer sizes (none: linear heads)")


@dataclass(frozen=True)
class GRPOConfig:
    """Group-relative PPO for group tasks: G samples per input, advantages relative to the group."""

    group_size: int = 8
    """Samples drawn per input state (G)."""
    states_per_slice: int = 16
    """Input states per generation; their groups travel together as one slice."""
    slices_per_step: int = 4
    """Slices sampled from the replay buffer for one learner step."""
    learner_steps: int = 600
    """Learner steps (policy versions) in the run."""
    learning_rate: float = 3e-3
    """Adam step size."""
    clip_range: float = 0.2
    """PPO clip of the ratio to the behaviour policy."""
    kl_coef: float = 0.01
    """Weight of the KL penalty to the frozen reference policy (0 turns it off)."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this value."""
    net_arch: tuple[int, ...] = (64, 64)
    """Hidden layers of the policy."""
    slices_per_call: int = 4
    """Slices a generator draws per request (with one policy version); more amortise the round trip."""

    def __post_init__(self) -> None:
        _positive(self, "group_size", "states_per_slice", "slices_per_step", "learner_steps", "learning_rate",
                  "clip_range", "max_grad_norm", "slices_per_call")
        require(self.group_size >= 2, "group_size", self.group_size, ">= 2 (a group needs a mean to compare with)")
        require(self.kl_coef >= 0, "kl_coef", self.kl_coef, ">= 0")
        require(len(self.net_arch) > 0 and all(h > 0 for h in self.net_arch),
                "net_arch", self.net_arch, "one or more positive layer sizes")


def _nearest_divisor(n: int, target: int) -> int:
    divisors = [d for d in range(1, n + 1) if n % d == 0]
    return min(divisors, key=lambda d: (abs(d - target), d))


def parse_env_kwargs(items: tuple[str, ...] | list[str]) -> dict[str, Any]:
    """``("continuous=true", "max_episode_steps=500")`` as ``{"continuous": True, "max_episode_steps": 500}``.

    Values are typed: true/false as bools, none as None, ints, floats; anything else stays a string.
    """
    kwargs: dict[str, Any] = {}
    for item in items:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        require(bool(sep) and key.isidentifier(), "env_kwargs", item, "key=value items with a Python name as key",
                "e.g. --env-kwargs continuous=true max_episode_steps=500")
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
    """'package.module:function' applied in order to each environment, fn(env) -> env
    (--wrappers A B, or --wrapper A --wrapper B)."""
    atari_wrappers: bool = True
    """ALE ids: apply the standard Atari preprocessing (84x84 grey, frame skip 4, 4 stacked frames,
    no-op starts, fire on reset; episodic life and reward clipping while training)."""
    policy: str = ""
    """'package.module:function' building the policy/value network (a torch.nn.Module) from
    (observation_space, action_space, algorithm config); empty: distrl's built-in networks."""
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
    """Vector env: native (gymnasium's vector entry point), sync, async; auto prefers native."""
    checkpoint_every: int = 0
    """Save a checkpoint every this many steps (0: only the final model)."""
    resume: str = ""
    """Continue the run in this directory from its latest checkpoint, or from this checkpoint
    (RUN/checkpoints/step-N: run RUN goes on from step N)."""
    eval_every: int = 0
    """Run a deterministic evaluation every this many steps (0: only at the end)."""
    eval_episodes: int = 10
    """Episodes per evaluation."""
    target_return: float | None = None
    """Stop training once an evaluation reaches this mean return."""
    iterations: int = 0
    """Stop after this many updates instead of at total_steps (0: use total_steps)."""
    plot: bool = False
    """Write the run's reward curve (reward_curve.png) at the end."""
    precision: Precision = "fp32"
    """Arithmetic of the module path's networks (images, Dict observations, --policy): bf16 runs their
    forward and backward under bfloat16 autocast, with float32 weights, Adam and losses; on a CPU with
    AVX-512 BF16 it trained the Nature CNN 1.9x faster. The closed-form MLPs always use float32."""
    threads: int = 1
    """Intra-op torch threads per process. 1 suits small networks and several workers per machine;
    wide networks (SAC's 256x256) gain from more when the process has the cores to itself."""
    flush_denormal: bool = True
    """On the CPU, treat subnormal floats (below about 1.2e-38) as zero. Adam's second-moment
    estimates decay into that range, where x86 arithmetic is tens of times slower: SAC's Adam
    steps on Pendulum took 1.5 ms each instead of 0.14 ms."""
    quiet: bool = False
    """No progress display."""
    debug: bool = False
    """Show full tracebacks for errors."""

    def __post_init__(self) -> None:
        _positive(self, "total_steps", "eval_episodes", "threads")
        require(self.iterations >= 0, "iterations", self.iterations, ">= 0")
        require(self.seed >= 0, "seed", self.seed, ">= 0")
        require(self.checkpoint_every >= 0, "checkpoint_every", self.checkpoint_every, ">= 0")
        require(self.eval_every >= 0, "eval_every", self.eval_every, ">= 0")
        parse_env_kwargs(self.env_kwargs)
        for wrapper in self.wrappers:
            _require_entry_point("wrappers", wrapper, "'package.module:function'")
        if self.policy:
            _require_entry_point("policy", self.policy, "'package.module:function' or empty")

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


@dataclass(frozen=True)
class StrategyConfig:
    """How the work is spread over processes."""

    strategy: Strategy = "single"
    """single: one process; ddp: every worker collects and trains, gradients averaged every minibatch."""
    workers: int = 1
    """Worker processes (ddp). Under torchrun the world size comes from torchrun."""
    scaling: Scaling = "per-worker"
    """per-worker: each worker keeps n_steps (the global batch grows with workers, as in DD-PPO);
    equivalent: n_steps / workers and learning_rate * workers, so runs with different worker
    counts are comparable."""
    sync_frac: float = 1.0
    """Straggler preemption (DD-PPO): once this fraction of workers has finished its rollout, the
    others stop collecting (keeping at least min_rollout_frac of theirs). 1.0 turns it off."""
    min_rollout_frac: float = 0.25
    """The share of its rollout a preempted worker collects at least."""
    launcher: Launcher = "auto"
    """Who starts the ddp workers: local processes, Ray actors (auto: ray when --ray-address is set), or
    Spark's TorchDistributor (distrl[spark])."""
    ray_address: str = ""
    """Ray cluster to join ('auto' or HOST:PORT); empty starts an embedded local instance when needed."""
    spark_master: str = ""
    """--launcher spark: the Spark master URL (empty: local[workers], a Spark inside this process)."""
    spark_local_mode: bool = True
    """--launcher spark: start the ranks on the Spark driver (True) or as Spark tasks on executors (False)."""
    timeout_s: float = 120.0
    """Longest wait on another worker (collectives, start-up) before the run fails naming it."""
    worker_cpus: float = 1.0
    """CPUs Ray reserves for each rollout worker (actor-learner) or rank (ddp on Ray)."""
    worker_gpus: float = 0.0
    """GPUs Ray reserves for each rollout worker or rank."""
    max_worker_restarts: int = 3
    """actor-learner: how many times each rollout worker may be restarted after dying or failing."""
    on_worker_error: OnWorkerError = "restart"
    """actor-learner: what an exception raised inside a worker's env does: restart the worker, or abort the run."""
    share_data: bool = False
    """decoupled: send every trainer the whole rollout (each trains on its own part of every minibatch),
    instead of scattering equal shards."""
    player_device: Device = "cpu"
    """decoupled: where the player (rank 0) acts and computes values."""
    trainer_device: Device = "auto"
    """decoupled: where the trainers (ranks 1..N-1) update; cuda uses NCCL among them."""
    max_policy_lag: int = 4
    """pipeline: data drawn by a policy more than this many versions behind the learner is dropped."""
    buffer_capacity: int = 64
    """pipeline: scored slices (grpo) or rollout fragments (ppo) the replay buffer holds; the oldest is
    evicted past it."""
    replay_sampling: ReplaySampling = "version"
    """pipeline: replay sampling, uniform or weighted by policy version + 1 (newer data more often)."""
    max_reuse: int = 1
    """pipeline: learner steps that may train on one slice or fragment before it leaves the buffer."""
    queue_size: int = 0
    """pipeline: how far the generators may run ahead of the learner, in slices (grpo) or fragments (ppo)
    requested, being scored, or buffered and not trained on yet; past it they idle (back-pressure).
    0: 16 slices for grpo, one fragment per generator for ppo."""
    starve_timeout_s: float = 60.0
    """pipeline: the learner fails, naming the stage it waits on, when no data arrives for this long."""
    engine: Engine = "ray"
    """pipeline: the actor engine: Ray (embedded, or --ray-address), or Monarch process meshes on this
    host (distrl[monarch])."""

    def __post_init__(self) -> None:
        _positive(self, "workers", "timeout_s", "buffer_capacity", "max_reuse", "starve_timeout_s")
        require(self.queue_size >= 0, "queue_size", self.queue_size, ">= 0 (0: the default for the algorithm)")
        require(self.max_policy_lag >= 0, "max_policy_lag", self.max_policy_lag, ">= 0")
        require(self.worker_cpus >= 0, "worker_cpus", self.worker_cpus, ">= 0")
        require(self.worker_gpus >= 0, "worker_gpus", self.worker_gpus, ">= 0")
        require(self.max_worker_restarts >= 0, "max_worker_restarts", self.max_worker_restarts, ">= 0")
        _fraction(self, "sync_frac", inclusive_zero=False)
        _fraction(self, "min_rollout_frac", inclusive_zero=False)
        if self.strategy == "single":
            require(self.workers == 1, "workers", self.workers, "1 with --strategy single", "use --strategy ddp")
        if self.strategy == "decoupled":
            require(self.workers >= 2, "workers", self.workers, ">= 2 with --strategy decoupled",
                    "a player needs at least one trainer")
        if self.launcher == "spark":
            require(self.strategy in ("ddp", "decoupled"), "launcher", self.launcher,
                    "auto, local or ray with --strategy " + self.strategy, "Spark starts ddp or decoupled ranks")
        if self.engine != "ray":
            require(self.strategy == "pipeline", "engine", self.engine, "ray with --strategy " + self.strategy,
                    "Monarch runs the pipeline's actors")
            require(not self.ray_address, "ray_address", self.ray_address, "empty with --engine monarch")
        if self.strategy != "ddp":
            require(self.sync_frac == 1.0, "sync_frac", self.sync_frac, f"1.0 with --strategy {self.strategy}",
                    "straggler preemption needs --strategy ddp")

    @property
    def uses_ray(self) -> bool:
        return self.launcher == "ray" or (self.launcher == "auto" and bool(self.ray_address))


def scaled(cfg: Any, strategy: StrategyConfig, world_size: int) -> Any:
    """The algorithm config each worker runs: unchanged per worker, or scaled to match one process.

    PPO: n_steps / N and learning_rate * N. SAC: buffer_size / N, learning_starts / N and
    learning_rate * N (the recipes of Horovod's distributed PPO and SAC).
    """
    if strategy.scaling == "per-worker" or world_size == 1:
        return cfg
    if isinstance(cfg, SACConfig):
        return dataclasses.replace(cfg, buffer_size=max(cfg.batch_size, cfg.buffer_size // world_size),
                                   learning_starts=cfg.learning_starts // world_size,
                                   learning_rate=cfg.learning_rate * world_size)
    require(cfg.n_steps % world_size == 0, "n_steps", cfg.n_steps,
            f"divisible by the {world_size} workers with --scaling equivalent")
    return dataclasses.replace(cfg, n_steps=cfg.n_steps // world_size, learning_rate=cfg.learning_rate * world_size)


ALGO_CONFIGS: dict[str, type] = {"ppo": PPOConfig, "sac": SACConfig, "reinforce": REINFORCEConfig, "grpo": GRPOConfig}


def split_by_config(values: dict[str, Any], *classes: type) -> list[dict[str, Any]]:
    """``values`` split by which of ``classes`` has a field of that name (first match); the last dict
    holds the names none of them has (the algorithm's hyperparameters, checked later)."""
    parts: list[dict[str, Any]] = [{} for _ in range(len(classes) + 1)]
    names = [{f.name for f in dataclasses.fields(cls)} for cls in classes]
    for key, value in values.items():
        index = next((i for i, n in enumerate(names) if key in n), len(classes))
        parts[index][key] = value
    return parts


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-ready dict of a config dataclass (tuples become lists)."""
    return dataclasses.asdict(cfg)


def from_dict(cls: type, data: dict[str, Any]) -> Any:
    """Build ``cls`` from a dict written by :func:`to_dict`, rejecting unknown keys."""
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    require(not unknown, f"{cls.__name__} keys", unknown, f"among {sorted(names)}")
    values = dict(data)
    for f in dataclasses.fields(cls):
        if f.name in values and isinstance(values[f.name], list):
            values[f.name] = tuple(values[f.name])
    return cls(**values)
