"""GRPO's trainer: draw groups → score → one learner step, with the logs, checkpoints and resume of every run.

Where the groups come from is the trainer's *source* (:mod:`distrl.training.group_sources`):
:class:`~distrl.training.group_sources.LocalGroups` draws and scores them in this process (``single``, and every
rank of ``ddp``: each draws its own share of the step's prompts), the pipeline's generators and scorer feed it
otherwise (``distrl.strategies.pipeline``). The learner step is :class:`~distrl.algos.grpo.GRPOAlgo`'s in every
case, with this worker's ``Sync``.

A step's prompts and the randomness of every token are keyed by prompt position (see
:mod:`distrl.data.groups`), so ``ddp`` draws exactly the completions one process with the global batch
draws, and a run resumed from a checkpoint goes on as the uninterrupted one would have.

With ``dynamic_sampling`` (DAPO's, :class:`~distrl.training.group_sources.DynamicSampling`) a step's groups whose
rewards are all equal are dropped and fresh prompts drawn in their place; the prompts still follow a cursor of
positions that every draw advances and checkpoints record, so the same holds.
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from distrl.algos.grpo import GRPOAlgo
from distrl.algos.protocols import Sync
from distrl.config import ConfigError, RunConfig, StrategyConfig
from distrl.data.groups import GroupSamples, draw_groups, score_groups
from distrl.nets.causal_lm import CausalLMPolicy, PromptEncoder
from distrl.nets.core import checksum
from distrl.nets.group_factory import lora_settings, make_group_policy
from distrl.nets.lm_loading import load_tokenizer
from distrl.nets.lora import check_lora_targets, require_peft
from distrl.run.logs import Console, RunLogger
from distrl.tasks.group import GroupTask, StateTask, make_group_task
from distrl.tasks.names import TEXT_TASK, is_text_env
from distrl.tasks.rewards import RewardLog
from distrl.tasks.text_envs import TextEnvTask
from distrl.training.group_sources import DynamicSampling, GroupSource, LocalGroups
from distrl.training.state import RunState, section

EVAL_STATES = 1024
"""Fresh states of a numeric task's greedy evaluation."""
EVAL_PROMPTS = 64
"""Dataset prompts (the first of the run's order) of a text task's greedy evaluation."""
SAMPLES_LOG = "samples.log"
PRETRAINED_DIR = "pretrained"
"""RUN/pretrained: the trained language model as a transformers directory (``from_pretrained`` loads it)."""
RECENT = 10
"""Learner steps the first and last reward figures of summary.json average over."""


def check_prompts(task: GroupTask, encoder: PromptEncoder | None) -> None:
    """Every dataset prompt must fit ``max_prompt_tokens`` (checked once, before anything is drawn)."""
    dataset = getattr(task, "dataset", None)
    if dataset is None or encoder is None:
        return
    for start in range(0, len(dataset), 1024):
        rows = dataset.rows[start : start + 1024]
        found = encoder.too_long([row["prompt"] for row in rows])
        if found is not None:
            index, length = found
            raise ConfigError(
                f"dataset={dataset.path!r} line {dataset.lines[start + index]}: the prompt has "
                f"{length} tokens, over max_prompt_tokens={encoder.max_prompt_tokens} (prompts are "
                "never cut)"
            )


