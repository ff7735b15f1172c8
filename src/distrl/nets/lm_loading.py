"""A language model and its tokenizer from a local directory, with transformers' errors as one-line ConfigErrors.

Any model ``AutoModelForCausalLM`` loads from a local directory works: GPT-2, Llama, Qwen, ... Nothing is
downloaded and no code shipped with a model is run (``local_files_only``, no ``trust_remote_code``). The policy
(:mod:`distrl.nets.causal_lm`) and its LoRA adapters (:mod:`distrl.nets.lora`) both load through here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from distrl.config import ConfigError

INSTALL = "pip install 'distrl[lm]'"


def import_transformers(where: str) -> Any:
    """transformers, its progress bars off; a one-line ConfigError starting with ``where`` if it is missing."""
    try:
        import transformers
    except ImportError:
        raise ConfigError(f"{where}: language models need transformers ({INSTALL})") from None
    transformers.utils.logging.disable_progress_bar()  # a bar per load, in every rank and generator: noise
    return transformers


def model_dir(path: str) -> Path:
    """``path`` as a directory that save_pretrained wrote; a one-line ConfigError otherwise."""
    if not path:
        raise ConfigError(
            "model='' is not allowed: must be a directory holding a transformers causal LM "
            "(saved with save_pretrained), e.g. --model ./my-model"
        )
    folder = Path(path)
    if not folder.is_dir():
        raise ConfigError(
            f"model={path!r} is not a directory: must be a local directory holding a transformers "
            "causal LM (nothing is downloaded)"
        )
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model={path!r} has no config.json: must be a directory written by save_pretrained")
    return folder


def load_tokenizer(path: str) -> Any:
    """The tokenizer of a local model directory; a one-line ConfigError if there is none."""
    folder = model_dir(path)
    try:
        return import_transformers(f"model={path!r}").AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever transformers says, on one line
        raise ConfigError(f"model={path!r}: its tokenizer cannot be loaded: {first_line(exc)}") from None


def load_causal_lm(path: str, device: torch.device) -> Any:
    """The model of a local directory, float32, in eval mode; a one-line ConfigError otherwise."""
    folder = model_dir(path)
    try:
        model = import_transformers(f"model={path!r}").AutoModelForCausalLM.from_pretrained(
            str(folder), local_files_only=True, dtype=torch.float32
        )
    except ConfigError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ConfigError(f"model={path!r} cannot be loaded as a causal LM: {first_line(exc)}") from None
    model.to(device)
    model.eval()  # no dropout: behaviour and learner log-probabilities must be the same function
    return model


def first_line(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"
