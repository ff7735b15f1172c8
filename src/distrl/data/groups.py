"""Groups of samples for group-relative training: G completions per prompt, and the randomness that draws them.

A :class:`GroupSamples` holds ``n = B * G`` completions whose rows are grouped by prompt (prompt
``i``'s samples are rows ``i * G .. i * G + G - 1``). Every array is numpy, so a batch travels
between processes as it is; :meth:`GroupSamples.concat` pads batches drawn separately into one.

Which prompts a step trains on, and the uniforms that sample each token, depend only on a prompt's
*position* in the run's global order of prompts, never on which worker or generator drew it. That
is what makes ``ddp``, ``pipeline`` and ``single`` draw identical completions from identical weights.

On a text environment's task (:mod:`distrl.tasks.text_envs`) a completion is a multi-turn episode
(:mod:`distrl.nets.multi_turn`): the model's turns with the environment's answers between them, its return
recorded with it (``env_return``) and scored as the task's first reward, ``env``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from distrl.nets.causal_lm import CausalLMPolicy
from distrl.nets.group_policy import GroupPolicy
from distrl.nets.multi_turn import play_episodes
from distrl.tasks.group import GroupTask
from distrl.tasks.rewards import RewardFailure
from distrl.tasks.streams import KeyedStreams
from distrl.tasks.text_envs import TextEnvTask


@dataclass(frozen=True)
class GroupSamples:
    """``n`` completions, grouped by prompt.

    The prompt's form is the policy's: token ids left-padded to ``[n, P]`` with ``prompt_mask``, or a
    state ``[n, D]`` (group tasks) with no mask. Completions are right-padded token ids.
    """

    positions: np.ndarray
    """[B] int64: each prompt's position in the run's order of prompts."""
    group_size: int
    """G: completions per prompt."""
    prompt: np.ndarray
    """[n, P] int64 token ids (left-padded) or [n, D] float32 states."""
    prompt_mask: np.ndarray | None
    """[n, P] bool: real prompt tokens; None for states."""
    tokens: np.ndarray
    """[n, T] int64 completion tokens (right-padded)."""
    mask: np.ndarray
    """[n, T] bool: the model's tokens, the ending EOS included: the tokens that carry log-probs and loss."""
    log_probs: np.ndarray
    """[n, T] float32: each token's log-probability under the policy that drew it (0 on padding)."""
    version: np.ndarray
    """[n] int64: the policy version that drew each completion."""
    texts: tuple[str, ...] = ()
    """Decoded completions (text tasks), for rewards and the samples log."""
    rewards: np.ndarray | None = None
    """[n, K] float32: each reward function's score, once scored."""
    reward: np.ndarray | None = None
    """[n] float32: the weighted sum of ``rewards``."""
    attention: np.ndarray | None = None
    """[n, T] bool: every real completion token, the model's and (in multi-turn episodes) the environment's
    answers between its turns; None when the completion is the model's alone (then ``mask``)."""
    env_return: np.ndarray | None = None
    """[n] float32: each episode's return (the sum of its rewards), when the completions are episodes of a text
    environment; their first reward once scored."""
    turns: np.ndarray | None = None
    """[n] int64: the model's turns in each episode (text environments)."""
    reward_seconds: np.ndarray | None = None
    """[n, K] float32: seconds each reward function took per completion, once scored (None: not timed)."""
    reward_failures: tuple[RewardFailure, ...] = ()
    """The reward calls that timed out or failed and were scored ``reward_timeout_score`` instead, by row,
    each naming its reward and the prompt's dataset line."""

    @property
    def visible(self) -> np.ndarray:
        """[n, T] bool: the completion tokens a forward pass attends to (``attention``, else ``mask``)."""
        return self.mask if self.attention is None else self.attention

    @property
    def size(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def prompts(self) -> int:
        return len(self.positions)

    def lengths(self) -> np.ndarray:
        """[n] tokens per completion, the environment's included."""
        return self.visible.sum(axis=1)

    def episode_figures(self) -> dict[str, float]:
        """Means over the episodes of a text environment (none otherwise): model turns, the environment's tokens
        and the model's."""
        if self.turns is None:
            return {}
        model = self.mask.sum(axis=1)
        return {
            "episodes/turns": float(self.turns.mean()),
            "episodes/env_tokens": float((self.lengths() - model).mean()),
            "episodes/model_tokens": float(model.mean()),
        }

    def scored(self, rewards: np.ndarray, weights: np.ndarray) -> GroupSamples:
        """These samples with per-function ``rewards [n, K]`` and their sum weighted by ``weights [K]``."""
        rewards = np.asarray(rewards, dtype=np.float32).reshape(self.size, -1)
        return dataclasses.replace(self, rewards=rewards, reward=rewards @ np.asarray(weights, dtype=np.float32))

    @staticmethod
    def concat(parts: list[GroupSamples]) -> GroupSamples:
        """One batch of several: prompts left-padded and completions right-padded to the longest."""
        if len(parts) == 1:
            return parts[0]
        first = parts[0]
        width = max(p.tokens.shape[1] for p in parts)
        tokens = np.concatenate([_pad_right(p.tokens, width, 0) for p in parts])
        mask = np.concatenate([_pad_right(p.mask, width, False) for p in parts])
        log_probs = np.concatenate([_pad_right(p.log_probs, width, 0.0) for p in parts])
        if first.prompt_mask is None:
            prompt, prompt_mask = np.concatenate([p.prompt for p in parts]), None
        else:
            p_width = max(p.prompt.shape[1] for p in parts)
            prompt = np.concatenate([_pad_left(p.prompt, p_width, 0) for p in parts])
            prompt_mask = np.concatenate([_pad_left(p.prompt_mask, p_width, False) for p in parts])  # type: ignore[arg-type]
        scored = all(p.rewards is not None for p in parts)
        multi_turn = any(p.attention is not None for p in parts)
        episodes = all(p.env_return is not None for p in parts)
        timed = all(p.reward_seconds is not None for p in parts)
        starts = np.cumsum([0] + [p.size for p in parts[:-1]]).tolist()
        return GroupSamples(
            positions=np.concatenate([p.positions for p in parts]),
            group_size=first.group_size,
            prompt=prompt,
            prompt_mask=prompt_mask,
            tokens=tokens,
            mask=mask,
            log_probs=log_probs,
            version=np.concatenate([p.version for p in parts]),
            texts=tuple(t for p in parts for t in p.texts),
            rewards=np.concatenate([p.rewards for p in parts]) if scored else None,  # type: ignore[misc]
            reward=np.concatenate([p.reward for p in parts]) if scored else None,
            attention=np.concatenate([_pad_right(p.visible, width, False) for p in parts]) if multi_turn else None,
            env_return=np.concatenate([p.env_return for p in parts]) if episodes else None,  # type: ignore[misc]
            turns=np.concatenate([p.turns for p in parts]) if episodes else None,  # type: ignore[misc]
            reward_seconds=np.concatenate([p.reward_seconds for p in parts]) if timed else None,  # type: ignore[misc]
            reward_failures=tuple(f.moved(start) for p, start in zip(parts, starts) for f in p.reward_failures),
        )  # type: ignore[misc]

    def split(self, prompts_per_part: int) -> list[GroupSamples]:
        """Consecutive parts of ``prompts_per_part`` prompts each (whole groups)."""
        out = []
        G = self.group_size
        for start in range(0, self.prompts, prompts_per_part):
            stop = min(start + prompts_per_part, self.prompts)
            out.append(self.rows(slice(start * G, stop * G), slice(start, stop)))
        return out

    def rows(self, rows: slice, prompts: slice | None = None) -> GroupSamples:
        """Completions ``rows`` (and, for whole groups, prompts ``prompts``), trimmed to their longest completion."""
        width = max(1, int(self.visible[rows].sum(axis=1).max(initial=0)))
        first, stop, _ = rows.indices(self.size)
        return GroupSamples(
            positions=self.positions[prompts] if prompts is not None else self.positions[:0],
            group_size=self.group_size,
            prompt=self.prompt[rows],
            prompt_mask=None if self.prompt_mask is None else self.prompt_mask[rows],
            tokens=self.tokens[rows, :width],
            mask=self.mask[rows, :width],
            log_probs=self.log_probs[rows, :width],
            version=self.version[rows],
            texts=self.texts[rows] if self.texts else (),
            rewards=None if self.rewards is None else self.rewards[rows],
            reward=None if self.reward is None else self.reward[rows],
            attention=None if self.attention is None else self.attention[rows, :width],
            env_return=None if self.env_return is None else self.env_return[rows],
            turns=None if self.turns is None else self.turns[rows],
            reward_seconds=None if self.reward_seconds is None else self.reward_seconds[rows],
            reward_failures=tuple(f.moved(-first) for f in self.reward_failures if first <= f.index < stop),
        )

    def to_torch(self, device: torch.device) -> dict[str, Any]:
        """The arrays a forward pass reads, as tensors on ``device``."""
        out: dict[str, Any] = {
            "prompt": torch.from_numpy(self.prompt).to(device),
            "tokens": torch.from_numpy(self.tokens).to(device),
            "mask": torch.from_numpy(self.mask).to(device),
            "attention": torch.from_numpy(self.visible).to(device),
        }
        out["prompt_mask"] = None if self.prompt_mask is None else torch.from_numpy(self.prompt_mask).to(device)
        return out


def _pad_right(a: np.ndarray, width: int, value: Any) -> np.ndarray:
    if a.shape[1] == width:
        return a
    return np.concatenate([a, np.full((a.shape[0], width - a.shape[1]), value, dtype=a.dtype)], axis=1)


def _pad_left(a: np.ndarray, width: int, value: Any) -> np.ndarray:
    if a.shape[1] == width:
        return a
    return np.concatenate([np.full((a.shape[0], width - a.shape[1]), value, dtype=a.dtype), a], axis=1)


def step_positions(step: int, prompts_per_step: int, rank: int = 0, world_size: int = 1) -> np.ndarray:
    """The positions of the prompts worker ``rank`` of ``world_size`` draws at learner step ``step``.

    A step covers ``prompts_per_step * world_size`` consecutive positions; each worker takes its own
    contiguous share, so the union over workers is exactly what one process with the global batch
    draws.
    """
    start = (step * world_size + rank) * prompts_per_step
    return np.arange(start, start + prompts_per_step, dtype=np.int64)


UNIFORMS_TAG = 0x6E0


def sampling_uniforms(seed: int, positions: np.ndarray, group_size: int, max_new_tokens: int) -> np.ndarray:
    """``[B * G, max_new_tokens]`` uniforms in [0, 1): the draw of every token of every completion.

    Prompt position ``j`` has its own stream, keyed by ``(seed, j)``, so the uniforms of a completion
    do not depend on how prompts are split over workers, generators or requests.
    """
    streams = KeyedStreams(seed, UNIFORMS_TAG)
    out = np.empty((len(positions) * group_size, max_new_tokens), dtype=np.float64)
    for i, position in enumerate(positions):
        out[i * group_size : (i + 1) * group_size] = streams.at(int(position)).random((group_size, max_new_tokens))
    return out


def draw_groups(
    task: GroupTask,
    policy: GroupPolicy,
    positions: np.ndarray,
    group_size: int,
    seed: int,
    version: int,
    greedy: bool = False,
) -> GroupSamples:
    """``group_size`` completions of ``policy`` (at ``version``) for the task's prompts at ``positions``
    (episodes, on a text environment's task)."""
    uniforms = None
    if not greedy:
        drawn = sampling_uniforms(seed, positions, group_size, policy.max_new_tokens)
        uniforms = torch.from_numpy(drawn).to(policy.device, torch.float32)
    if isinstance(task, TextEnvTask):
        assert isinstance(policy, CausalLMPolicy), "a text environment's task is played by a language model"
        return draw_episodes(task, policy, positions, group_size, version, uniforms)
    prompt, prompt_mask = policy.encode(task.prompts(positions))
    tokens, mask, log_probs = policy.sample(prompt, prompt_mask, group_size, uniforms)
    n = len(tokens)
    return GroupSamples(
        positions=np.asarray(positions, dtype=np.int64),
        group_size=group_size,
        prompt=prompt.repeat_interleave(group_size, 0).cpu().numpy(),
        prompt_mask=None if prompt_mask is None else prompt_mask.repeat_interleave(group_size, 0).cpu().numpy(),
        tokens=tokens.cpu().numpy(),
        mask=mask.cpu().numpy(),
        log_probs=log_probs.cpu().numpy(),
        version=np.full(n, version, dtype=np.int64),
        texts=policy.decode(tokens, mask),
    )


def draw_episodes(
    task: TextEnvTask,
    policy: CausalLMPolicy,
    positions: np.ndarray,
    group_size: int,
    version: int,
    uniforms: torch.Tensor | None,
) -> GroupSamples:
    """``group_size`` episodes per row at ``positions`` of the task's environment; ``uniforms`` as
    :func:`sampling_uniforms` draws them (None: greedy). ``texts`` are the transcripts."""
    envs, first = task.start(positions, group_size)
    played = play_episodes(policy, envs, first, uniforms, task.max_turns, task.max_turn_tokens)
    return GroupSamples(
        positions=np.asarray(positions, dtype=np.int64),
        group_size=group_size,
        prompt=played.prompt.cpu().numpy(),
        prompt_mask=played.prompt_mask.cpu().numpy(),
        tokens=played.tokens.cpu().numpy(),
        mask=played.mask.cpu().numpy(),
        log_probs=played.log_probs.cpu().numpy(),
        version=np.full(len(envs), version, dtype=np.int64),
        texts=policy.decode(played.tokens, played.attention),
        attention=played.attention.cpu().numpy(),
        env_return=played.returns,
        turns=played.turns,
    )


def score_groups(task: GroupTask, samples: GroupSamples) -> GroupSamples:
    """``samples`` with the task's rewards (per function, and their weighted sum); episodes' returns first. The
    seconds the reward functions took and the calls that failed but were scored go with them."""
    scored = task.score(samples.positions, samples.group_size, samples.tokens, samples.texts)
    rewards, seconds = scored.scores, scored.seconds
    if samples.env_return is not None:
        n = len(samples.env_return)
        rewards = np.concatenate([samples.env_return.reshape(-1, 1), rewards.reshape(n, -1)], 1)
        if seconds is not None:  # the returns were recorded by the draw: no time of the scorer's
            seconds = np.concatenate([np.zeros((n, 1), np.float32), seconds.reshape(n, -1)], 1)
    out = samples.scored(rewards, task.reward_weights)
    return dataclasses.replace(out, reward_seconds=seconds, reward_failures=scored.failures)
