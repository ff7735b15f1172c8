"""The C allocator's thresholds for a training process (Linux, glibc): freed memory stays in the process.

torch allocates every CPU tensor with the C library's ``malloc``. glibc hands an allocation above its mmap
threshold (128 KiB to start with) fresh pages from the kernel, and gives the top of its heap back to the
kernel whenever more than its trim threshold lies free there. Both thresholds adjust themselves as a program
runs, and where they settle depends on the order of its allocations: a SAC step on 256-wide layers allocates
and frees a few dozen 256 KiB products, and in some processes every one of them came back as fresh pages,
850 page faults a gradient step, where a process of the same code laid out a little differently had none.
A page fault costs the kernel's time (1.8 s of 12 s on a 2,000-step run) and the step's speed varied by 15%
from process to process with it.

:func:`keep_freed_memory` fixes both thresholds at the largest values glibc's own adjustment reaches (an
mmap threshold of 32 MiB, a trim threshold of twice that), from the start: what a step frees, the next step
reuses, and allocations of 32 MiB or more (a replay buffer's arrays) still come from and go back to the
kernel. The cost is memory that a process freed staying in it, up to 64 MiB at its heap's top.

No torch here: a process can set this before anything is allocated.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for its own adjustment on 64-bit systems
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc sets beside it when it adjusts


def keep_freed_memory() -> bool:
    """Fix glibc's mmap and trim thresholds for this process (see the module); True when glibc took both.

    Elsewhere (macOS, Windows, musl, which ignores them) nothing changes and the answer is False. Once set,
    the thresholds stay fixed for the life of the process."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 - present in glibc only
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
