"""Group tasks for GRPO: prompts by position, and the rewards of the completions drawn for them.

Every task answers two questions, both by a prompt's *position* in the run's order of prompts
(see :func:`distrl.data.groups.step_positions`), so that any worker can be handed any prompt:

- ``prompts(positions)``: what the policy is asked (a state for the tasks here, a dataset line for
  a text task, :class:`distrl.tasks.prompts.TextTask`);
- ``rewards(positions, group_size, tokens, texts)``: ``[n, K]`` scores of ``n = B * G`` completions
  (rows grouped by prompt) by the task's K reward functions, combined with ``reward_weights``;
  ``score`` gives them with the seconds each function took and the reward calls that failed but were
  scored (a text task's reward workers), and ``close`` stops what scoring started.

The numeric tasks here answer with one token, an action among ``n_actions``:

- ``toy``: a 4-dim random state, 4 actions, rewards from a small fixed random reward network
  (the shape of the generator/scorer/learner example).
- ``bandit``: a contextual bandit with a known optimum: 8-dim state, 8 actions, reward 1 for the
  action a fixed linear map ranks first, else 0. Optimal mean reward 1, random 1/8.

Both know their optimum, so learning is checkable: ``optimal_reward(states)``.

A text environment (:mod:`distrl.tasks.text_envs`: ``package.module:factory``, ``reasoning_gym/<task>``,
``textarena/<EnvId>``) is a task whose completions are multi-turn episodes, scored by their returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import torch
from torch import nn

from distrl.config import ConfigError, parse_env_kwargs
from distrl.tasks.names import STATE_TASK_NAMES, TEXT_TASK, check_state_task, is_text_env
from distrl.tasks.rewards import RewardScores, RewardSet
from distrl.tasks.streams import KeyedStreams
from distrl.tasks.text_envs import TextEnvTask


class GroupTask(Protocol):
    reward_names: tuple[str, ...]
    """The K rewards of a scored batch. A text environment's first is ``env``: the episodes' returns, which the
    draw records (``GroupSamples.env_return``), so that its ``rewards`` gives the other K - 1."""
    reward_weights: np.ndarray
    """[K] float32: the weights of the reward functions' sum."""

    def prompts(self, positions: np.ndarray) -> Any:
        """The prompts at these positions, in the form the task's policy reads."""
        ...

    def rewards(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        """``[B * G, K]`` float32 scores of the completions ``tokens [B * G, T]`` (or ``texts``)."""
        ...

    def score(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> RewardScores:
        """:meth:`rewards`, with the seconds each reward function took and the calls that failed but were scored
        (a text task's), each named by its prompt (what :func:`distrl.data.groups.score_groups` records)."""
        ...

    def close(self) -> None:
        """Stop what scoring started (a text task's reward worker processes)."""
        ...


class StateTask:
    """A task whose prompt is a random state and whose completion is one token: an action."""

    obs_dim = n_actions = 0
    reward_names: tuple[str, ...] = ("reward",)
    reward_weights = np.ones(1, dtype=np.float32)

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.streams = KeyedStreams(seed, tag=0x57A7E)

    def prompts(self, positions: np.ndarray) -> np.ndarray:
        """``[B, obs_dim]`` float32: position ``j``'s state comes from a stream keyed by (seed, j)."""
        out = np.empty((len(positions), self.obs_dim), dtype=np.float32)
        for i, position in enumerate(positions):
            out[i] = self.streams.at(int(position)).standard_normal(self.obs_dim)
        return out

    def states(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """``n`` fresh states (for evaluation)."""
        return rng.standard_normal((n, self.obs_dim)).astype(np.float32)

    def rewards(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> np.ndarray:
        states = self.prompts(positions)
        actions = tokens[:, :1].reshape(len(positions), group_size)
        return self.action_rewards(states, actions).reshape(-1, 1).astype(np.float32)

    def score(self, positions: np.ndarray, group_size: int, tokens: np.ndarray, texts: Sequence[str]) -> RewardScores:
        """:meth:`rewards`: computed here, they neither fail nor take time worth reporting."""
        return RewardScores(self.rewards(positions, group_size, tokens, texts))

    def close(self) -> None:
        """Nothing to stop."""

    def action_rewards(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        """``states [B, D]``, ``actions [B, G]`` → rewards ``[B, G]``."""
        raise NotImplementedError

    def optimal_reward(self, states: np.ndarray) -> float:
        raise NotImplementedError


class ToyTask(StateTask):
    obs_dim, n_actions = 4, 4

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        generator = torch.Generator().manual_seed(10_000 + seed)
        self.reward_net = nn.Sequential(nn.Linear(self.obs_dim + self.n_actions, 16), nn.Tanh(), nn.Linear(16, 1))
        with torch.no_grad():
            for param in self.reward_net.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.8)

    @torch.inference_mode()
    def _all_rewards(self, states: np.ndarray) -> torch.Tensor:
        """``[B, n_actions]``: the reward of every action for every state."""
        s = torch.as_tensor(states).unsqueeze(1).expand(-1, self.n_actions, -1)
        onehot = torch.eye(self.n_actions).expand(len(states), -1, -1)
        return self.reward_net(torch.cat([s, onehot], dim=-1)).squeeze(-1)

    def action_rewards(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return self._all_rewards(states).gather(1, torch.as_tensor(actions)).numpy()

    def optimal_reward(self, states: np.ndarray) -> float:
        return float(self._all_rewards(states).max(dim=1).values.mean())


class BanditTask(StateTask):
    obs_dim, n_actions = 8, 8

    def __init__(self, seed: int = 0):
        super().__init__(seed)
        self.weights = np.random.default_rng(20_000 + seed).standard_normal((self.obs_dim, self.n_actions))

    def best_actions(self, states: np.ndarray) -> np.ndarray:
        return np.argmax(states @ self.weights, axis=1)

    def action_rewards(self, states: np.ndarray, actions: np.ndarray) -> np.ndarray:
        return (actions == self.best_actions(states)[:, None]).astype(np.float32)

    def optimal_reward(self, states: np.ndarray) -> float:
        return 1.0


STATE_TASKS = dict(zip(STATE_TASK_NAMES, (ToyTask, BanditTask)))


def make_state_task(name: str, seed: int = 0) -> StateTask:
    check_state_task(name)
    return STATE_TASKS[name](seed)


def make_group_task(name: str, cfg: Any, seed: int = 0, env_kwargs: Sequence[str] = ()) -> GroupTask:
    """The task a GRPO run trains on: a numeric task by name, the text task of ``cfg``'s dataset and rewards,
    or a text environment (``env_kwargs``: its ``key=value`` arguments)."""
    from distrl.tasks.prompts import TextTask

    if is_text_env(name):
        if not cfg.model:
            raise ConfigError(
                f"model='' is not allowed with env={name!r}: a text environment is played by a language "
                "model (--model PATH, a directory holding a transformers causal LM)"
            )
        functions = (
            RewardSet(
                cfg.rewards,
                cfg.reward_weights,
                cfg.reward_timeout_s,
                cfg.reward_workers,
                cfg.reward_timeout_policy,
                cfg.reward_error_policy,
                cfg.reward_timeout_score,
            )
            if cfg.rewards
            else None
        )
        kwargs = parse_env_kwargs(env_kwargs)
        return TextEnvTask(name, kwargs, seed, cfg.dataset, functions, cfg.max_turns, cfg.max_turn_tokens)
    if name != TEXT_TASK:
        given = [f"{field}={getattr(cfg, field)!r}" for field in ("model", "dataset", "rewards") if getattr(cfg, field)]
        if given:
            raise ConfigError(
                f"{given[0]} is not allowed with env={name!r}: language-model runs use env "
                f"{TEXT_TASK!r} (distrl train grpo --model PATH --dataset FILE --reward NAME)"
            )
        return make_state_task(name, seed)
    if not cfg.model:
        raise ConfigError(
            f"model='' is not allowed with env={TEXT_TASK!r}: must be a directory holding a "
            "transformers causal LM (--model PATH)"
        )
    return TextTask(
        cfg.dataset,
        cfg.rewards,
        cfg.reward_weights,
        cfg.reward_timeout_s,
        seed,
        cfg.reward_workers,
        cfg.reward_timeout_policy,
        cfg.reward_error_policy,
        cfg.reward_timeout_score,
    )
