"""What ``--precision bf16`` costs or saves on this CPU: the Nature CNN's forward and backward on a batch of
Atari frames, float32 against bfloat16 autocast (float32 weights, as distrl runs it), on one thread.

    python benchmarks/bf16_cpu.py                  # 256 frames, 3 rounds of 3 steps each, alternating
    python benchmarks/bf16_cpu.py --batch 32       # DQN's batch

Prints what /proc/cpuinfo says (whether the CPU claims bfloat16 arithmetic), the seconds per step of each
precision in every round, and the ratio of the medians. A bf16 run times one product of each precision as it
starts and says so where bfloat16's is the slower (``distrl.training.precision.bf16_slow_note``).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from distrl.nets.encoders import NatureCNN
from distrl.training.precision import cpu_has_native_bf16


def seconds_per_step(net: torch.nn.Module, frames: torch.Tensor, bf16: bool, steps: int) -> float:
    started = time.perf_counter()
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = net(frames).float().sum()
        out.backward()
    return (time.perf_counter() - started) / steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = NatureCNN((4, 84, 84))
    frames = torch.randint(0, 256, (args.batch, 4, 84, 84), dtype=torch.uint8)  # as stored: uint8 frames
    seconds_per_step(net, frames, False, 1)  # warm-up: oneDNN builds its kernels on the first call
    seconds_per_step(net, frames, True, 1)
    times: dict[str, list[float]] = {"fp32": [], "bf16": []}
    for _ in range(args.rounds):
        for name in times:
            times[name].append(seconds_per_step(net, frames, name == "bf16", args.steps))
    print(f"{platform.processor() or platform.machine()}, torch {torch.__version__}, one thread")
    print(f"native bfloat16 (from /proc/cpuinfo): {cpu_has_native_bf16()}")
    for name, values in times.items():
        print(f"{name}: " + ", ".join(f"{v:.3f}" for v in values) + f" s per step (batch {args.batch})")
    print(f"bf16 / fp32, medians: {statistics.median(times['bf16']) / statistics.median(times['fp32']):.2f}")


if __name__ == "__main__":
    main()
