"""distrl's BC and TD3+BC against d3rlpy's, step for step: from the same weights, on the same batches.

    /tmp/d3venv/bin/python benchmarks/offline_lockstep.py --dataset hopper/medium-replay-v1 --datasets-dir DATASETS

d3rlpy's initial weights are copied into distrl's networks (and their targets), distrl takes d3rlpy's observation
statistics, and both step on each batch d3rlpy samples. TD3's target smoothing noise, the one random draw in these
steps, is off on both sides, and d3rlpy's actor steps on the same steps as distrl's (every second, as the paper's
code has it; d3rlpy's own count starts one earlier). At the steps shown the script prints the largest difference
of the two policies' actions on 1,024 observations of the dataset, and the largest difference of any weight.

Beside it, the control: distrl against itself, from the same weights, one copy taking each batch's rows in the
reverse order. The mathematics is the same (every loss is a mean over the rows); the sums add in another order, so
they round differently, as two libraries' arithmetic does. Where distrl and d3rlpy run the same algorithm, their
gap starts at rounding and grows as the control's does: training amplifies rounding, and after some hundred steps
the two runs differ as two seeds' do. A gap that starts larger, or grows faster, is a difference in the
algorithm. IQL is left out: d3rlpy weighs the actor with V after the value step, distrl (as CORL) with V before it,
so the two differ by design from the first step; CQL draws its sampled actions from each library's own stream.

d3rlpy lives in a virtualenv of its own (see ``offline_vs_d3rlpy.py``); distrl runs from this checkout's ``src``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
sys.path[:0] = [str(HERE), str(HERE.parent / "src")]

from offline_learning import D3rlpyLearner, DistrlLearner  # noqa: E402

SHOWN = (1, 10, 100, 200, 300, 500, 1000, 2000, 5000, 10000, 20000)


def linear_layers(module: Any) -> list[Any]:
    import torch

    return [m for m in module.modules() if isinstance(m, torch.nn.Linear)]


def quiet(learner: DistrlLearner, algo: str) -> None:
    """No target smoothing noise in distrl's TD3+BC."""
    if algo == "td3bc":
        learner.trainer.algo.cfg = dataclasses.replace(learner.trainer.algo.cfg, policy_noise=0.0)


def matched_networks(algo: str, ours: DistrlLearner, theirs: D3rlpyLearner) -> list[tuple[Any, Any]]:
    """distrl's networks beside d3rlpy's that do the same thing."""
    mine, modules = ours.trainer.algo, theirs.model.impl.modules
    if algo == "bc":
        return [(mine.actor.module, modules.imitator)]
    return [
        (mine.actor.module, modules.policy),
        (mine.critic.module.q1, modules.q_funcs[0]),
        (mine.critic.module.q2, modules.q_funcs[1]),
    ]


def gaps(act_a: Any, act_b: Any, probe: Any, layers: list[tuple[Any, Any]]) -> tuple[float, float]:
    """The largest difference of two policies' actions on ``probe``, and of any weight of the ``layers`` pairs."""
    import numpy as np
    import torch

    actions = float(np.abs(act_a(probe) - act_b(probe)).max())
    with torch.no_grad():
        weights = max(
            max(float((a.weight - b.weight).abs().max()), float((a.bias - b.bias).abs().max())) for a, b in layers
        )
    return actions, weights


