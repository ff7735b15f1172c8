"""Environments whose step costs wall time but little CPU, for the benchmarks that scale actors.

    distrl train dqn slow_envs:SleepyCartPole --env-kwargs step_ms=4 ...   # run from benchmarks/

A remote simulator (a game server, a robot, a physics engine on another machine) keeps an actor waiting
without keeping its core busy: on 2 cores, 8 such actors can all make progress, where 8 CPU-bound ones
could not. The Ray actors import this module by name, so ``benchmarks/`` must be on their ``PYTHONPATH``
(Ray's workers inherit the driver's environment).
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium as gym


class SleepyCartPole(gym.Wrapper):
    """CartPole-v1 (its 500-step limit included) whose every ``step`` also sleeps ``step_ms`` milliseconds."""

    def __init__(self, step_ms: float = 4.0):
        if step_ms < 0:
            raise ValueError(f"step_ms={step_ms}: must be >= 0 milliseconds")
        super().__init__(gym.make("CartPole-v1"))
        self.step_s = step_ms / 1000.0

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        time.sleep(self.step_s)  # the simulator's round trip: wall time, no CPU
        return self.env.step(action)
