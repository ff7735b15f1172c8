"""Multi-turn episodes of a causal LM in text environments, token in and token out.

An episode's completion row is ``[model turn 1][env answer 1][model turn 2]...``, after its prompt (the first
observation, rendered as :class:`~distrl.nets.causal_lm.PromptEncoder` renders any prompt). The model's tokens
are the ones it drew: a turn is decoded to text only to hand it to ``env.step``, never tokenised again (decoding
and encoding need not give the same ids back, and the learner must score the ids that were drawn). Each answer
of the environment is tokenised once, when it arrives, and appended:

- plain text: ``tokenizer(text, add_special_tokens=False)``;
- chat messages (or text, with ``--chat-template``: one user message): the tokens the chat template adds for
  them, the difference between the template applied to a fixed two-message conversation (user, assistant) with
  and without the new messages, ``add_generation_prompt=True`` (so the text ends where the model's next turn
  starts). The end of the model's own turn is its EOS; what a template writes after the EOS of an assistant
  message (a newline, say) is left out, as it is in the fixed conversation.

A turn ends at EOS, at a stop string or after ``max_turn_tokens``; the episode ends when the environment says
terminated or truncated, after ``max_turns`` turns, or when the model has drawn ``max_new_tokens`` tokens in all.
The environment's answer to the last turn is not appended: nothing follows it to learn from.

``mask`` marks the model's tokens (they carry the loss and the behaviour log-probabilities), ``attention`` every
real token. The model's tokens of a completion take that completion's uniforms in order (uniform ``k`` draws
its ``k``-th model token), so draws stay keyed by prompt position whatever the turns look like. The model's
turns of all episodes still under way are drawn together: each turn, every such episode's context (its prompt
and its completion so far) is left-padded into one batch that :meth:`CausalLMPolicy.sample` reads once and
continues with its KV cache, one token per forward pass for all of them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch

from distrl.config import ConfigError
from distrl.nets.causal_lm import CausalLMPolicy, PromptEncoder, left_pad
from distrl.tasks.text_envs import Observation, Transition

CONVERSATION = [{"role": "user", "content": "1"}, {"role": "assistant", "content": "2"}]
"""The fixed conversation an environment's chat messages are rendered after (see the module's docstring)."""


class TurnEnv(Protocol):
    """An environment as an episode plays it: checked answers (:class:`~distrl.tasks.text_envs.CheckedEnv`)."""

    def step(self, model_turn: str) -> Transition: ...


class Episodes(NamedTuple):
    """``n`` episodes: prompts left-padded, completions right-padded (torch, on the policy's device)."""

    prompt: torch.Tensor
    """[n, P] int64: each episode's first observation."""
    prompt_mask: torch.Tensor
    """[n, P] bool."""
    tokens: torch.Tensor
    """[n, T] int64: the model's turns and the environment's answers, in order."""
    mask: torch.Tensor
    """[n, T] bool: the model's tokens."""
    attention: torch.Tensor
    """[n, T] bool: every real token."""
    log_probs: torch.Tensor
    """[n, T] float32: the behaviour log-probability of each model token (0 elsewhere)."""
    returns: np.ndarray
    """[n] float32: the sum of each episode's rewards."""
    turns: np.ndarray
    """[n] int64: the model's turns in each episode."""


class AnswerTokens:
    """An environment's answers as token ids (see the module's docstring)."""

    def __init__(self, prompts: PromptEncoder):
        self.prompts = prompts
        self.tokenizer = prompts.tokenizer
        self._before: str | None = None

    def ids(self, observation: Observation) -> list[int]:
        if isinstance(observation, str) and not self.prompts.chat_template:
            return list(self.tokenizer(observation, add_special_tokens=False)["input_ids"])
        messages = [{"role": "user", "content": observation}] if isinstance(observation, str) else observation
        if not messages:
            return []
        self.prompts.render(messages)  # a one-line error when the tokenizer has no chat template
        before = self._before
        if before is None:
            before = self._before = self._template(CONVERSATION, False)
        after = self._template([*CONVERSATION, *messages], True)
        if not after.startswith(before):
            raise ConfigError(
                f"model={self.prompts.path!r}: its chat template renders a conversation differently once messages "
                "follow it, so an environment's answers cannot be appended as tokens: use plain-text observations"
            )
        return list(self.tokenizer(after[len(before) :], add_special_tokens=False)["input_ids"])

    def _template(self, messages: list[dict[str, str]], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)


@torch.no_grad()
def play_episodes(
    policy: CausalLMPolicy,
    envs: Sequence[TurnEnv],
    first: Sequence[Observation],
    uniforms: torch.Tensor | None,
    max_turns: int,
    max_turn_tokens: int = 0,
) -> Episodes:
    """Play one episode in each of ``envs``, started with the observations ``first``.

    ``uniforms [n, max_new_tokens]`` draw the model's tokens (None: greedy); ``max_turn_tokens`` bounds a turn
    (0: ``policy.max_new_tokens``, which bounds the model's tokens over the whole episode).
    """
    n, budget = len(envs), policy.max_new_tokens
    per_turn = min(max_turn_tokens or budget, budget)
    prompt, prompt_mask = policy.encode(first)
    contexts = [row[keep].tolist() for row, keep in zip(prompt.cpu(), prompt_mask.cpu())]
    answers = AnswerTokens(policy.prompts)
    completion: list[list[int]] = [[] for _ in range(n)]
    by_model: list[list[bool]] = [[] for _ in range(n)]
    behaviour: list[list[float]] = [[] for _ in range(n)]
    drawn = torch.zeros(n, dtype=torch.long)
    returns = np.zeros(n, dtype=np.float32)
    turns = np.zeros(n, dtype=np.int64)
    active = list(range(n))
    while active:
        ids, ids_mask = left_pad([contexts[r] + completion[r] for r in active], policy.pad_id, policy.device)
        limits = (budget - drawn[active]).clamp(max=per_turn)
        turn_uniforms = None
        if uniforms is not None:  # model token k of episode r takes uniforms[r, k]
            index = (drawn[active, None] + torch.arange(int(limits.max()))).clamp(max=budget - 1)
            turn_uniforms = uniforms[active].gather(1, index.to(uniforms.device))
        drawn_turn = policy.sample(ids, ids_mask, 1, turn_uniforms, limits.to(policy.device))
        tokens, valid, log_probs = (x.cpu() for x in drawn_turn)  # one copy per turn, not one per episode
        going = []
        for i, r in enumerate(active):
            length = int(valid[i].sum())
            turn = tokens[i, :length].tolist()
            completion[r] += turn
            by_model[r] += [True] * length
            behaviour[r] += log_probs[i, :length].tolist()
            drawn[r] += length
            turns[r] += 1
            answer = envs[r].step(policy.tokenizer.decode(turn, skip_special_tokens=True))
            returns[r] += answer.reward
            if answer.terminated or answer.truncated or turns[r] >= max_turns or int(drawn[r]) >= budget:
                continue
            reply = answers.ids(answer.observation)
            completion[r] += reply
            by_model[r] += [False] * len(reply)
            behaviour[r] += [0.0] * len(reply)
            going.append(r)
        active = going
    return Episodes(
        prompt,
        prompt_mask,
        _right_padded(completion, policy.pad_id, torch.long, policy.device),
        _right_padded(by_model, False, torch.bool, policy.device),
        _right_padded([[True] * len(c) for c in completion], False, torch.bool, policy.device),
        _right_padded(behaviour, 0.0, torch.float32, policy.device),
        returns,
        turns,
    )


def _right_padded(rows: list[list[Any]], value: Any, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    width = max(1, max(len(row) for row in rows))
    out = torch.full((len(rows), width), value, dtype=dtype)
    for i, row in enumerate(rows):
        out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out.to(device)
