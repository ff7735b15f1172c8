"""A network factory that fails, for the tuning study's crashed-trial test."""


def crashing_policy(observation_space, action_space, config):
    raise RuntimeError("the test's network factory fails")
