"""The policy of a GRPO run: a language model (with its LoRA adapter, if any) for a text task, an MLP over
states for a numeric one."""

from __future__ import annotations

from typing import Any

import torch

from distrl.config import ConfigError, GRPOConfig
from distrl.nets.causal_lm import CausalLMPolicy
from distrl.nets.group_policy import CategoricalPolicy
from distrl.nets.lora import LoraSettings

LORA_OPTIONS = ("lora_alpha", "lora_dropout", "lora_target_modules", "lora_merge")
"""GRPOConfig's LoRA fields that mean something only with lora_rank > 0."""


def lora_settings(cfg: Any, seed: int) -> LoraSettings | None:
    """The LoRA adapter a GRPO run trains, or None (every weight trains); a one-line ConfigError for LoRA options
    without ``lora_rank`` (a silently ignored flag is a trap) and for LoRA on a numeric task."""
    if cfg.lora_rank == 0:
        given = [
            f"{name}={getattr(cfg, name)!r}" for name in LORA_OPTIONS if getattr(cfg, name) != getattr(GRPOConfig, name)
        ]
        if given:
            raise ConfigError(
                f"{given[0]} is not allowed with lora_rank=0 (full fine-tuning): LoRA options need --lora-rank > 0"
            )
        return None
    if not cfg.model:
        raise ConfigError(
            f"lora_rank={cfg.lora_rank} is not allowed without --model: LoRA trains an adapter on a language "
            "model; a numeric group task (toy, bandit) trains its whole MLP (lora_rank=0)"
        )
    return LoraSettings(cfg.lora_rank, cfg.lora_alpha, cfg.lora_dropout, tuple(cfg.lora_target_modules), seed)


def make_group_policy(
    task: Any, run: Any, cfg: Any, device: torch.device, role: str = "learner", learner: Any = None
) -> Any:
    """The policy of a GRPO run: the model at ``cfg.model`` for a text task, an MLP over states otherwise.

    ``role``: the learner's (trains), a generator's (only acts) or the frozen reference (the starting
    weights: reloaded from the model directory, or rebuilt from the seed). A LoRA run's reference is its
    ``learner``'s model with the adapter switched off (the base weights, held once) when it is given.
    """
    lora = lora_settings(cfg, run.seed)
    if role == "reference" and lora is not None and isinstance(learner, CausalLMPolicy):
        return learner.without_adapter()
    if cfg.model:
        return CausalLMPolicy(
            cfg.model,
            device,
            role=role,
            bf16=run.precision == "bf16",  # type: ignore[arg-type]
            chat_template=cfg.chat_template,
            max_prompt_tokens=cfg.max_prompt_tokens,
            temperature=cfg.temperature,
            top_p=cfg.top_p,
            max_new_tokens=cfg.max_new_tokens,
            stop=cfg.stop,
            lora=lora,
        )
    return CategoricalPolicy(task.obs_dim, task.n_actions, cfg.net_arch, run.seed, device)
