"""What a checkpoint costs to write and to load since it records and checks its tensor file's sha256.

    python benchmarks/checkpoint_cost.py            # 4 MB and 400 MB of float32, 5 repeats each

For each size: ``checkpoint.save`` (which hashes the file it wrote), ``checkpoint.load`` (which hashes it again
before reading), and the hash alone, as medians in milliseconds; the share of the hash in each is the cost of
the digest. Files go to a temporary directory on the same disk as the system's temp dir.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch

from distrl.run import checkpoint
from harness import markdown_table


def timed(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, nargs="+", default=[4, 400])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for mb in args.mb:
            tensors = {"params/w": torch.randn(mb * 2**20 // 4)}
            path = Path(tmp) / f"step-{mb}"
            save_ms = timed(lambda: checkpoint.save(path, tensors, {"steps": 1}), args.repeats)  # noqa: B023
            load_ms = timed(lambda: checkpoint.load(path), args.repeats)  # noqa: B023
            hash_ms = timed(lambda: checkpoint.sha256_of(path / checkpoint.TENSORS), args.repeats)  # noqa: B023
            rows.append(
                [
                    f"{mb} MB",
                    f"{save_ms:.1f}",
                    f"{load_ms:.1f}",
                    f"{hash_ms:.1f}",
                    f"{100 * hash_ms / save_ms:.0f}%",
                    f"{100 * hash_ms / load_ms:.0f}%",
                ]
            )
    header = ["tensors", "save ms", "load ms", "sha256 ms", "hash share of save", "hash share of load"]
    print("\n".join(markdown_table(header, rows)))


if __name__ == "__main__":
    main()
