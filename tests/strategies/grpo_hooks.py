"""GRPO's pipeline source with a hook at every learner step, for the tests that kill, stop or slow its actors."""

import dataclasses

from distrl.strategies.pipeline import PipelineGroups
from distrl.training.group import train_grpo
from distrl.training.presets import algo_configs


class HookedGroups(PipelineGroups):
    """``hook(source, version)`` runs before each batch is taken, and with ``version=None`` once the generations
    under way at the end are drained (the actors still alive)."""

    def __init__(self, trainer, strategy, engine, hook):
        super().__init__(trainer, strategy, engine)
        self.hook = hook

    def next_batch(self, version):
        self.hook(self, version)
        return super().next_batch(version)

    def finish(self):
        out = super().finish()
        self.hook(self, None)
        return out


def train_bandit(engine, strategy, hook=lambda source, version: None, **changes):
    """GRPO on the bandit (its preset, then ``changes``) through the pipeline on ``engine``; returns its summary."""
    run, cfg, _ = algo_configs("grpo", "bandit", run={"quiet": True})
    cfg = dataclasses.replace(cfg, **changes)
    return train_grpo(
        run, cfg, None, strategy=strategy, source_factory=lambda trainer: HookedGroups(trainer, strategy, engine, hook)
    )
