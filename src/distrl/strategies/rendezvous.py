"""Where a process group meets: the port of rank 0's store, held from the moment it is chosen."""

from __future__ import annotations

import socket

STORE_FD = "DISTRL_STORE_FD"
"""Set on rank 0 by a launcher that bound the group's store socket itself: its file descriptor, which rank 0's store
listens on. A port found free and bound only later by rank 0 can be taken in between by any process on the host (an
outgoing connection draws its port from the same range), and the run then fails at its start on EADDRINUSE."""


def store_socket(host: str = "127.0.0.1") -> socket.socket:
    """A TCP socket bound to a free port of ``host`` and listening: rank 0's store serves on it (STORE_FD), so the
    port is held from the moment it is chosen; ranks that connect early wait in its backlog."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((host, 0))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock
