"""Envs with action masks in each place users put them (importable as ``distrl_maskenvs:Name``).

Every step draws a new random mask; an illegal action raises :class:`IllegalAction`, so a run over these
envs fails the moment any policy, explorer or evaluation takes one. In :class:`MaskedChoiceEnv` the observation
shows the mask, so a policy can also learn which actions pay: a legal action with an even index earns 1, an odd
one 0. In :class:`PickBestEnv` and :class:`NearestFreeCellEnv` the mask is the only way to tell the legal actions
and the return pays for choosing the best of them: how well a policy learns under masks shows in it
(``benchmarks/masks_vs_maskable.py``).
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np


class IllegalAction(RuntimeError):
    pass


class MaskedChoiceEnv(gym.Env):
    """Discrete(n) (or MultiDiscrete(nvec)) choices under a random mask, ``length`` steps per episode.

    ``source``: where the mask is given — "info" (``info["action_mask"]``), "method" (``action_masks()``)
    or "observation" (a Dict observation's ``action_mask`` key). ``bad``: "shape" gives masks one entry
    short, "empty" masks with no legal action (both after the first step).
    """

    def __init__(self, source: str = "info", n: int = 6, nvec: tuple[int, ...] = (), length: int = 20, bad: str = ""):
        self.source, self.length, self.bad = source, length, bad
        self.nvec = tuple(nvec) or (n,)
        self.size = int(sum(self.nvec))
        self.action_space = gym.spaces.MultiDiscrete(list(self.nvec)) if nvec else gym.spaces.Discrete(n)
        view = gym.spaces.Box(0.0, 1.0, (self.size,), np.float32)
        if source == "observation":
            mask = gym.spaces.Box(0, 1, (self.size,), np.int8)
            self.observation_space = gym.spaces.Dict({"observation": view, "action_mask": mask})
        else:
            self.observation_space = view
        self.mask = np.ones(self.size, np.int8)
        self.t = 0
        self.illegal = 0

    def _draw(self) -> None:
        parts = []
        for k in self.nvec:
            part = (self.np_random.random(k) < 0.5).astype(np.int8)
            part[self.np_random.integers(k)] = 1  # at least one legal choice per part
            parts.append(part)
        self.mask = np.concatenate(parts)
        if self.bad == "empty" and self.t > 0:
            self.mask[:] = 0

    def _shown(self) -> np.ndarray:
        return self.mask[:-1] if self.bad == "shape" and self.t > 0 else self.mask

    def _obs(self) -> Any:
        view = self.mask.astype(np.float32)
        return {"observation": view, "action_mask": self._shown()} if self.source == "observation" else view

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self._shown()} if self.source == "info" else {}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), self._info()

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        choices = np.atleast_1d(np.asarray(action, dtype=np.int64))
        offsets = np.concatenate([[0], np.cumsum(self.nvec)[:-1]])
        if not all(self.mask[o + c] for o, c in zip(offsets, choices)):
            raise IllegalAction(f"action {choices.tolist()} under mask {self.mask.tolist()}")
        reward = float(np.mean(choices % 2 == 0))
        self.t += 1
        self._draw()
        return self._obs(), reward, False, self.t >= self.length, self._info()


class MethodMaskEnv(MaskedChoiceEnv):
    """The mask from an ``action_masks()`` method (MaskablePPO's convention)."""

    def action_masks(self) -> np.ndarray:
        return self._shown()


def method_env(**kwargs: Any) -> MaskedChoiceEnv:
    return MethodMaskEnv(source="method", **kwargs)


def observation_env(**kwargs: Any) -> MaskedChoiceEnv:
    return MaskedChoiceEnv(source="observation", **kwargs)


def multi_env(**kwargs: Any) -> MaskedChoiceEnv:
    return MaskedChoiceEnv(source="info", nvec=(3, 4), **kwargs)


class PickBestEnv(gym.Env):
    """A choice among ``n`` options worth ``values`` (the observation), under a random mask the observation does
    not show: ``length`` steps per episode, each paying 1 for the best legal option and 0 for any other, so
    ``length`` at most per episode. The mask is in ``info["action_mask"]``; it is the only way to tell the legal
    options, so the return measures how well a policy learned to rank them, the mask doing the rest."""

    def __init__(self, n: int = 8, length: int = 10):
        self.n, self.length = n, length
        self.action_space = gym.spaces.Discrete(n)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (n,), np.float32)
        self.values = np.zeros(n, np.float32)
        self.mask = np.ones(n, np.int8)
        self.t = 0

    def _draw(self) -> None:
        self.values = self.np_random.random(self.n).astype(np.float32)
        self.mask = (self.np_random.random(self.n) < 0.5).astype(np.int8)
        self.mask[self.np_random.integers(self.n)] = 1  # at least one legal option

    def _info(self) -> dict[str, Any]:
        return {"action_mask": self.mask.copy()}

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self.values.copy(), self._info()

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = int(action)
        if not self.mask[a]:
            raise IllegalAction(f"action {a} under mask {self.mask.tolist()}")
        reward = float(self.values[a] == self.values[self.mask == 1].max())
        self.t += 1
        self._draw()
        return self.values.copy(), reward, False, self.t >= self.length, self._info()


class NearestFreeCellEnv(gym.Env):
    """Move to the free cell of a row of ``n`` nearest a target (the observation: its position scaled to [0, 1]);
    which cells are free is a random mask given by ``action_masks()`` alone. ``length`` steps per episode, each
    paying 1 for the nearest free cell and 0 for any other, so ``length`` at most per episode."""

    def __init__(self, n: int = 8, length: int = 10):
        self.n, self.length = n, length
        self.action_space = gym.spaces.Discrete(n)
        self.observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
        self.target = 0.0
        self.mask = np.ones(n, np.int8)
        self.t = 0

    def _draw(self) -> None:
        self.target = float(self.np_random.random() * (self.n - 1))
        self.mask = (self.np_random.random(self.n) < 0.5).astype(np.int8)
        self.mask[self.np_random.integers(self.n)] = 1  # at least one free cell

    def _obs(self) -> np.ndarray:
        return np.array([self.target / (self.n - 1)], np.float32)

    def action_masks(self) -> np.ndarray:
        return self.mask.copy()

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self.t = 0
        self._draw()
        return self._obs(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        a = int(action)
        if not self.mask[a]:
            raise IllegalAction(f"action {a} under mask {self.mask.tolist()}")
        distance = np.abs(np.arange(self.n) - self.target)
        reward = float(distance[a] == distance[self.mask == 1].min())
        self.t += 1
        self._draw()
        return self._obs(), reward, False, self.t >= self.length, {}
