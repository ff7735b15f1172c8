"""Numpy arrays and plain values in one ``bytes`` message, for data between distrl's processes.

A message is an 8-byte header length, a JSON header, then the arrays' raw bytes. Reading one
only parses JSON and copies bytes: unlike pickle, nothing in a message can run code.
Values may be arrays, JSON values (numbers, strings, lists, None) and dicts of these.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np

ARRAY = "__array__"  # the key that marks an array in the header: [offset, dtype, shape]


def pack(fields: dict[str, Any]) -> bytes:
    """``fields`` as one message (arrays are copied once, into the message)."""
    arrays: list[bytes] = []
    offset = 0

    def encode(value: Any) -> Any:
        nonlocal offset
        if isinstance(value, np.ndarray):
            raw = np.ascontiguousarray(value).tobytes()
            arrays.append(raw)
            offset += len(raw)
            return {ARRAY: [offset - len(raw), value.dtype.str, list(value.shape)]}
        if isinstance(value, dict):
            return {str(k): encode(v) for k, v in value.items()}
        if isinstance(value, np.generic):
            return value.item()
        return value

    header = json.dumps(encode(fields)).encode()
    return b"".join([len(header).to_bytes(8, "little"), header, *arrays])


def unpack(message: bytes) -> dict[str, Any]:
    """The fields of a :func:`pack` message; its arrays are writable and share one copy of the message."""
    size = int.from_bytes(message[:8], "little")
    header = json.loads(message[8 : 8 + size])
    body = bytearray(message[8 + size :])

    def decode(value: Any) -> Any:
        if isinstance(value, dict):
            if ARRAY in value:
                start, dtype, shape = value[ARRAY]
                count = math.prod(shape)  # Python ints: np.prod took about 10 us per call on a short shape list
                return np.frombuffer(body, np.dtype(dtype), count, start).reshape(shape)
            return {k: decode(v) for k, v in value.items()}
        return value

    return decode(header)
