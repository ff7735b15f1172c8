"""CartPole that makes one member of a PBT study crash once, midway through an interval, for the restart test.

``make_env(marker, crash_step)``: an environment reset with a seed in [crash_step, crash_step + 1000) (a
training environment of a segment that starts at that step: distrl seeds them seed + step + index, and
evaluation environments a million higher) raises at its 40th step if the file ``marker`` can still be
created. The first environment to get there crashes its member, and none ever does again. The settings come as
env arguments, not environment variables, so that they reach Ray workers however Ray was started.
"""

import os

import gymnasium as gym


class CrashOnce(gym.Wrapper):
    def __init__(self, env: gym.Env, marker: str, crash_step: int):
        super().__init__(env)
        self.marker, self.crash_step = marker, crash_step
        self.armed_steps = -1

    def reset(self, *, seed=None, options=None):  # noqa: ANN001, ANN201
        if seed is not None:
            self.armed_steps = 0 if self.crash_step <= seed < self.crash_step + 1000 else -1
        return self.env.reset(seed=seed, options=options)

    def step(self, action):  # noqa: ANN001, ANN201
        if self.armed_steps >= 0:
            self.armed_steps += 1
            if self.armed_steps == 40 and self._first_crash():
                raise RuntimeError("the test's environment crashes once")
        return self.env.step(action)

    def _first_crash(self) -> bool:
        try:
            os.close(os.open(self.marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True


def make_env(marker: str, crash_step: int) -> gym.Env:
    return CrashOnce(gym.make("CartPole-v1"), marker, crash_step)