class GroupTrainer(RunState):
    """GRPO on one worker: a task, a policy (and a frozen reference), the learner step, on the run lifecycle
    every trainer shares (:class:`~distrl.training.state.RunState`: resume, events, checkpoints, the start-up
    broadcast, the end). ``steps`` counts learner steps; each one makes a new policy version."""

    algo_name = "grpo"
    COUNTERS = (*RunState.COUNTERS, "completions", "tokens")

    def __init__(
        self,
        run: RunConfig,
        cfg: Any,
        sync: Sync | None = None,
        run_dir: Path | None = None,
        log: bool = True,
        strategy: StrategyConfig | None = None,
        requested: Any = None,
        device: torch.device | None = None,
        source_factory: Callable[[GroupTrainer], GroupSource] | None = None,
    ):
        self.start_run(run, cfg, sync, strategy, requested, device, run_dir)
        self.env_id = run.env
        self.task = make_group_task(run.env, cfg, run.seed, run.env_kwargs)
        self.policy = make_group_policy(self.task, run, cfg, self.device)
        check_prompts(self.task, self.policy.prompts if isinstance(self.policy, CausalLMPolicy) else None)
        self.start_checksum = checksum(self.policy.params.data)
        self.reference = (
            make_group_policy(self.task, run, cfg, self.device, "reference", learner=self.policy)
            if cfg.beta > 0
            else None
        )
        self.algo = GRPOAlgo(cfg, self.policy, self.reference)
        self.completions = self.tokens = 0
        self.sampling = DynamicSampling()
        self.first_rewards: list[float] = []
        self.recent_rewards: deque[float] = deque(maxlen=RECENT)
        self.reward_log = RewardLog(self.task.reward_names)
        self.source: GroupSource = (source_factory or LocalGroups)(self)
        if self.is_main and log and run_dir is not None:
            self.console = Console(cfg.learner_steps, "learner steps", run.quiet, rate="completions/s", value="reward")
            try:
                self.logger = RunLogger.start(
                    run_dir, run.env, self.config_dict(), run.track, run.track_project, monitor=False
                )
            except BaseException:
                self.close()
                raise

    @property
    def version(self) -> int:
        """The policy version: learner steps taken."""
        return self.policy_version

    @classmethod
    def check_env(cls, run: RunConfig, cfg: Any) -> None:
        """What can fail before any worker starts: the task, its dataset and rewards, the prompts' lengths, and
        run flags that mean nothing to GRPO (a silently ignored flag is a trap)."""
        unused = {
            "total_steps": "--learner-steps bounds a grpo run",
            "iterations": "--learner-steps bounds a grpo run",
            "eval_every": "a grpo run evaluates at its end",
            "policy": "--model names a grpo run's network",
            "wrappers": "grpo runs have no env",
            "env_kwargs": "grpo runs have no env",
            "vec": "grpo runs have no env",
        }
        if is_text_env(run.env):  # a text environment takes constructor arguments
            del unused["env_kwargs"]
        for name, why in unused.items():
            value, default = getattr(run, name), getattr(RunConfig, name)
            if value != default:
                raise ConfigError(f"{name}={value!r} is not allowed for grpo: {why}")
        task = make_group_task(run.env, cfg, run.seed, run.env_kwargs)
        lora = lora_settings(cfg, run.seed)
        if lora is not None:
            require_peft(f"lora_rank={lora.rank}")
            check_lora_targets(cfg.model, lora.target_modules)
        if run.env == TEXT_TASK:
            check_prompts(
                task, PromptEncoder(cfg.model, load_tokenizer(cfg.model), cfg.chat_template, cfg.max_prompt_tokens)
            )
        elif is_text_env(run.env):
            load_tokenizer(cfg.model)  # a model directory that cannot play fails here, before any worker starts

    # ---- the loop ----

    def train(self) -> None:
        cfg = self.cfg
        while self.version < cfg.learner_steps:
            start = time.perf_counter()
            batch = self.source.next_batch(self.version)
            update_start = time.perf_counter()
            metrics = self.algo.update(batch, self.sync, self.version, 1.0 - self.version / cfg.learner_steps)
            self.steps = self.iteration = self.policy_version = self.version + 1
            now = time.perf_counter()
            self.update_s += now - update_start
            self.train_s += now - start
            self._log(batch, metrics)
            if self._reached_target():
                break
            votes = self.stop_votes()
            votes = self.sync.all_sum(votes) if self.sync.world_size > 1 else votes
            every = self.run.checkpoint_every
            if self.checkpoint_or_stop(
                bool(every) and self.version % every == 0, votes, self.version < cfg.learner_steps
            ):
                break

    def start_segment(self) -> None:
        """Nothing to restart: a step's prompts and randomness follow from its number."""

    def _reached_target(self) -> bool:
        """--target-return for GRPO: the mean reward of the last :data:`RECENT` steps (every worker's: all stop)."""
        target = self.run.target_return
        if target is None or len(self.recent_rewards) < RECENT or float(np.mean(self.recent_rewards)) < target:
            return False
        self.extra_summary.update({"target_reached_step": self.version, "target_reached_train_s": self.train_s})
        self.report(f"mean reward of the last {RECENT} steps reached {target:g} at learner step {self.version}")
        return True

    def record_scoring(self, samples: GroupSamples) -> None:
        """Count and time freshly scored ``samples``' reward calls, and name each one that failed but was scored in
        events.log. Sources call it once per scored batch, so that a group dropped later (for lag, or as flat
        under dynamic sampling) is counted and a slice trained on twice is not."""
        self.reward_log.add(samples.reward_seconds, samples.reward_failures)
        for failure in samples.reward_failures:
            self.report(failure.text)

    def _log(self, batch: GroupSamples, metrics: dict[str, float]) -> None:
        self.completions += int(metrics["completions/count"])
        self.tokens += int(metrics["completions/tokens"])
        reward = metrics["rewards/mean"]
        if len(self.first_rewards) < RECENT:
            self.first_rewards.append(reward)
        self.recent_rewards.append(reward)
        named = {f"rewards/{name}": metrics.pop(f"rewards/{k}") for k, name in enumerate(self.task.reward_names)}
        rate = self.completions / max(self.train_s, 1e-9)
        values = {
            **metrics,
            **named,
            **self.source.last_metrics,
            "charts/completions_per_s": rate,
            "charts/tokens_per_s": self.tokens / max(self.train_s, 1e-9),
            **batch.episode_figures(),
            **self.reward_log.figures(),
        }
        if self.logger is not None:
            self.logger.scalars(values, self.version, every_s=0.2)
            if self.cfg.sample_every and self.version % self.cfg.sample_every == 0 and batch.texts:
                self._log_samples(batch)
        if self.console is not None:
            self.console.update(self.version, rate, reward)

    def _log_samples(self, batch: GroupSamples) -> None:
        """Two completions of each of the batch's first two prompts, with their rewards, in samples.log."""
        assert self.logger is not None and batch.rewards is not None and batch.reward is not None
        prompts = self.task.prompts(batch.positions[:2])
        lines = [f"=== learner step {self.version}"]
        for i, prompt in enumerate(prompts):
            lines.append(f"--- prompt: {prompt!r}")
            for j in range(min(2, batch.group_size)):
                row = i * batch.group_size + j
                scores = ", ".join(
                    f"{name}={batch.rewards[row, k]:.3g}" for k, name in enumerate(self.task.reward_names)
                )
                lines.append(f"completion: {batch.texts[row]!r}  reward {batch.reward[row]:.3g} ({scores})")
        with (self.logger.run_dir / SAMPLES_LOG).open("a", encoding="utf-8") as f:
            f.write("\n".join(lines) + "\n")

    # ---- the end ----

    def evaluate(self) -> dict[str, float]:
        """Greedy answers: a numeric task's on fresh states, a text task's on its first dataset prompts, a text
        environment's episodes of its first rows."""
        if isinstance(self.task, StateTask):
            return greedy_reward_fraction(self.task, self.policy, self.run.seed)
        if isinstance(self.task, TextEnvTask):
            positions = self.task.eval_positions(EVAL_PROMPTS)
        else:
            dataset = self.task.dataset  # type: ignore[attr-defined]
            positions = np.arange(min(EVAL_PROMPTS, len(dataset)), dtype=np.int64)
        greedy = score_groups(
            self.task, draw_groups(self.task, self.policy, positions, 1, self.run.seed, self.version, greedy=True)
        )
        self.record_scoring(greedy)
        assert greedy.rewards is not None and greedy.reward is not None
        out = {"eval_reward": float(greedy.reward.mean()), "eval_prompts": float(len(positions))}
        out.update(
            {f"eval_reward/{name}": float(greedy.rewards[:, k].mean()) for k, name in enumerate(self.task.reward_names)}
        )
        out.update({f"eval_{name.partition('/')[2]}": value for name, value in greedy.episode_figures().items()})
        return out

    def progress_unit(self) -> str:
        return "learner step"

    def final_evaluation(self) -> dict[str, Any]:
        return self.evaluate()

    def end_collection(self) -> dict[str, Any]:
        return self.source.finish()

    def after_summary(self, summary: dict[str, Any]) -> None:
        if isinstance(self.policy, CausalLMPolicy):
            self.policy.save_pretrained(self.run_dir / PRETRAINED_DIR, merge=self.cfg.lora_merge)  # type: ignore[operator]

    def summary(self) -> dict[str, Any]:
        timing = self.source.timing()
        busy = self.update_s / max(self.train_s, 1e-9)
        return {
            **super().summary(),
            "model": self.cfg.model or None,
            "learner_steps": self.version,
            "completions": self.completions,
            "tokens": self.tokens,
            "learn_s": self.update_s,
            **timing,
            "learner_busy_fraction": busy,
            "learner_steps_per_s": self.version / max(self.train_s, 1e-9),
            "policy_lag_mean": 0.0,
            **(self.sampling.summary(self.version) if self.cfg.dynamic_sampling else {}),
            "completions_per_s": self.completions / max(self.train_s, 1e-9),
            "tokens_per_s": self.tokens / max(self.train_s, 1e-9),
            **self._param_counts(),
            "reward_first": float(np.mean(self.first_rewards)) if self.first_rewards else None,
            "reward_last": float(np.mean(self.recent_rewards)) if self.recent_rewards else None,
            **self.reward_log.summary(),
            **self.extra_summary,
        }

    def _param_counts(self) -> dict[str, int]:
        """Parameters trained (on the flat buffer: a LoRA run's adapter) and in all, and the bytes one weight
        transfer to a generator carries."""
        params = self.policy.params
        total = self.policy.total_params() if isinstance(self.policy, CausalLMPolicy) else params.size
        return {
            "trainable_params": params.size,
            "total_params": total,
            "weight_sync_bytes": params.data.numel() * params.data.element_size(),
        }

    def end_line(self, summary: dict[str, Any]) -> str:
        ev = summary.get("eval_reward")
        ev_text = f"greedy reward {ev:.3f}" if ev is not None else "no evaluation"
        return (
            f"done: {self.version:,} learner steps, {self.completions:,} completions in {self.train_s:.1f}s training "
            f"({summary['completions_per_s']:,.1f} completions/s), {summary['wall_s']:.1f}s total; reward "
            f"{summary['reward_first'] or 0:.3f} -> {summary['reward_last'] or 0:.3f}, {ev_text}; "
            f"run dir {self.run_dir}"
        )

    def release(self) -> None:
        try:
            self.source.close()
        finally:
            self.task.close()  # its reward workers, with whatever their calls started

    # ---- checkpoints and the start-up broadcast ----

    def state_tensors(self) -> dict[str, torch.Tensor]:
        tensors = {f"params/{name}": tensor for name, tensor in self.policy.params.state_dict().items()}
        tensors.update({f"optim/{name}": tensor for name, tensor in self.algo.state_dict().items()})
        return tensors

    def load_state_tensors(self, tensors: dict[str, torch.Tensor], path: Path) -> None:
        params, optim = section(tensors, "params"), section(tensors, "optim")
        if not params:  # written before GRPO ran on the shared lifecycle: policy.NAME and adam.NAME
            params = {k.removeprefix("policy."): v for k, v in tensors.items() if k.startswith("policy.")}
            optim = {k.removeprefix("adam."): v for k, v in tensors.items() if k.startswith("adam.")}
        self.policy.params.load_state_dict(params)
        self.algo.load_state_dict(optim)

    def checkpoint_state(self) -> dict[str, Any]:
        state: dict[str, Any] = {
            "completions": self.completions,
            "tokens": self.tokens,
            "start_checksum": self.start_checksum,
            "sampling": dataclasses.asdict(self.sampling),
        }
        if isinstance(self.policy, CausalLMPolicy) and self.policy.lora is not None:  # the adapter alone is saved
            state.update(base_checksum=self.policy.base_checksum(), lora=self.policy.adapter_config())
        return state

    def load_checkpoint_state(self, state: dict[str, Any], path: Path) -> None:
        if isinstance(self.policy, CausalLMPolicy):
            self._check_lora_checkpoint(state, path)
        if state.get("start_checksum") not in (None, self.start_checksum):
            raise ConfigError(
                f"checkpoint={str(path)!r} started from other weights than "
                f"{self.cfg.model or 'this seed'!r} holds now: the reference model and the resumed run "
                "would differ"
            )
        self.completions, self.tokens = int(state.get("completions", 0)), int(state.get("tokens", 0))
        steps = int(state["steps"])
        # written before the cursor was: every step drew its prompts_per_step on every worker, once
        earlier = {"cursor": steps * self.cfg.prompts_per_step * self.sync.world_size, "draws": steps}
        self.sampling = DynamicSampling(**state.get("sampling", earlier))
        self.source.resume(steps)

    def _check_lora_checkpoint(self, state: dict[str, Any], path: Path) -> None:
        """A LoRA checkpoint holds the adapter alone: it goes on only with the adapter layout it was trained with,
        on the very base weights it was trained on."""
        assert isinstance(self.policy, CausalLMPolicy)
        recorded, lora = state.get("lora"), self.policy.adapter_config()
        if recorded != lora:
            raise ConfigError(
                f"checkpoint={str(path)!r} was trained with {_adapter_text(recorded)}, not {_adapter_text(lora)}: "
                "resume it with the --lora-* settings it was trained with"
            )
        base = state.get("base_checksum")
        if base is not None and base != self.policy.base_checksum():
            raise ConfigError(
                f"checkpoint={str(path)!r} holds a LoRA adapter trained on other base weights than "
                f"model={self.cfg.model!r} holds now (checksum {base} != {self.policy.base_checksum()}): resume "
                "with the model it was trained on"
            )

    def broadcast_tensors(self) -> list[torch.Tensor]:
        optim = self.algo.optimizer
        return [
            self.policy.params.data,
            optim.exp_avg,
            optim.exp_avg_sq,
            torch.tensor([optim.steps, *self.sampling.values()], dtype=torch.float64),
        ]

    def after_broadcast(self, tensors: list[torch.Tensor]) -> None:
        self.algo.optimizer.steps = int(tensors[-1][0])
        self.sampling.load(tensors[-1][1:].tolist())