def against_d3rlpy(algo: str, settings: dict, steps: int) -> dict[int, tuple[float, float]]:
    import numpy as np
    import torch

    from distrl.data.replay import Transitions

    theirs, ours = D3rlpyLearner(algo, settings), DistrlLearner(algo, settings)
    quiet(ours, algo)
    if algo == "td3bc":
        theirs.model.impl._target_smoothing_sigma = 0.0
        theirs.model._grad_step = 1  # its actor steps where its count before the step is even
    trainer, networks = ours.trainer, matched_networks(algo, ours, theirs)
    with torch.no_grad():
        for mine, its in networks:
            for a, b in zip(linear_layers(mine), linear_layers(its), strict=True):
                a.weight.copy_(b.weight)
                a.bias.copy_(b.bias)
        for target in trainer.algo._targets().values():
            target.params.data.copy_(target.source.data)
    scaler = theirs.model.observation_scaler
    if scaler is not None:
        trainer.obs_mean.copy_(torch.as_tensor(scaler.mean, dtype=torch.float32))
        trainer.obs_std.copy_(torch.as_tensor(scaler.std + scaler.eps, dtype=torch.float32))
    layers = [pair for mine, its in networks for pair in zip(linear_layers(mine), linear_layers(its))]
    probe = np.asarray(theirs.dataset.sample_transition_batch(1024).observations, dtype=np.float32)

    def tensor(values: Any) -> Any:
        return torch.from_numpy(np.asarray(values, dtype=np.float32))

    shown = {0: gaps(ours.act, theirs.act, probe, layers)}
    for step in range(1, steps + 1):
        batch = theirs.dataset.sample_transition_batch(theirs.batch_size)
        theirs.model.update(batch)
        rewards, terminals = tensor(batch.rewards).view(-1), tensor(batch.terminals).view(-1)
        mine = Transitions(
            tensor(batch.observations), tensor(batch.actions), rewards, tensor(batch.next_observations), terminals
        )
        trainer.algo.update(trainer._prepared(mine), trainer.sync, theirs.batch_size)
        if step in SHOWN:
            shown[step] = gaps(ours.act, theirs.act, probe, layers)
    ours.close()
    return shown


def against_itself(algo: str, settings: dict, steps: int) -> dict[int, tuple[float, float]]:
    import numpy as np

    a, b = DistrlLearner(algo, settings), DistrlLearner(algo, settings)
    for learner in (a, b):
        quiet(learner, algo)
    data = a.trainer._load_data()
    b.trainer._load_data()
    nets = zip(a.trainer.algo.learned.values(), b.trainer.algo.learned.values())
    layers = [pair for one, other in nets for pair in zip(linear_layers(one.module), linear_layers(other.module))]
    rng = np.random.default_rng(settings["seed"])
    probe = np.asarray(data.obs[rng.integers(0, data.size, 1024)], dtype=np.float32)
    batch_size = a.trainer.cfg.batch_size
    shown = {0: gaps(a.act, b.act, probe, layers)}
    for step in range(1, steps + 1):
        rows = rng.integers(0, data.size, batch_size)
        for learner, order in ((a, rows), (b, rows[::-1].copy())):
            batch = dataclasses.replace(data.take(order), rows=None)
            learner.trainer.algo.update(learner.trainer._prepared(batch), learner.trainer.sync, batch_size)
        if step in SHOWN:
            shown[step] = gaps(a.act, b.act, probe, layers)
    a.close()
    b.close()
    return shown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--dataset", default="hopper/medium-replay-v1")
    parser.add_argument("--datasets-dir", default=os.environ.get("MINARI_DATASETS_PATH", ""))
    parser.add_argument("--algos", nargs="+", choices=("bc", "td3bc"), default=["bc", "td3bc"])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    settings = {
        "env": args.env,
        "dataset": args.dataset,
        "root": str(Path(args.datasets_dir).absolute()),
        "steps": args.steps,
        "eval_every": args.steps,
        "eval_episodes": 1,
        "seed": args.seed,
    }
    for algo in args.algos:
        lockstep, control = against_d3rlpy(algo, settings, args.steps), against_itself(algo, settings, args.steps)
        print(f"\n{algo} on {args.dataset}, seed {args.seed}: largest difference of actions | of weights\n")
        print("| step | distrl against d3rlpy | distrl against itself, rows reversed |")
        print("|---|---|---|")
        for step in sorted(lockstep):
            (a1, w1), (a2, w2) = lockstep[step], control[step]
            print(f"| {step:,} | {a1:.1e} / {w1:.1e} | {a2:.1e} / {w2:.1e} |")


if __name__ == "__main__":
    main()
