"""A module that leaves a marker file when it is imported (path in $DISTRL_TEST_MARKER): tests use it
to show that loading someone else's run imports nothing its config names unless told to."""

import os
from pathlib import Path

import gymnasium as gym

if os.environ.get("DISTRL_TEST_MARKER"):
    Path(os.environ["DISTRL_TEST_MARKER"]).write_text("imported\n")


def make_env() -> gym.Env:
    return gym.make("CartPole-v1")


def wrap(env: gym.Env) -> gym.Env:
    return env


def net(observation_space, action_space, config):  # noqa: ANN001, ANN201
    raise RuntimeError("distrl_marker.net is never meant to build a network")