def _adapter_text(adapter: dict[str, Any] | None) -> str:
    """An adapter as :meth:`CausalLMPolicy.adapter_config` describes it, in words."""
    if adapter is None:
        return "full fine-tuning"
    return f"LoRA rank {adapter['rank']}, alpha {adapter['alpha']:g} on {len(adapter['target_modules'])} layers"


def greedy_reward_fraction(task: StateTask, policy: Any, seed: int) -> dict[str, float]:
    """Mean reward of the most likely action on fresh states, and its share of the way from random to optimal."""
    states = task.states(EVAL_STATES, np.random.default_rng(seed + 1_000_000))
    with torch.inference_mode():
        greedy = policy.logits(torch.from_numpy(states).to(policy.device)).argmax(dim=1, keepdim=True).cpu().numpy()
    reward = float(task.action_rewards(states, greedy).mean())
    every = np.tile(np.arange(task.n_actions), (len(states), 1))
    random_reward = float(task.action_rewards(states, every).mean())
    optimal = task.optimal_reward(states)
    return {
        "eval_reward": reward,
        "optimal_reward": optimal,
        "random_reward": random_reward,
        "eval_fraction_of_optimal": (reward - random_reward) / (optimal - random_reward),
    }


def train_grpo(
    run: RunConfig,
    cfg: Any,
    run_dir: Path | None,
    resume_path: Path | None = None,
    source_factory: Callable[[GroupTrainer], GroupSource] | None = None,
    strategy: StrategyConfig | None = None,
) -> dict[str, Any]:
    """GRPO in this process (``single``, or the pipeline's learner with its ``source_factory``), through the
    lifecycle every trainer shares (:meth:`~distrl.training.state.RunState.run_to_end`)."""
    start = time.perf_counter()
    trainer = GroupTrainer(run, cfg, run_dir=run_dir, strategy=strategy, source_factory=source_factory)
    return trainer.run_to_end(resume_path, start)
