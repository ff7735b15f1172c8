"""Algorithm math: one file per algorithm with its plain loss and its update from a batch, the return and
advantage estimators as pure functions, optimizers, and the ``Sync`` protocol (``protocols``) through which
a strategy makes an update agree with the other workers.

Imports: :mod:`distrl.data`, :mod:`distrl.nets`, :mod:`distrl.config`, torch. Never torch.distributed or ray
(a test enforces it), never training, strategies or cli.
"""
