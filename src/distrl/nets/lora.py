"""LoRA mode of a language-model policy (Hu et al. 2021, arXiv:2106.09685): train a low-rank adapter, not the model.

With :class:`LoraSettings` the model is wrapped by peft with a LoRA adapter and only the adapter's parameters go
on the flat buffer (:class:`~distrl.nets.core.ParamBuffer`): the base weights stay frozen, float32 and outside
it, so Adam, the gradient sum of ``ddp``, the weights sent to generators and checkpoints hold the adapter alone.
The adapter starts from the run's seed (every rank and generator alike); its B matrices start at zero, so the
model starts as the base model, which is also GRPO's reference (the adapter switched off,
:class:`~distrl.nets.causal_lm.BaseModelReference`).

The policy itself is :class:`~distrl.nets.causal_lm.CausalLMPolicy`; here are the adapter's settings, the checks
that refuse a bad one before a run starts, wrapping a model, and merging a saved adapter into its base model.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from distrl.config import ConfigError
from distrl.nets.lm_loading import INSTALL, first_line, import_transformers, load_causal_lm, model_dir

MERGED_DIR = "merged"
"""Where in a LoRA run's model directory the model with its adapter merged into the weights goes."""


@dataclass(frozen=True)
class LoraSettings:
    """A LoRA adapter to train instead of every weight (GRPOConfig's ``lora_*`` fields, and the run's seed)."""

    rank: int
    alpha: float
    dropout: float = 0.0
    """Dropout on the adapter's input, in the learner's forward pass only (see
    :meth:`~distrl.nets.causal_lm.CausalLMPolicy.token_log_probs`)."""
    target_modules: tuple[str, ...] = ()
    """Module names as peft matches them (a name, or the end of a dotted path); empty: every linear layer
    but the output layer (peft's "all-linear")."""
    seed: int = 0
    """Draws the adapter's initial A matrices, and keys the dropout masks."""


def require_peft(where: str) -> Any:
    """peft, imported when a run asks for LoRA; a one-line ConfigError naming the extra to install otherwise."""
    try:
        import peft
    except ImportError:
        raise ConfigError(f"{where}: LoRA needs peft ({INSTALL})") from None
    return peft


def _check_targets(model: torch.nn.Module, targets: Sequence[str], path: str) -> None:
    """Every name in ``targets`` must match a module of ``model`` the way peft matches a list of names: the
    whole dotted path, or its end after a dot. peft itself refuses only when no name matches anything."""
    names = [name for name, _ in model.named_modules()]
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        linear = sorted(
            {
                name.rsplit(".", 1)[-1]
                for name, module in model.named_modules()
                if isinstance(module, torch.nn.Linear) or type(module).__name__ == "Conv1D"  # GPT-2's linear layers
            }
        )
        raise ConfigError(
            f"lora_target_modules={tuple(missing)!r} is not allowed: no module of model={path!r} has that name; "
            f"its linear layers are {', '.join(linear)}"
        )


def check_lora_targets(path: str, targets: Sequence[str]) -> None:
    """Fail before a run starts when a LoRA target names no module of the model at ``path``; the model is
    built on the meta device from its config.json (no weights are read)."""
    if not targets:
        return
    folder = model_dir(path)
    transformers = import_transformers(f"model={path!r}")
    try:
        config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # noqa: BLE001 - whatever transformers says, on one line
        raise ConfigError(f"model={path!r} cannot be loaded as a causal LM: {first_line(exc)}") from None
    _check_targets(model, targets, path)


def add_lora(model: Any, lora: LoraSettings, path: str) -> Any:
    """``model`` wrapped by peft with a fresh LoRA adapter, its base weights frozen, in eval mode."""
    peft = require_peft(f"lora_rank={lora.rank}")
    _check_targets(model, lora.target_modules, path)
    config = peft.LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules) or "all-linear",
        bias="none",
        task_type="CAUSAL_LM",
        # GPT-2's layers (transformers' Conv1D) store their weights transposed; peft would warn, then set it
        fan_in_fan_out=any(type(m).__name__ == "Conv1D" for m in model.modules()),
    )
    # peft draws the A matrices from torch's global generator: seeded here (and restored after), every rank,
    # generator and resumed process starts from the same adapter whatever ran before in it
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        torch.manual_seed(lora.seed)
        # peft 0.21 asks transformers 5 a question it has deprecated (is_gradient_checkpointing): not the user's
        # to act on, and it comes before a run routes other libraries' warnings to its log
        warnings.filterwarnings("ignore", category=FutureWarning)
        try:
            wrapped = peft.get_peft_model(model, config)
        except (ValueError, TypeError, RuntimeError) as exc:  # e.g. a target that is no layer peft can adapt
            raise ConfigError(
                f"lora_target_modules={lora.target_modules!r} is not allowed for model={path!r}: {first_line(exc)}"
            ) from None
    wrapped.eval()  # peft's new layers start in training mode: their dropout would make behaviour differ
    return wrapped


def save_merged(path: str, adapter: Path, folder: Path, tokenizer: Any) -> None:
    """The base model at ``path``, loaded again on the CPU, with the adapter just written at ``adapter`` merged in,
    saved with ``tokenizer`` in ``folder``: as a user would merge it, and the live model and its device memory stay
    untouched."""
    peft = require_peft("lora_merge=True")
    base = load_causal_lm(path, torch.device("cpu"))
    merged = peft.PeftModel.from_pretrained(base, str(adapter), local_files_only=True).merge_and_unload()
    merged.save_pretrained(str(folder))
    tokenizer.save_pretrained(str(folder))
