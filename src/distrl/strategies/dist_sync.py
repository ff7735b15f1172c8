"""The ``Sync`` of a torch.distributed process group, and parameter checksums.

Used by ``ddp`` (every rank) and ``decoupled`` (the trainers' subgroup); kept apart from both so that
neither imports the other for it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

_yield_core = getattr(os, "sched_yield", lambda: time.sleep(0))

SHM_DIR = Path("/dev/shm")
TRANSPORT_VAR = "DISTRL_DDP_TRANSPORT"
"""``gloo`` keeps the gradient sums of one machine's ranks on gloo instead of shared memory."""


class SharedSum:
    """Sums of a flat float buffer among the ranks of one machine, through a shared-memory file.

    Each rank writes its vector into its slot and then bumps its sequence number; each waits
    (polling, yielding the core) until every rank's number has reached this call's, then sums
    the slots in rank order, so every rank gets the same bits. Two sets of slots alternate
    between calls: a rank writes call ``g + 2`` only after every other rank has published
    ``g + 1``, which each does only after reading ``g``. It relies on stores becoming visible in
    program order (x86-64), which is why it is used only there; elsewhere gloo carries the sums.
    A gloo all-reduce costs about 0.7 ms on two local ranks however small the gradient; this
    costs the copies and a wait.
    """

    def __init__(self, path: Path, create: bool, rank: int, world: int, n: int, dtype: np.dtype, timeout_s: float):
        self.rank, self.world, self.n, self.dtype, self.timeout_s = rank, world, n, np.dtype(dtype), timeout_s
        self.seq = np.memmap(path, dtype=np.int64, mode="w+" if create else "r+", shape=(world,))
        self.slots = np.memmap(path, dtype=self.dtype, mode="r+", offset=8 * world, shape=(2, world, n))
        self.calls = 0

    @classmethod
    def usable(cls, device: torch.device, group: Any, world: int) -> bool:
        import platform

        local = int(os.environ.get("LOCAL_WORLD_SIZE", "0"))
        return (
            device.type == "cpu"
            and group is None
            and world > 1
            and local == world
            and SHM_DIR.is_dir()
            and platform.machine() in ("x86_64", "AMD64")
            and os.environ.get(TRANSPORT_VAR, "shm") != "gloo"
        )

    def sum_(self, tensor: torch.Tensor) -> None:
        """Sum the float tensor ``tensor`` (``n`` elements) over the ranks, in place."""
        self.calls += 1
        slots = self.slots[self.calls % 2]
        slots[self.rank] = tensor.numpy()
        self.seq[self.rank] = self.calls  # after the data: others read it once they see this number
        deadline = time.monotonic() + self.timeout_s
        while (self.seq < self.calls).any():
            if time.monotonic() > deadline:
                late = [r for r in range(self.world) if self.seq[r] < self.calls]
                raise RuntimeError(f"rank(s) {late} did not send their gradients within {self.timeout_s:g}s")
            _yield_core()
        tensor.copy_(torch.from_numpy(slots.sum(axis=0)))


