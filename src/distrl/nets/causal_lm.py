"""A ``transformers`` causal language model as a group policy, its parameters on distrl's flat buffer.

Any model ``AutoModelForCausalLM`` loads from a local directory works: GPT-2, Llama, Qwen, ... Nothing
is downloaded and no code shipped with a model is run (``local_files_only``, no ``trust_remote_code``:
:mod:`distrl.nets.lm_loading`). The model's parameters become views of one
:class:`~distrl.nets.core.ParamBuffer` (:func:`~distrl.nets.core.bind_module`): float32 master weights, Adam
over the flat buffer, weights sent to generators as one vector, checkpoints in safetensors;
``--precision bf16`` runs the model's arithmetic under bfloat16 autocast.

Sampling runs the model step by step with its KV cache: one pass over the prompts (each prompt once,
its cache then repeated for the G completions), then one token per pass. Each token is drawn by inverse
CDF from a uniform the caller supplies (see :func:`distrl.data.groups.sampling_uniforms`), so the same
weights and the same prompt positions give the same completions in any process. A completion ends at an
EOS token, at a stop string, or at ``max_new_tokens``. Its behaviour log-probabilities are those of
``softmax(logits / temperature)``: the policy the learner recomputes (top-p only narrows the draw).

With :class:`~distrl.nets.lora.LoraSettings` the model is wrapped by peft with a LoRA adapter and only the
adapter's parameters go on the buffer (LoRA mode: :mod:`distrl.nets.lora`); GRPO's reference is then the base
model, the learner's own with its adapter switched off (:class:`BaseModelReference`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any, Literal

import torch

from distrl.config import ConfigError
from distrl.nets.core import ParamBuffer, bind_module
from distrl.nets.distributions import sample_tokens
from distrl.nets.lm_loading import load_causal_lm, load_tokenizer
from distrl.nets.lora import MERGED_DIR, LoraSettings, add_lora, save_merged

Role = Literal["learner", "generator", "reference"]


class PromptEncoder:
    """Prompts (strings, or chat messages) as token ids: the tokenizer's side of a policy."""

    def __init__(self, path: str, tokenizer: Any, chat_template: bool = False, max_prompt_tokens: int = 512):
        self.path, self.tokenizer = path, tokenizer
        self.chat_template, self.max_prompt_tokens = chat_template, max_prompt_tokens

    def render(self, prompt: Any) -> tuple[str, bool]:
        """The text the model reads for ``prompt``; True when a chat template made it."""
        if isinstance(prompt, str) and not self.chat_template:
            return prompt, False
        if not getattr(self.tokenizer, "chat_template", None):
            raise ConfigError(
                f"model={self.path!r}: its tokenizer has no chat template, which chat prompts and --chat-template need"
            )
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else prompt
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False), True

    def ids(self, prompts: Sequence[Any]) -> list[list[int]]:
        rendered = [self.render(p) for p in prompts]
        out: list[list[int]] = [[] for _ in prompts]
        for templated in (False, True):  # a chat template writes its own special tokens; a plain prompt gets
            rows = [i for i, (_, t) in enumerate(rendered) if t == templated]  # the tokenizer's (BOS, ...)
            if rows:
                encoded = self.tokenizer([rendered[i][0] for i in rows], add_special_tokens=not templated)
                for i, ids in zip(rows, encoded["input_ids"]):
                    out[i] = list(ids)
        return out

    def too_long(self, prompts: Sequence[Any]) -> tuple[int, int] | None:
        """(index, length) of the first prompt over ``max_prompt_tokens``, or None."""
        for i, ids in enumerate(self.ids(prompts)):
            if len(ids) > self.max_prompt_tokens:
                return i, len(ids)
        return None

    def encode(self, prompts: Sequence[Any], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids ``[B, P]`` left-padded to the longest prompt, and their mask."""
        ids = self.ids(prompts)
        longest = max(len(i) for i in ids)
        if longest > self.max_prompt_tokens:
            raise ConfigError(
                f"max_prompt_tokens={self.max_prompt_tokens} is not allowed: a prompt has {longest} "
                "tokens, and prompts are never cut"
            )
        return left_pad(ids, pad_id, device)


def left_pad(ids: Sequence[Sequence[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Token id sequences as ``[B, L]`` left-padded to the longest, and the mask of the real tokens."""
    longest = max(len(seq) for seq in ids)
    tokens = torch.full((len(ids), longest), pad_id, dtype=torch.long)
    mask = torch.zeros((len(ids), longest), dtype=torch.bool)
    for row, seq in enumerate(ids):
        if seq:
            tokens[row, longest - len(seq) :] = torch.tensor(seq)
            mask[row, longest - len(seq) :] = True
    return tokens.to(device), mask.to(device)


class CausalLMPolicy:
    """A causal LM that answers prompts with sampled completions; see the module's docstring."""

    def __init__(
        self,
        path: str,
        device: torch.device | str = "cpu",
        *,
        role: Role = "learner",
        bf16: bool = False,
        chat_template: bool = False,
        max_prompt_tokens: int = 512,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_new_tokens: int = 256,
        stop: Sequence[str] = (),
        lora: LoraSettings | None = None,
    ):
        """``role``: a learner's weights live on a parameter buffer with a gradient, a generator's on one
        without (it only receives weights), a reference model's stay where they are, frozen. ``lora``: train
        (or, in a generator, receive) an adapter only; a reference model is the base model and takes none."""
        self.path = path
        self.device = torch.device(device)
        if bf16 and self.device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError(
                "precision='bf16' is not allowed on this GPU: it has no bfloat16 arithmetic; use --precision fp32"
            )
        self.lora = lora if role != "reference" else None
        self.tokenizer = load_tokenizer(path)
        if self.lora is None:
            self.model = load_causal_lm(path, self.device)
        else:  # wrapped on the CPU, where peft draws the adapter from the seeded generator; bound below moves it
            self.model = add_lora(load_causal_lm(path, torch.device("cpu")), self.lora, path)
        if role == "reference":
            self.model.requires_grad_(False)
        self.params: ParamBuffer = (
            bind_module(self.model, self.device, with_grad=role == "learner", trainable_only=self.lora is not None)
            if role != "reference"
            else None
        )  # type: ignore[assignment]
        self._dropouts = [
            module
            for name, module in self.model.named_modules()
            if isinstance(module, torch.nn.Dropout) and ".lora_dropout." in name
        ]
        self._base_checksum: str | None = None
        self.prompts = PromptEncoder(path, self.tokenizer, chat_template, max_prompt_tokens)
        self.bf16 = bf16
        self.temperature, self.top_p, self.max_new_tokens = temperature, top_p, max_new_tokens
        self.stop = tuple(stop)
        eos = {self.tokenizer.eos_token_id}
        configured = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        eos.update(configured if isinstance(configured, (list, tuple)) else [configured])
        self.eos_ids = torch.tensor(sorted(i for i in eos if i is not None), dtype=torch.long, device=self.device)
        pad = self.tokenizer.pad_token_id
        self.pad_id = int(pad if pad is not None else (self.eos_ids[0] if len(self.eos_ids) else 0))

    def _autocast(self) -> AbstractContextManager[Any]:
        return torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.bf16)

    def encode(self, prompts: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
        return self.prompts.encode(prompts, self.pad_id, self.device)

    # ---- sampling ----

    @torch.no_grad()
    def sample(
        self,
        prompt: torch.Tensor,
        prompt_mask: torch.Tensor | None,
        group_size: int,
        uniforms: torch.Tensor | None,
        limits: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """See :class:`~distrl.nets.group_policy.GroupPolicy`; ``limits [B * G]``: each completion's most tokens
        (a turn of a multi-turn episode, :mod:`distrl.nets.multi_turn`), else ``max_new_tokens``."""
        assert prompt_mask is not None
        attention = prompt_mask.long()
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        with self._autocast():
            out = self.model(
                input_ids=prompt, attention_mask=attention, position_ids=positions, use_cache=True, logits_to_keep=1
            )
        cache = out.past_key_values
        if group_size > 1:  # each prompt was read once; its keys and values serve all of its completions
            cache.batch_repeat_interleave(group_size)
        logits = out.logits[:, -1].repeat_interleave(group_size, 0)
        attention = attention.repeat_interleave(group_size, 0)
        next_position = positions[:, -1:].repeat_interleave(group_size, 0) + 1
        n, T = logits.shape[0], self.max_new_tokens if limits is None else int(limits.max())
        tokens = torch.full((n, T), self.pad_id, dtype=torch.long, device=self.device)
        log_probs = torch.zeros((n, T), dtype=torch.float32, device=self.device)
        mask = torch.zeros((n, T), dtype=torch.bool, device=self.device)
        done = torch.zeros(n, dtype=torch.bool, device=self.device)
        ones = torch.ones((n, 1), dtype=attention.dtype, device=self.device)
        width = T
        for t in range(T):
            token, log_prob = sample_tokens(
                logits, None if uniforms is None else uniforms[:, t], self.temperature, self.top_p
            )
            token = token.masked_fill(done, self.pad_id)
            tokens[:, t] = token
            log_probs[:, t] = log_prob.masked_fill(done, 0.0)
            mask[:, t] = ~done
            done = done | torch.isin(token, self.eos_ids)
            if limits is not None:
                done = done | (limits <= t + 1)
            if self.stop:
                done = done | self._stopped(tokens, t, mask[:, t] & ~done)
            if bool(done.all()) or t == T - 1:
                width = t + 1
                break
            attention = torch.cat([attention, ones], 1)
            with self._autocast():
                out = self.model(
                    input_ids=token.unsqueeze(1),
                    attention_mask=attention,
                    position_ids=next_position,
                    past_key_values=cache,
                    use_cache=True,
                )
            next_position = next_position + 1
            logits = out.logits[:, -1]
        return tokens[:, :width], mask[:, :width], log_probs[:, :width]

    def _stopped(self, tokens: torch.Tensor, t: int, active: torch.Tensor) -> torch.Tensor:
        """Rows (of those ``active``) whose completion now contains a stop string."""
        hit = torch.zeros_like(active)
        rows = active.nonzero().flatten().tolist()
        if not rows:
            return hit
        window = max(len(s) for s in self.stop) + 2  # a token holds at least a character
        start = max(0, t + 1 - window)
        tails = self.tokenizer.batch_decode(tokens[rows, start : t + 1].tolist(), skip_special_tokens=True)
        for row, text in zip(rows, tails):
            if any(s in text for s in self.stop):
                hit[row] = True
        return hit

    def decode(self, tokens: torch.Tensor, mask: torch.Tensor) -> tuple[str, ...]:
        rows = [seq[:length] for seq, length in zip(tokens.tolist(), mask.sum(1).tolist())]
        return tuple(self.tokenizer.batch_decode(rows, skip_special_tokens=True))

    # ---- learning ----

    def token_log_probs(
        self, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, tokens: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        """``[n, T]`` log-probabilities of ``tokens`` after ``prompt`` (see :class:`~distrl.nets.group_policy.GroupPolicy`).

        The model runs in eval mode everywhere, so that behaviour and learner log-probabilities are one function;
        LoRA's dropout (``lora_dropout > 0``) is the one exception: it acts in this pass when gradients are
        enabled (the learner's), never in sampling, a reference pass or under ``torch.no_grad``.
        """
        assert prompt_mask is not None
        ids = torch.cat([prompt, tokens], 1)
        attention = torch.cat([prompt_mask, attention], 1).long()
        positions = (attention.cumsum(1) - 1).clamp(min=0)
        T = tokens.shape[1]
        dropout = self._adapter_dropout(ids) if self._dropouts and torch.is_grad_enabled() else nullcontext()
        # logits of the last prompt position and of every completion position but the last
        with dropout, self._autocast():
            logits = self.model(
                input_ids=ids, attention_mask=attention, position_ids=positions, use_cache=False, logits_to_keep=T + 1
            ).logits
        logits = logits[:, :-1].float() / self.temperature
        return logits.gather(-1, tokens.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)

    @contextmanager
    def _adapter_dropout(self, ids: torch.Tensor) -> Iterator[None]:
        """LoRA's dropout switched on for one learner pass. Its masks come from torch's generator seeded by the
        run's seed and the pass's token ids (the global stream is restored after): a resumed run, or any rerun,
        draws the masks the uninterrupted one drew. A batch trained on twice (``max_reuse``) gets the same masks."""
        assert self.lora is not None
        key = hashlib.sha256(str(self.lora.seed).encode() + ids.cpu().numpy().tobytes()).digest()
        with torch.random.fork_rng(devices=[self.device] if self.device.type == "cuda" else []):
            torch.manual_seed(int.from_bytes(key[:8], "little") >> 1)
            for module in self._dropouts:
                module.train()
            try:
                yield
            finally:
                for module in self._dropouts:
                    module.eval()

    def without_adapter(self) -> BaseModelReference:
        """The base model this LoRA policy started from, sharing its weights: GRPO's reference."""
        if self.lora is None:
            raise ValueError("without_adapter() needs a LoRA policy")
        return BaseModelReference(self)

    def total_params(self) -> int:
        """Every parameter of the model, the frozen base weights of a LoRA run included (tied ones once)."""
        return sum(p.numel() for p in self.model.parameters())

    def base_checksum(self) -> str | None:
        """A digest of the frozen base weights (names and bytes) a LoRA adapter trains on; None without LoRA.
        Computed once: they never change."""
        if self.lora is None:
            return None
        if self._base_checksum is None:
            digest = hashlib.sha256()
            for name, p in self.model.named_parameters():
                if name not in self.params.shapes:
                    digest.update(name.encode())
                    digest.update(p.detach().cpu().contiguous().numpy().tobytes())
            self._base_checksum = digest.hexdigest()[:16]
        return self._base_checksum

    def adapter_config(self) -> dict[str, Any] | None:
        """What shapes the adapter: rank, alpha and the layers it wraps (peft's "all-linear" resolved); None
        without LoRA."""
        if self.lora is None:
            return None
        config = self.model.peft_config["default"]
        return {"rank": config.r, "alpha": config.lora_alpha, "target_modules": sorted(config.target_modules)}

    def save_pretrained(self, folder: Path, merge: bool = False) -> None:
        """The model and tokenizer as a transformers directory (``from_pretrained(folder)`` loads it back).

        A LoRA policy writes its adapter in peft's format instead (adapter_config.json and
        adapter_model.safetensors; ``PeftModel.from_pretrained(base_model, folder)`` loads it), and with
        ``merge`` also the base model with the adapter merged into its weights, in ``folder/merged``.
        """
        # the parameters are views of one buffer; safetensors wants tensors of their own
        if self.lora is None:
            state = {name: tensor.detach().clone() for name, tensor in self.model.state_dict().items()}
            self.model.save_pretrained(str(folder), state_dict=state)
        else:
            state = {name: self.params.view(name).detach().cpu().clone() for name in self.params.shapes}
            self.model.save_pretrained(str(folder), state_dict=state, save_embedding_layers=False)
        self.tokenizer.save_pretrained(str(folder))
        if merge and self.lora is not None:
            save_merged(self.path, folder, folder / MERGED_DIR, self.tokenizer)


class BaseModelReference:
    """GRPO's frozen reference in a LoRA run: the learner's own model with its adapter switched off, which is
    the base model the run started from, without a second copy of its weights."""

    params = None

    def __init__(self, learner: CausalLMPolicy):
        self.learner = learner
        self.device = learner.device
        self.max_new_tokens = learner.max_new_tokens

    def token_log_probs(
        self, prompt: torch.Tensor, prompt_mask: torch.Tensor | None, tokens: torch.Tensor, attention: torch.Tensor
    ) -> torch.Tensor:
        """The base model's ``[n, T]`` log-probabilities of ``tokens``, without a gradient."""
        with torch.no_grad(), self.learner.model.disable_adapter():
            return self.learner.token_log_probs(prompt, prompt_mask, tokens, attention)
