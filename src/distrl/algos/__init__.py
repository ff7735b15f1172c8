"""Algorithm math: losses, advantages and one update from a batch.

Nothing here imports torch.distributed or ray; strategies pass in a ``Sync``.
"""