class DistributedSync:
    """The ``Sync`` of a torch.distributed process group (gloo on CPU, NCCL on CUDA).

    ``group`` restricts it to a subgroup (the trainers of ``decoupled``); ranks are then
    ranks within the group, and rank 0 of the group is its main worker.
    """

    def __init__(self, device: torch.device, timeout_s: float, group: Any = None):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self._root = dist.get_global_rank(group, 0) if group is not None else 0
        self.device = device
        self.timeout_s = timeout_s
        self._buffer: torch.Tensor | None = None
        self._store: Any = None
        self.sync_s = 0.0
        """Seconds spent in gradient all-reduces (including waiting for slower workers)."""
        # gloo on CPU, one core or more per local rank: poll the collective instead of sleeping on it
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.spin = device.type == "cpu" and local_ranks <= (os.cpu_count() or 1)
        self.shared = SharedSum.usable(device, group, self.world_size)
        """Whether gradient sums go through shared memory (one machine's ranks on CPU; see SharedSum)."""
        self._shared_sum: SharedSum | None = None

    def _all_reduce(self, tensor: torch.Tensor) -> None:
        """Sum ``tensor`` over the group in place.

        On CPU the wait polls the collective and yields the core between polls instead of
        sleeping: on small virtual machines a process that sleeps takes milliseconds to be
        woken when the other rank's data arrives. Measured on 2-core test machines with two
        gloo ranks, a 10k-float all-reduce after 1 ms of other work took 3.1 ms sleeping and
        0.7 ms polling. The collective keeps the group's timeout either way. With more local
        ranks than cores it sleeps, so that a polling rank does not take the core a working
        one needs.
        """
        if self.world_size == 1:  # a sum over one rank: nothing to exchange
            return
        if not self.spin:
            dist.all_reduce(tensor, group=self.group)
            return
        work = dist.all_reduce(tensor, group=self.group, async_op=True)
        while not work.is_completed():
            _yield_core()
        work.wait()

    def gradients(self, grad: torch.Tensor, stats: torch.Tensor) -> None:
        """One all-reduce (sum) of the flat gradient and the statistics, packed in one buffer."""
        if self.world_size == 1:  # already the sum: no packing, no exchange
            return
        n, k = grad.numel(), stats.numel()
        if self._buffer is None or self._buffer.numel() != n + k:
            self._buffer = torch.empty(n + k, dtype=grad.dtype, device=grad.device)
        buffer = self._buffer
        buffer[:n].copy_(grad)
        buffer[n:].copy_(stats)
        start = time.perf_counter()
        if self.shared and buffer.dtype in (torch.float32, torch.float64):
            self._shared(buffer).sum_(buffer)
        else:
            self._all_reduce(buffer)
        self.sync_s += time.perf_counter() - start
        grad.copy_(buffer[:n])
        stats.copy_(buffer[n:])

    def _shared(self, buffer: torch.Tensor) -> SharedSum:
        """The shared-memory sum for buffers like ``buffer``, made collectively on first use.

        Rank 0 creates the file, every rank maps it, and rank 0 removes its name at once: the
        mapping lives on without it, so nothing is left in /dev/shm however the run ends."""
        n, dtype = buffer.numel(), buffer.numpy().dtype
        if self._shared_sum is None or (self._shared_sum.n, self._shared_sum.dtype) != (n, dtype):
            name = [f"distrl-{os.getpid()}-{time.time_ns()}" if self.rank == 0 else None]
            dist.broadcast_object_list(name, self._root, group=self.group)
            path = SHM_DIR / name[0]
            if self.rank == 0:
                self._shared_sum = SharedSum(path, True, 0, self.world_size, n, dtype, self.timeout_s)
            dist.barrier(group=self.group)  # the file exists before the others map it
            if self.rank != 0:
                self._shared_sum = SharedSum(path, False, self.rank, self.world_size, n, dtype, self.timeout_s)
            dist.barrier(group=self.group)  # every rank has mapped it
            if self.rank == 0:
                path.unlink()
        return self._shared_sum

    def all_sum(self, values: np.ndarray) -> np.ndarray:
        tensor = torch.tensor(np.asarray(values, dtype=np.float64), device=self.device)  # a copy: reduced in place
        self._all_reduce(tensor)
        return tensor.cpu().numpy()

    def gather(self, values: np.ndarray, counts: list[int] | None = None) -> list[np.ndarray]:
        values = np.asarray(values, dtype=np.float64)
        if self.world_size == 1:
            return [values.copy()]
        row_shape = values.shape[1:]
        if counts is None:
            sizes = torch.zeros(self.world_size, dtype=torch.float64, device=self.device)
            sizes[self.rank] = len(values)
            dist.all_reduce(sizes, group=self.group)
            counts = [int(c) for c in sizes.tolist()]
        longest = max(counts)
        padded = torch.zeros((max(longest, 1), *row_shape), dtype=torch.float64, device=self.device)
        padded[: len(values)] = torch.from_numpy(values).to(self.device)
        parts = [torch.empty_like(padded) for _ in range(self.world_size)]
        dist.all_gather(parts, padded, group=self.group)
        return [part[:c].cpu().numpy() for part, c in zip(parts, counts)]

    def broadcast_(self, tensor: torch.Tensor) -> None:
        if tensor.device != self.device:
            staged = tensor.to(self.device)
            dist.broadcast(staged, self._root, group=self.group)
            tensor.copy_(staged)
        else:
            dist.broadcast(tensor, self._root, group=self.group)

    def verify_identical(self, tensor: torch.Tensor, what: str) -> None:
        """Fail, naming the ranks, unless ``tensor`` is bit-for-bit alike on every rank."""
        data = tensor.detach().double().flatten()
        weights = torch.arange(1, data.numel() + 1, dtype=torch.float64, device=data.device)
        local = torch.stack([data.sum(), (data * weights).sum(), data.abs().sum()]).to(self.device)
        prints = [torch.empty_like(local) for _ in range(self.world_size)]
        dist.all_gather(prints, local, group=self.group)
        differ = [r for r, p in enumerate(prints) if not torch.equal(p, prints[0])]
        if differ:
            raise RuntimeError(f"{what} differ between rank 0 and rank(s) {differ}")

    # Straggler preemption counts finished workers in the process group's key-value store.
    def _get_store(self) -> Any:
        if self._store is None:
            from torch.distributed import distributed_c10d

            self._store = distributed_c10d._get_default_store()
        return self._store

    def mark_finished(self, tag: int) -> None:
        self._get_store().add(f"distrl/finished/{tag}", 1)

    def count_finished(self, tag: int) -> int:
        return int(self._get_store().add(f"distrl/finished/{tag}", 0))
