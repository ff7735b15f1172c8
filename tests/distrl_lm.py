"""Tiny language models made in code, datasets and reward functions, for the GRPO tests (nothing is downloaded).

``make_model(folder)`` saves a randomly initialised causal LM (Llama or GPT-2 layout) with a
character-level tokenizer, so tests train through the same ``--model PATH`` loading code as real models.
"""

import json
import os
import random
import time
from pathlib import Path

SPECIALS = ["<pad>", "<bos>", "<eos>", "<unk>"]
CHARS = list("0123456789=<>/abcdefghijklmnopqrstuvwxyz ")
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}:{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}a:{% endif %}"


DIGITS = list("0123456789=")


def make_model(folder, arch="llama", seed=0, hidden=64, layers=2, chat_template=False, chars=CHARS):
    """A random tiny causal LM and its character tokenizer (``chars`` and 4 special tokens), saved as a
    transformers directory; returns its path."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    vocab = {token: i for i, token in enumerate(SPECIALS + list(chars))}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>", unk_token="<unk>"
    )
    if chat_template:
        fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(folder))
    torch.manual_seed(seed)
    if arch == "gpt2":
        model = GPT2LMHeadModel(
            GPT2Config(
                vocab_size=len(vocab),
                n_embd=hidden,
                n_layer=layers,
                n_head=4,
                n_positions=128,
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
            )
        )
    else:
        model = LlamaForCausalLM(
            LlamaConfig(
                vocab_size=len(vocab),
                hidden_size=hidden,
                intermediate_size=2 * hidden,
                num_hidden_layers=layers,
                num_attention_heads=4,
                num_key_value_heads=4,
                max_position_embeddings=128,
                bos_token_id=1,
                eos_token_id=2,
                pad_token_id=0,
                tie_word_embeddings=True,
            )
        )
    model.save_pretrained(str(folder))
    return str(folder)


def write_reversal(path, lines=500, digits=3, seed=0):
    """``{"prompt": "123=", "answer": "321"}`` lines: reverse a digit string."""
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(lines):
            s = "".join(rng.choice("0123456789") for _ in range(digits))
            f.write(json.dumps({"prompt": s + "=", "answer": s[::-1]}) + "\n")
    return str(path)


def reversal(prompts, completions, answer, **fields):
    """Partial credit: the fraction of positions right, over the longer of answer and completion."""
    return [sum(a == b for a, b in zip(c, t)) / max(len(t), len(c), 1) for c, t in zip(completions, answer)]


def length(prompts, completions, **fields):
    """The completion's length in characters (for checks of what a reward is given)."""
    return [float(len(c)) for c in completions]


def none_and_nan(prompts, completions, **fields):
    return [None, float("nan"), 1.5][: len(completions)]


def infinite(prompts, completions, **fields):
    return [float("inf")] * len(completions)


def text(prompts, completions, **fields):
    return "1.0"


def raises(prompts, completions, **fields):
    raise ZeroDivisionError("a reward that divides by zero")


def wrong_length(prompts, completions, **fields):
    return [0.0] * (len(completions) - 1)


def hangs(prompts, completions, **fields):
    time.sleep(3600)


def dies(prompts, completions, **fields):
    os._exit(3)


def needs_label(prompts, completions, label):
    return [float(c == l) for c, l in zip(completions, label)]


# ---- rewards for the reward workers' tests (called one completion at a time there) ----


def hangs_when_asked(prompts, completions, **fields):
    """Hangs where the line's ``hang`` field is true; else the completion's length."""
    if any(fields.get("hang", ())):
        time.sleep(3600)
    return [float(len(c)) for c in completions]


def raises_when_asked(prompts, completions, **fields):
    """Raises where the line's ``fail`` field is true; else the completion's length."""
    if any(fields.get("fail", ())):
        raise ValueError("asked to fail")
    return [float(len(c)) for c in completions]


def starts_a_child_when_asked(prompts, completions, pid_file, hang, **fields):
    """Appends "its pid, its child's pid" to ``pid_file`` (child 0: none); where ``hang``, first starts
    ``sleep 3600`` and then hangs, else scores 1."""
    import subprocess

    child = subprocess.Popen(["sleep", "3600"]) if hang[0] else None
    with open(pid_file[0], "a") as f:
        f.write(f"{os.getpid()} {child.pid if child else 0}\n")
    if child is not None:
        time.sleep(3600)
    return [1.0] * len(completions)


def half_a_second(prompts, completions, **fields):
    """Sleeps half a second per completion, then scores 1."""
    time.sleep(0.5 * len(completions))
    return [1.0] * len(completions)
