"""TRL's side of ``grpo_vs_trl.py``: GRPOTrainer on the same model, data and settings, one run in this process.

    python benchmarks/trl_grpo.py TASK MODEL DATA MAX_STEPS RUN_DIR SEED   # prints the run's figures as JSON

``reversal`` and ``lora`` train on the reversal prompts with ``distrl_lm.reversal`` (``lora`` through
``peft_config=LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")``, every linear layer but the
output). ``multiturn`` plays ``textgame``'s game through GRPOTrainer's ``environment_factory``: the
environment's ``guess`` method is a tool the model calls, and the trainer's tool-call loop runs the turns. A
random model writes no JSON tool calls, so the tokenizer gets a chat template and a response template
(transformers' parser of a model's reply into a message) in which a call is the one token after the cue the
prompt ends with: a rollout's tokens are then exactly those of distrl's environment ("find the number guess
n=5 higher guess n=7 ..."), the environment's tokens masked out of the loss on both sides.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from grpo_vs_trl import TASKS, Task
from textgame import CUE, FEEDBACK, INTRO, TURNS, Game

# The game's turns as tool calls. The chat template renders a call to guess(n=5) as " guess n=5" and a tool
# result as " higher"; with add_generation_prompt it ends in ``turn_prefix`` (CUE), given through
# GRPOConfig.chat_template_kwargs, which also reach the rendering of the text that follows a tool result. The
# response template parses what follows the last CUE, a digit, as JSON: anything else is no call, and ends the
# rollout, as a turn that is not a digit ends distrl's game.
GAME_CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}"
    "{%- for c in m.tool_calls or [] -%}{{ ' ' ~ c.function.name }}"
    "{%- for k, v in c.function.arguments.items() %}{{ ' ' ~ k ~ '=' ~ v }}{% endfor -%}"
    "{%- endfor -%}"
    "{%- if m.content %}{{ ' ' ~ m.content }}{% endif -%}"
    "{%- elif m.role == 'tool' -%}{{ ' ' ~ m.content }}"
    "{%- else -%}{{ m.content }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt and turn_prefix is defined %}{{ turn_prefix }}{% endif -%}"
)
GAME_RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": CUE,
    "fields": {
        "tool_calls": {
            "content": "json",
            "repeats": True,
            "transform": {"type": "function", "function": {"name": "guess", "arguments": {"n": "{content}"}}},
        }
    },
}


class GuessEnv:
    """textgame's rules as a GRPOTrainer environment: ``reset``, one tool (``guess``) and ``get_reward``."""

    def __init__(self) -> None:
        self.game = Game(0)

    def reset(self, secret: int, **row: Any) -> str:
        self.game = Game(int(secret))
        return INTRO

    def guess(self, n: int) -> str:
        """Guess the hidden number.

        Args:
            n: The guess, a digit.

        Returns:
            "higher", "lower" or "correct".
        """
        return self.game.guess(n)

    def get_reward(self) -> float:
        return float(self.game.solved)


def game_budget() -> int:
    """max_completion_length that lets exactly TURNS one-token turns through: the trainer drops a tool result
    that would pass it, and the rollout ends there (the last guess is still played)."""
    suffix = [len(f" {word}{CUE}") for word in FEEDBACK]  # one token per character
    if (TURNS - 1) * max(suffix) >= TURNS * min(suffix):
        raise ValueError(f"feedback words {FEEDBACK} differ too much in length for a budget of {TURNS} turns")
    return TURNS + (TURNS - 1) * max(suffix)


def run(name: str, model: str, data: str, max_steps: int, out: str, seed: int) -> dict:
    """One GRPOTrainer run of task ``name``; times by stage."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from distrl_lm import reversal

    task: Task = TASKS[name]
    torch.set_num_threads(1)
    rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()]
    game = bool(task.env)
    extra: dict[str, Any] = {}
    trainer_kwargs: dict[str, Any] = {"reward_funcs": [reversal]}
    if game:
        os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # environment_factory is marked experimental
        tokenizer = AutoTokenizer.from_pretrained(model)
        tokenizer.chat_template = GAME_CHAT_TEMPLATE
        tokenizer.response_template = GAME_RESPONSE_TEMPLATE
        rows = [{"prompt": [{"role": "user", "content": ""}], "secret": row["secret"]} for row in rows]
        extra = {
            "max_completion_length": game_budget(),
            "generation_kwargs": {"max_new_tokens": 1},  # one token per turn (distrl: --max-turn-tokens 1)
            "max_tool_calling_iterations": TURNS,
            "chat_template_kwargs": {"turn_prefix": CUE},
        }
        trainer_kwargs = {"environment_factory": GuessEnv, "processing_class": tokenizer}
    if task.lora:
        trainer_kwargs["peft_config"] = LoraConfig(r=8, lora_alpha=16, target_modules="all-linear")
    settings: dict[str, Any] = dict(
        output_dir=out,
        per_device_train_batch_size=task.group * task.prompts,
        gradient_accumulation_steps=1,
        num_generations=task.group,
        max_completion_length=task.new_tokens,
        temperature=1.0,
        top_p=1.0,
        learning_rate=task.learning_rate,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_epsilon=1e-8,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        max_grad_norm=1.0,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    args = GRPOConfig(**{**settings, **extra})
    rewards: list[float] = []
    lengths: list[float] = []
    marks: dict[str, float] = {}

    class Target(TrainerCallback):
        def on_train_begin(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            marks["start"] = time.perf_counter()

        def on_log(self, a, state, control, logs=None, **k):  # noqa: ANN001, ANN003, ANN202
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                lengths.append(float(logs["completions/mean_length"]))  # the model's tokens, the game's left out
                reached = task.target is not None and sum(rewards[-10:]) / 10 >= task.target
                if "target_s" not in marks and len(rewards) >= 10 and reached:
                    marks["target_s"], marks["target_step"] = time.perf_counter() - marks["start"], state.global_step
                    control.should_training_stop = True

    trainer = GRPOTrainer(
        model=model, args=args, train_dataset=Dataset.from_list(rows), callbacks=[Target()], **trainer_kwargs
    )
    spent = {"generate": 0.0, "score": 0.0, "generate_and_score": 0.0}

    def timed(stage, fn):  # noqa: ANN001, ANN202
        def wrapper(*a, **k):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[stage] += time.perf_counter() - start

        return wrapper

    # The trainer's stages, timed where it calls them: generation (the tool-call loop with it), scoring, both.
    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("score", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
    trainer.train()
    train_s = time.perf_counter() - marks["start"]
    steps = trainer.state.global_step
    completions = steps * task.group * task.prompts
    return {
        "completions": completions,
        "train_s": train_s,
        "steps": steps,
        "completions_per_s": completions / train_s,
        "target_train_s": marks.get("target_s"),
        "target_step": marks.get("target_step"),
        "reward_last": sum(rewards[-10:]) / max(len(rewards[-10:]), 1),
        "model_tokens": sum(lengths) / max(len(lengths), 1),
        "generate_s": spent["generate"],
        "score_s": spent["score"],
        "learn_s": train_s - spent["generate_and_score"],
        "weight_sync_s": 0.0,
        "weight_sync_bytes": None,
        "learner_busy_fraction": None,
    }


if __name__ == "__main__":
    task_name, model_dir, data_file, steps_arg, run_dir, seed_arg = sys.argv[1:7]
    print(json.dumps(run(task_name, model_dir, data_file, int(steps_arg), run_dir, int(seed_arg))))
