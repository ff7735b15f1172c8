"""GRPO's configuration (group-relative policy optimization on language models and numeric group tasks)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from distrl.config.base import GRPOLoss, RewardScaling, Schedule, require, require_positive


@dataclass(frozen=True)
class GRPOConfig:
    """Group Relative Policy Optimization (Shao et al. 2024, arXiv:2402.03300): G completions per prompt,
    advantages relative to the group. On a transformers causal LM (--model, --dataset, --reward) or on a
    numeric group task (toy, bandit). Names follow TRL's GRPOConfig where they mean the same."""

    model: str = ""
    """A local directory holding a transformers causal LM and its tokenizer (save_pretrained's output);
    nothing is downloaded."""
    dataset: str = ""
    """A JSONL file of prompts: one object per line with a 'prompt' (a string, or chat messages) and the
    fields the rewards need, e.g. {"prompt": "12+7=", "answer": "19"}."""
    rewards: tuple[str, ...] = ()
    """Reward functions: built-ins (exact_match, format) or 'package.module:function', called as
    fn(prompts, completions, **fields) -> list[float]; several as --reward A --reward B."""
    reward_weights: tuple[float, ...] = ()
    """One weight per reward function (default 1 each); the reward is their weighted sum."""
    reward_timeout_s: float = 60.0
    """Longest one reward call may take: on one sample in a reward worker (then it is killed), or on a whole
    batch with reward_workers=0."""
    reward_workers: int = 2
    """Processes that run the reward functions, one sample per call, each with reward_timeout_s; a call past
    it is killed with its process tree (0: call them in this process, a batch per call, a timeout ends the
    run)."""
    reward_timeout_policy: Literal["score", "fail"] = "score"
    """What a reward call past reward_timeout_s does: score gives the sample reward_timeout_score (counted
    and named in events.log and summary.json) and goes on; fail ends the run naming the reward."""
    reward_error_policy: Literal["score", "fail"] = "fail"
    """What a reward that raises does: fail ends the run naming it; score gives the sample
    reward_timeout_score and goes on, as a timeout does."""
    reward_timeout_score: float = 0.0
    """The score of a sample whose reward call timed out (or raised, with reward_error_policy=score)."""
    chat_template: bool = False
    """Render plain-string prompts with the tokenizer's chat template (chat-message prompts always are)."""
    max_prompt_tokens: int = 512
    """Longest prompt allowed, in tokens (checked on every dataset line before the run starts)."""
    max_new_tokens: int = 256
    """Longest completion, in tokens (TRL: max_completion_length)."""
    temperature: float = 1.0
    """Sampling temperature; log-probabilities are those of softmax(logits / temperature)."""
    top_p: float = 1.0
    """Nucleus sampling: draw only among the most likely tokens whose probability reaches top_p."""
    stop: tuple[str, ...] = ()
    """Strings that end a completion (kept in it), besides the EOS token."""
    group_size: int = 8
    """Completions drawn per prompt (G; TRL: num_generations)."""
    prompts_per_slice: int = 4
    """Prompts whose groups are drawn and buffered together: the unit of generation and replay."""
    slices_per_step: int = 4
    """Slices per learner step, per worker: a step trains on prompts_per_slice * slices_per_step * group_size
    completions on each worker."""
    slices_per_call: int = 4
    """pipeline: slices a generator draws per request (with one policy version); more amortise the round trip."""
    microbatch_size: int = 0
    """Completions per forward and backward pass; their gradients accumulate to the step's (0: all at once)."""
    learner_steps: int = 600
    """Learner steps (policy versions) in the run."""
    learning_rate: float = 1e-6
    """Adam step size (TRL's default for language models)."""
    lr_schedule: Schedule = "constant"
    """'linear' anneals the learning rate to 0 over learner_steps."""
    loss_type: GRPOLoss = "dapo"
    """How per-token losses become one: grpo (mean per completion, then over completions), dr_grpo (sum over
    tokens / (completions * max_new_tokens)), dapo (mean over all tokens of the global batch)."""
    scale_rewards: RewardScaling = "group"
    """Divide advantages by the group's reward std (group), the global batch's (batch), or not (none, as
    Dr. GRPO does)."""
    clip_range: float = 0.2
    """PPO clip of the ratio to the behaviour policy: [1 - clip_range, 1 + clip_range_high]."""
    clip_range_high: float | None = None
    """Upper clip (DAPO's clip-higher, e.g. 0.28); None: clip_range."""
    beta: float = 0.0
    """Weight of the KL penalty to the frozen starting model (k3 estimator); 0 skips the reference model."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm (after summing over workers) to this value."""
    sample_every: int = 10
    """Write a few prompts, completions and rewards to samples.log every this many learner steps (0: never)."""
    net_arch: tuple[int, ...] = (64, 64)
    """Numeric group tasks: hidden layers of the policy MLP."""
    max_turns: int = 8
    """Text environments (--env package.module:factory): model turns per episode at most."""
    max_turn_tokens: int = 0
    """Text environments: the longest model turn, in tokens (0: max_new_tokens); max_new_tokens bounds the
    model's tokens over all turns."""
    lora_rank: int = 0
    """Train a LoRA adapter of this rank through peft instead of every weight (0: full fine-tuning)."""
    lora_alpha: float = 32.0
    """LoRA's scale numerator: the adapter's update is scaled by lora_alpha / lora_rank."""
    lora_dropout: float = 0.0
    """Dropout on the adapter's input in the learner's forward pass (the generators draw without it)."""
    lora_target_modules: tuple[str, ...] = ()
    """Module names the adapter wraps, as peft matches them (default: every linear layer but the output)."""
    lora_merge: bool = False
    """Also write the model with the adapter merged into its weights, to RUN/pretrained/merged."""
    tis_cap: float = 0.0
    """Token-level truncated importance sampling: weight each token's policy gradient by
    min(pi_learner / pi_behaviour, tis_cap), with the clipped ratio taken to the learner's own policy;
    zero turns it off (the clipped ratio is then taken to the behaviour policy)."""
    is_mask_low: float = 0.0
    """Sequence-level masking: completions whose importance ratio (see is_mask_level) is below this carry no
    loss (0: no lower bound)."""
    is_mask_high: float = 0.0
    """Sequence-level masking: completions whose importance ratio is above this carry no loss (0: no upper
    bound)."""
    is_mask_level: Literal["sequence", "geometric"] = "geometric"
    """The ratio masking compares: the product over a completion's tokens (sequence) or its geometric mean."""
    dynamic_sampling: bool = False
    """DAPO's dynamic sampling: groups whose rewards are all equal are replaced by fresh prompts' groups
    until the batch is full (counted)."""
    dynamic_sampling_max_draws: int = 8
    """Dynamic sampling: draws of prompts per learner step at most, the first included; past it the step
    trains on what it has."""
    overlong_filter: bool = False
    """Completions cut at max_new_tokens carry no loss (DAPO's overlong filtering)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong punishment: over the last overlong_buffer tokens before max_new_tokens, a
    penalty rising linearly to overlong_penalty is added to the reward (0: off)."""
    overlong_penalty: float = 1.0
    """The soft overlong punishment's largest penalty (subtracted at max_new_tokens)."""

    def __post_init__(self) -> None:
        require_positive(
            self,
            "group_size",
            "prompts_per_slice",
            "slices_per_step",
            "learner_steps",
            "learning_rate",
            "clip_range",
            "max_grad_norm",
            "slices_per_call",
            "max_prompt_tokens",
            "max_new_tokens",
            "temperature",
            "reward_timeout_s",
            "max_turns",
            "dynamic_sampling_max_draws",
        )
        require(self.reward_workers >= 0, "reward_workers", self.reward_workers, ">= 0 (0: in this process)")
        require(self.max_turn_tokens >= 0, "max_turn_tokens", self.max_turn_tokens, ">= 0 (0: max_new_tokens)")
        require(self.lora_rank >= 0, "lora_rank", self.lora_rank, ">= 0 (0: full fine-tuning)")
        require(self.lora_alpha > 0, "lora_alpha", self.lora_alpha, "> 0")
        require(0 <= self.lora_dropout < 1, "lora_dropout", self.lora_dropout, "in [0, 1)")
        require(self.tis_cap == 0 or self.tis_cap >= 1, "tis_cap", self.tis_cap, ">= 1, or 0 for off")
        require(self.is_mask_low >= 0, "is_mask_low", self.is_mask_low, ">= 0 (0: no lower bound)")
        require(
            self.is_mask_high == 0 or self.is_mask_high > max(self.is_mask_low, 1.0),
            "is_mask_high",
            self.is_mask_high,
            f"> max(1, is_mask_low={self.is_mask_low:g}), or 0 for no upper bound",
        )
        require(
            0 <= self.overlong_buffer < self.max_new_tokens,
            "overlong_buffer",
            self.overlong_buffer,
            f"in [0, max_new_tokens={self.max_new_tokens}) (0: off)",
        )
        require(self.overlong_penalty >= 0, "overlong_penalty", self.overlong_penalty, ">= 0")
        require(self.group_size >= 2, "group_size", self.group_size, ">= 2 (a group needs a mean to compare with)")
        require(self.beta >= 0, "beta", self.beta, ">= 0 (0 turns the KL penalty off)")
        require(0 < self.top_p <= 1, "top_p", self.top_p, "in (0, 1]")
        require(self.microbatch_size >= 0, "microbatch_size", self.microbatch_size, ">= 0 (0: the whole batch)")
        require(self.sample_every >= 0, "sample_every", self.sample_every, ">= 0 (0: never)")
        if self.clip_range_high is not None:
            require(self.clip_range_high > 0, "clip_range_high", self.clip_range_high, "> 0 or None")
        require(
            not self.reward_weights or len(self.reward_weights) == len(self.rewards),
            "reward_weights",
            self.reward_weights,
            f"one weight per reward ({len(self.rewards)}), or none for 1 each",
        )
        require(all(s for s in self.stop), "stop", self.stop, "non-empty strings")
        require(
            len(self.net_arch) > 0 and all(h > 0 for h in self.net_arch),
            "net_arch",
            self.net_arch,
            "one or more positive layer sizes",
        )

    @property
    def clip_high(self) -> float:
        return self.clip_range if self.clip_range_high is None else self.clip_range_high

    @property
    def prompts_per_step(self) -> int:
        """Prompts each worker draws per learner step."""
        return self.prompts_per_slice * self.slices_per_step
