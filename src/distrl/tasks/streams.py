"""Random streams keyed by a position, cheap enough to open one per prompt.

Group tasks draw a prompt's state and every token's uniform from a stream of its own, keyed by the
prompt's position in the run, so that what a worker draws does not depend on which prompts it was
handed. Opening a numpy generator per key costs 15-20 us (seeding hashes the key); a step of the
numeric tasks opens a few hundred, which made the synchronous loop 40% slower. :class:`KeyedStreams`
keeps one Philox generator and sets its key and counter instead (about 3 us).
"""

from __future__ import annotations

import numpy as np


class KeyedStreams:
    """Philox streams keyed by ``(seed, key)``; ``tag`` separates the streams of different uses."""

    def __init__(self, seed: int, tag: int):
        self._key = np.array([seed, 0], dtype=np.uint64)
        # the tag sits in the counter's top word: streams of different tags start 2**192 draws apart
        self._counter = np.array([0, 0, 0, tag], dtype=np.uint64)
        self._bits = np.random.Philox(key=self._key)
        self._generator = np.random.Generator(self._bits)

    def at(self, key: int) -> np.random.Generator:
        """The generator at the start of stream ``key`` (the same object, re-keyed: use it before the next call)."""
        self._key[1] = key
        self._bits.state = {
            "bit_generator": "Philox",
            "state": {"counter": self._counter, "key": self._key},
            "buffer": np.zeros(4, dtype=np.uint64),
            "buffer_pos": 4,
            "has_uint32": 0,
            "uinteger": 0,
        }
        return self._generator
