"""Data: rollouts, episodes and transitions, replay buffers (prioritised, versioned), collectors, running
normalisers, group batches for GRPO and the messages that carry them between processes.

Imports: :mod:`distrl.nets` (acting), :mod:`distrl.envs`, :mod:`distrl.tasks`, :mod:`distrl.config`; never
algos, training, strategies or cli.
"""
