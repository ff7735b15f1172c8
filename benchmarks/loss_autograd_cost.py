"""What taking PPO's loss gradient from autograd costs per minibatch, on one CPU thread.

    python benchmarks/loss_autograd_cost.py              # B=256, CartPole-shaped
    python benchmarks/loss_autograd_cost.py --compile    # also torch.compile (inductor; needs a C++ compiler)

Times, in microseconds per minibatch: ``ppo_loss`` and its output gradients through autograd (as
``PPOAlgo`` takes them with ``fused_loss=False``), the same with ``torch.where`` for the max (the cheapest
equivalent form found), the fused closed form (``algos/fused.py``, the default), and the whole minibatch
gradient step both ways; plus one 256x64 @ 64x64 product, the unit the rest of the step is made of.
"""

from __future__ import annotations

import argparse
import time

import gymnasium as gym
import numpy as np
import torch

from distrl.algos.autodiff import leaves, output_grads
from distrl.algos.fused import fused_ppo_loss
from distrl.algos.ppo import PackedBatch, PPOAlgo, ppo_loss
from distrl.config import PPOConfig
from distrl.nets import make_agent


def per_call_us(fn, n: int = 2000, repeats: int = 7) -> float:
    for _ in range(n // 10):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        times.append((time.perf_counter() - start) / n * 1e6)
    return float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--compile", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    B = args.batch
    lp, ent, v, olp, ov, adv, ret = (torch.randn(B, generator=g) * 0.1 for _ in range(7))
    valid = torch.ones(B)

    def autograd_loss():
        outputs = leaves(lp, ent, v)
        loss = ppo_loss(*outputs, olp, ov, adv, ret, valid, 0.2, None, 0.5, 0.0)
        return output_grads(loss.loss, outputs)

    def autograd_where():
        log_prob, _, values = outputs = leaves(lp, ent, v)
        ratio = (log_prob - olp).exp()
        a, b = -adv * ratio, -adv * ratio.clamp(0.8, 1.2)
        error = values - ret
        loss = torch.where(a > b, a, b) + 0.5 * (error * error)
        return torch.autograd.grad(loss @ valid, outputs, allow_unused=True)

    def fused():
        return fused_ppo_loss(lp, ent, v, olp, ov, adv, ret, valid, 0.2, None, 0.5, 0.0)

    env = gym.make("CartPole-v1")
    agent = make_agent(env.observation_space, env.action_space, PPOConfig(), "cpu", 0)
    algo = PPOAlgo(PPOConfig(), agent, 0)
    plain_algo = PPOAlgo(PPOConfig(fused_loss=False), agent, 0)
    obs = torch.randn(B, 4, generator=g)
    data = torch.cat(
        [torch.randint(0, 2, (B, 1), generator=g).float(), torch.randn(B, 4, generator=g), valid[:, None]], 1
    )
    rows = PackedBatch(obs, data, (), True).all_rows()
    x, w, bias = torch.randn(B, 64), torch.randn(64, 64), torch.randn(64)

    rows_out = {
        "ppo_loss + output gradients (autograd)": per_call_us(autograd_loss),
        "the same, torch.where for the max (autograd)": per_call_us(autograd_where),
        "fused_ppo_loss: the loss and its output gradients in closed form": per_call_us(fused),
        "whole minibatch gradient step, fused loss (forward, loss, backward, statistics)": per_call_us(
            lambda: algo._minibatch_gradient(rows, 0.2)
        ),
        "whole minibatch gradient step, plain loss through autograd": per_call_us(
            lambda: plain_algo._minibatch_gradient(rows, 0.2)
        ),
        f"one {B}x64 @ 64x64 product (addmm)": per_call_us(lambda: torch.addmm(bias, x, w)),
    }
    if args.compile:
        start = time.perf_counter()
        compiled = torch.compile(autograd_loss, dynamic=False)
        compiled()
        print(f"torch.compile: {time.perf_counter() - start:.1f} s to compile")
        rows_out["ppo_loss + output gradients (torch.compile)"] = per_call_us(compiled)
    for name, us in rows_out.items():
        print(f"{us:8.1f} us  {name}")


if __name__ == "__main__":
    main()
