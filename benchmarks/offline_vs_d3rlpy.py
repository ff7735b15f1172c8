"""distrl's offline algorithms against d3rlpy's on the same dataset: gradient steps per second and peak RSS.

    /tmp/d3venv/bin/python benchmarks/offline_vs_d3rlpy.py                  # prints the table
    /tmp/d3venv/bin/python benchmarks/offline_vs_d3rlpy.py --write          # and writes it to docs/benchmarks.md
    /tmp/d3venv/bin/python benchmarks/offline_vs_d3rlpy.py --only iql --steps 500 --repeats 1
    /tmp/d3venv/bin/python benchmarks/offline_vs_d3rlpy.py --quick          # 500 timed steps, one run each
    /tmp/d3venv/bin/python benchmarks/offline_vs_d3rlpy.py --ceiling        # and each step's arithmetic ceiling
    /tmp/d3venv/bin/python benchmarks/offline_vs_d3rlpy.py --env Hopper-v5 --dataset hopper/medium-v0 --datasets-dir DIR

d3rlpy lives in a virtualenv of its own, so that the project's .venv is left as it is; both libraries run in that
one interpreter (the same torch and numpy). d3rlpy 2.8.1 pins gymnasium 1.0.0, which distrl does not accept: the
last line puts the project's gymnasium back, and both import with it (``pip check`` still names the pin; d3rlpy's
offline path does not use gymnasium)::

    python3 -m venv /tmp/d3venv
    /tmp/d3venv/bin/pip install torch==2.13.0                          # the CPU build (a local wheel here)
    /tmp/d3venv/bin/pip install -e "/work/main[bench,offline,mujoco]"  # mujoco: for --env Hopper-v5 only
    /tmp/d3venv/bin/pip install d3rlpy                                 # 2.8.1: installs gymnasium 1.0.0
    /tmp/d3venv/bin/pip install --no-deps gymnasium==1.4.0             # the version the project's .venv has

The dataset is made here, nothing is downloaded: ``--dataset-steps`` (50,000) transitions of uniformly random
actions in ``--env`` (Pendulum-v1, or Hopper-v5 where mujoco is importable), recorded by
:func:`distrl.data.recorder.record_episodes` and written by :func:`distrl.data.minari_store.write_dataset` as a Minari
dataset under a temporary ``MINARI_DATASETS_PATH``; or, with ``--dataset ID --datasets-dir DIR``, a dataset made
before (the Hopper ones of docs/results/offline/DATASETS.md: a million transitions, where a batch's draw costs
more than in 50,000). distrl reads it as any run does; d3rlpy's child reads the same
dataset back with ``minari.load_dataset`` and converts its episodes to ``d3rlpy.dataset.MDPDataset(observations,
actions, rewards, terminals, timeouts)``: a truncated episode keeps its final observation as one more row (a zero
action and reward, ``timeouts`` 1 there), so d3rlpy has the same T transitions and the same last next-observation; a
terminated one has its T rows and ``terminals`` 1 on the last (d3rlpy then bootstraps from a zero observation, which
the terminal flag masks). Speed is what is measured, not learning: the data's quality does not matter.

Same settings on both sides: batch 256, every network's hidden layers (256, 256) with ReLU, Adam (torch's, eps
1e-8) with lr 3e-4, gamma 0.99, tau 0.005, actions rescaled from the env's bounds to [-1, 1] (distrl always does;
d3rlpy through ``MinMaxActionScaler`` with the env's bounds), no reward scaling, observations standardised for
TD3+BC only (distrl's ``normalize_obs``, on by default for td3bc; d3rlpy's ``StandardObservationScaler``, fitted as
``fit`` fits it; both add 1e-3 to the standard deviation).

- BC: deterministic tanh policy, mean squared error (d3rlpy's ``BCConfig`` default ``policy_type="deterministic"``;
  its defaults batch 100 and lr 1e-3 are set to 256 and 3e-4).
- TD3+BC (Fujimoto and Gu 2021): alpha 2.5, target policy noise 0.2 clipped at 0.5, the actor and the targets every
  second step (d3rlpy's defaults are these).
- IQL (Kostrikov et al. 2021, MuJoCo settings): expectile 0.7, beta 3.0 (d3rlpy's ``weight_temp``), advantage
  weights clipped at 100 (d3rlpy 2.8.1's defaults are these; set anyway). Neither side uses the reference's cosine
  learning-rate decay of the policy.
- CQL (Kumar et al. 2020, MuJoCo settings): SAC with automatic entropy (initial coefficient 1), policy lr 1e-4,
  critics' lr 3e-4, penalty weight 5 fixed (no Lagrangian: d3rlpy ``alpha_learning_rate=0``, ``initial_alpha=1``),
  10 sampled actions per state from each of the uniform, pi(.|s) and pi(.|s'), no entropy term in the target
  (d3rlpy's ``soft_q_backup=False``). d3rlpy's entropy coefficient learns at ``temp_learning_rate``, set to 3e-4 as
  distrl's (its ``learning_rate``; d3rlpy's default is 1e-4). distrl runs this row where ``distrl.config`` has a
  ``CQLConfig``; otherwise its cells are n/a.

What is timed, after ``--warmup`` steps (200) that are not, over ``--steps`` gradient steps (2,000), one torch
thread per child process, a child per measurement, the libraries alternating, ``--repeats`` (3) runs each (seeds
0..repeats-1), medians reported:

- distrl: ``OfflineTrainer.train(stop_at=warmup + steps)`` after ``train(stop_at=warmup)`` (which also loads the
  dataset), the wall clock around the second call. The run has no run directory (no logger, no checkpoints),
  ``quiet``, no evaluation (``eval_every=0``), ``--preset none``, ``--device cpu``, ``threads=1``. A step is the
  loop's: draw a batch (:class:`~distrl.data.offline.GlobalSampler`), rescale actions and standardise observations,
  ``algo.update`` (every loss, backward and Adam step, the targets' Polyak step), and the loop's bookkeeping
  (counting, a no-op log call, the checkpoint and evaluation checks: a few microseconds).
- d3rlpy: ``algo.update(dataset.sample_transition_batch(256))`` in a loop, what ``fit``'s loop calls per step
  (``update`` builds the ``TorchMiniBatch``, applying the scalers, then runs the algorithm's ``inner_update``).
  ``fit``'s logger, tqdm bar and metric averaging are left out (the model is built with ``build_with_dataset`` and
  the scalers fitted with the function ``fit`` calls), so d3rlpy's figure is the faster of the two ways to time it.

Differences that remain (the networks' shapes and parameter counts are equal on both sides, both initialise as
``nn.Linear`` does, both read the same transitions):

- Each step's work: d3rlpy draws a batch with a Python loop over 256 transitions (about 1.6 ms on 2026-11-28's
  host, 2.9-3.4 ms on 2026-11-30's, on the random dataset and on ``hopper/medium-v0`` alike, against 0.07 ms for
  distrl's vectorised draw on the random one and 0.1-0.3 ms on the Hopper one's million rows); distrl's networks
  sit on one flat buffer per module, so its Adam and Polyak steps are a few whole-buffer operations where torch's
  Adam and d3rlpy's ``soft_sync`` loop over the parameters; distrl flushes denormals (``RunConfig.flush_denormal``,
  on by default), d3rlpy leaves torch's default.
- TD3+BC: d3rlpy steps the actor at steps 0, 2, 4, ..., distrl at 2, 4, ...: as many over an even number of steps.
- IQL: d3rlpy trains Q and V with one Adam over both (one backward of the summed losses), then recomputes the
  target critics' Q and V(s) for the policy's weights (with V after its step): one more forward of the twin
  target critics and of V than distrl, which takes three Adam steps (V, Q, policy) and weighs with V before its
  step. Policy log-std: d3rlpy ``-5 + 7 sigmoid(p)`` (starts at -1.5), distrl ``clamp(p, -20, 2)`` (starts at 0).
- CQL: for the penalty's actions at s and s', both run the policy once per state and draw 10 samples from its
  distribution. d3rlpy runs the critics on the three sets of 2,560 sampled actions in three passes and on the
  dataset's actions twice (the TD loss's and the penalty's), distrl on the 7,680 in one pass and on the dataset's
  once. d3rlpy's target action is the policy's mean at s', distrl's a sample. d3rlpy steps the critics, then the
  policy and the entropy coefficient; distrl the coefficient, the policy, then the critics.

``--ceiling`` (float32) bounds the step's time from below by its arithmetic. A child per library and algorithm
counts the floating-point operations of the step's matrix products, forward and backward
(``torch.utils.flop_counter``, over two steps after two: TD3+BC steps its actor every second step); another times
``torch.mm`` on one thread at a hidden layer's shape for a batch of 256, at CQL's 7,680 rows, and at 1,024 cubed
(and oneDNN's linear kernel at the same shapes, where distrl's layers use it: ``distrl.nets.dense``; their products
are counted through ``torch.mm``, which the counter sees). The products of a step at the best of those rates give
the ceiling: the most steps a second any implementation running those products could reach. Where twice d3rlpy's
rate is above it, 2x in float32 is out of reach on that machine.

Peak RSS is the child's ``ru_maxrss``: the libraries, the dataset as each holds it, the networks and the optimizers.
The ratio is distrl / d3rlpy of the median steps per second: above 1, distrl is faster. "Per seed, median" is the
median of each seed's distrl / d3rlpy, the two runs timed one after the other (``harness.paired_ratio``): where the
host's speed drifts within a sitting (on 2026-11-30's Xeon a [256, 256] product's time doubled and came back within
twenty minutes), it compares runs of the same minutes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import tempfile
import time
from typing import Any

from distrl.config import ConfigError
from harness import alternate, child_main, markdown_table, measure, median, mm_gflops, paired_ratio, write_section

ALGOS = ("bc", "td3bc", "iql", "cql")
NAMES = {"bc": "BC", "td3bc": "TD3+BC", "iql": "IQL", "cql": "CQL"}
ENVS = ("Pendulum-v1", "Hopper-v5")
DATASET_ID = "bench/random-v0"
BATCH_SIZE = 256
HIDDEN = (256, 256)
LEARNING_RATE = 3e-4
GAMMA, TAU = 0.99, 0.005
TD3BC = dict(alpha=2.5, policy_noise=0.2, noise_clip=0.5, policy_freq=2)
IQL = dict(expectile=0.7, beta=3.0, max_weight=100.0)
CQL = dict(conservative_weight=5.0, n_action_samples=10, actor_learning_rate=1e-4)
KEY = "steps_per_s"


def distrl_has(algo: str) -> bool:
    """Whether this distrl trains ``algo`` (CQL came after BC, TD3+BC and IQL)."""
    import distrl.config

    return algo != "cql" or hasattr(distrl.config, "CQLConfig")


# ---- the dataset ----


def make_dataset(env_id: str, steps: int, root: str) -> tuple[int, int]:
    """Record ``steps`` transitions of uniformly random actions in ``env_id`` as Minari dataset :data:`DATASET_ID`
    under ``root``; the transitions and episodes written."""
    from distrl.data.minari_store import write_dataset
    from distrl.data.recorder import record_episodes
    from distrl.envs.vector import make_env

    env = make_env(env_id, 8)
    try:
        episodes = record_episodes(env, None, steps, seed=0, random=True)
        write_dataset(
            DATASET_ID,
            episodes,
            env_id,
            env.single_observation_space,
            env.single_action_space,
            "uniformly random",
            root,
        )
    finally:
        env.close()
    return sum(len(e["rewards"]) for e in episodes), len(episodes)


def dataset_size(dataset_id: str) -> tuple[int, int]:
    """The transitions and episodes of Minari dataset ``dataset_id`` under ``MINARI_DATASETS_PATH``."""
    import minari

    dataset = minari.load_dataset(dataset_id)
    return int(dataset.total_steps), int(dataset.total_episodes)


def d3rlpy_dataset(root: str, dataset_id: str = DATASET_ID) -> tuple[Any, Any, Any]:
    """The Minari dataset ``dataset_id`` under ``root``, read with minari, as a d3rlpy ``MDPDataset``; and the action
    bounds."""
    import minari
    import numpy as np
    from d3rlpy.constants import ActionSpace
    from d3rlpy.dataset import MDPDataset

    os.environ["MINARI_DATASETS_PATH"] = root
    dataset = minari.load_dataset(dataset_id)
    columns: dict[str, list] = {k: [] for k in ("observations", "actions", "rewards", "terminals", "timeouts")}
    for episode in dataset.iterate_episodes():
        steps = len(episode.rewards)
        terminated = bool(episode.terminations[-1])
        # a truncated episode keeps its final observation as one more row, so that its last transition has it
        rows = steps if terminated else steps + 1
        actions = np.asarray(episode.actions, dtype=np.float32)
        rewards = np.asarray(episode.rewards, dtype=np.float32)
        ends = np.zeros(rows, dtype=np.float32)
        ends[-1] = 1.0
        columns["observations"].append(np.asarray(episode.observations[:rows], dtype=np.float32))
        columns["actions"].append(actions if terminated else np.concatenate([actions, np.zeros_like(actions[:1])]))
        columns["rewards"].append(rewards if terminated else np.append(rewards, np.float32(0.0)))
        columns["terminals"].append(ends if terminated else np.zeros(rows, dtype=np.float32))
        columns["timeouts"].append(np.zeros(rows, dtype=np.float32) if terminated else ends)
    flat = {k: np.concatenate(v) for k, v in columns.items()}
    space = dataset.action_space
    return MDPDataset(**flat, action_space=ActionSpace.CONTINUOUS), space.low, space.high


# ---- the two sides ----


def distrl_config(algo: str, root: str, dataset_id: str = DATASET_ID) -> Any:
    from distrl import config

    common = dict(
        dataset=dataset_id, datasets_dir=root, batch_size=BATCH_SIZE, learning_rate=LEARNING_RATE, net_arch=HIDDEN
    )
    if algo == "bc":
        return config.BCConfig(**common)
    if algo == "td3bc":
        return config.TD3BCConfig(**common, gamma=GAMMA, tau=TAU, normalize_obs=True, **TD3BC)
    if algo == "iql":
        return config.IQLConfig(**common, gamma=GAMMA, tau=TAU, **IQL)
    return config.CQLConfig(**common, gamma=GAMMA, tau=TAU, target_action_gap=None, **CQL)


def distrl_trainer(
    algo: str,
    env_id: str,
    root: str,
    seed: int,
    steps: int,
    device: str,
    precision: str,
    dataset_id: str = DATASET_ID,
) -> Any:
    """distrl's trainer as timed: no run directory, quiet, no evaluation, one thread, ``--preset none``."""
    from distrl.config import RunConfig
    from distrl.training import OfflineTrainer

    run = RunConfig(
        algo=algo,
        env=env_id,
        total_steps=steps,
        seed=seed,
        quiet=True,
        threads=1,
        device=device,
        preset="none",
        eval_every=0,
        precision=precision,
    )
    return OfflineTrainer(run, distrl_config(algo, root, dataset_id))


def run_distrl(
    algo: str,
    env_id: str,
    root: str,
    seed: int,
    steps: int,
    warmup: int,
    device: str = "cpu",
    precision: str = "fp32",
    dataset_id: str = DATASET_ID,
) -> float:
    """distrl's gradient steps per second over ``steps`` steps after ``warmup`` (on a GPU: until its last kernel
    has run), its networks' products in ``precision``."""
    return timed_rate(
        distrl_trainer(algo, env_id, root, seed, warmup + steps, device, precision, dataset_id), steps, warmup
    )


def timed_rate(trainer: Any, steps: int, warmup: int) -> float:
    """A distrl trainer's gradient steps per second over ``steps`` steps after ``warmup`` (on a GPU: until its last
    kernel has run); the trainer is closed after."""
    device = str(trainer.device)
    try:
        trainer.train(stop_at=warmup)  # loads the dataset, then the warm-up steps
        synchronize(device)
        start = time.perf_counter()
        trainer.train(stop_at=warmup + steps)
        synchronize(device)
        elapsed = time.perf_counter() - start
        assert trainer.steps == warmup + steps, trainer.steps
    finally:
        trainer.close()
    return steps / elapsed


def d3rlpy_config(algo: str, low: Any, high: Any) -> Any:
    from d3rlpy import algos
    from d3rlpy.models.encoders import VectorEncoderFactory
    from d3rlpy.preprocessing import MinMaxActionScaler, StandardObservationScaler

    encoder = VectorEncoderFactory(hidden_units=list(HIDDEN), activation="relu")
    scaled = dict(batch_size=BATCH_SIZE, action_scaler=MinMaxActionScaler(minimum=low, maximum=high))
    if algo == "bc":
        return algos.BCConfig(
            **scaled, learning_rate=LEARNING_RATE, policy_type="deterministic", encoder_factory=encoder
        )
    critic = dict(
        **scaled,
        gamma=GAMMA,
        tau=TAU,
        critic_learning_rate=LEARNING_RATE,
        actor_encoder_factory=encoder,
        critic_encoder_factory=encoder,
        n_critics=2,
    )
    if algo == "td3bc":
        return algos.TD3PlusBCConfig(
            **critic,
            actor_learning_rate=LEARNING_RATE,
            observation_scaler=StandardObservationScaler(),
            alpha=TD3BC["alpha"],
            target_smoothing_sigma=TD3BC["policy_noise"],
            target_smoothing_clip=TD3BC["noise_clip"],
            update_actor_interval=TD3BC["policy_freq"],
        )
    if algo == "iql":
        return algos.IQLConfig(
            **critic,
            actor_learning_rate=LEARNING_RATE,
            value_encoder_factory=encoder,
            expectile=IQL["expectile"],
            weight_temp=IQL["beta"],
            max_weight=IQL["max_weight"],
        )
    return algos.CQLConfig(
        **critic,
        actor_learning_rate=CQL["actor_learning_rate"],
        temp_learning_rate=LEARNING_RATE,
        initial_temperature=1.0,
        alpha_learning_rate=0.0,  # the penalty's weight fixed, as distrl's target_action_gap=None
        initial_alpha=1.0,
        conservative_weight=CQL["conservative_weight"],
        n_action_samples=CQL["n_action_samples"],
        soft_q_backup=False,
        max_q_backup=False,
    )


def d3rlpy_model(algo: str, root: str, seed: int, device: str, dataset_id: str = DATASET_ID) -> tuple[Any, Any]:
    """d3rlpy's algorithm built as ``fit`` builds it (the observation scaler fitted), and the dataset."""
    import d3rlpy
    from d3rlpy.algos.utility import build_scalers_with_transition_picker

    d3rlpy.seed(seed)
    dataset, low, high = d3rlpy_dataset(root, dataset_id)
    model = d3rlpy_config(algo, low, high).create(device=device)
    build_scalers_with_transition_picker(model, dataset)  # as fit does: the observation scaler's statistics
    model.build_with_dataset(dataset)
    return model, dataset


def run_d3rlpy(
    algo: str, root: str, seed: int, steps: int, warmup: int, device: str = "cpu:0", dataset_id: str = DATASET_ID
) -> float:
    """d3rlpy's gradient steps per second over ``steps`` steps after ``warmup``: ``update`` on a sampled batch, as
    ``fit``'s loop calls it."""
    model, dataset = d3rlpy_model(algo, root, seed, device, dataset_id)
    for _ in range(warmup):
        model.update(dataset.sample_transition_batch(BATCH_SIZE))
    synchronize(device)
    start = time.perf_counter()
    for _ in range(steps):
        model.update(dataset.sample_transition_batch(BATCH_SIZE))
    synchronize(device)
    return steps / (time.perf_counter() - start)


# ---- the arithmetic ceiling ----

COUNTED = 2
"""Steps whose products are counted, after as many untimed: TD3+BC steps its actor every second step."""
SHAPES = ((256, 256, 256), (7_680, 256, 256), (1_024, 1_024, 1_024))
"""Products timed for the machine's rate: a batch of 256 through a hidden layer, CQL's 30 sampled actions per state
through one, and a large square one."""


def product_flops(lib: str, algo: str, root: str, env_id: str, dataset_id: str = DATASET_ID) -> float:
    """The floating-point operations of one gradient step's matrix products (forward and backward), counted by
    ``torch.utils.flop_counter`` over :data:`COUNTED` steps after as many."""
    from torch.utils.flop_counter import FlopCounterMode

    from distrl.nets.dense import OVERRIDE

    if lib == "distrl":
        # the same products through torch.mm, which the counter sees (it does not count oneDNN's linear kernel)
        os.environ[OVERRIDE] = "aten"
        trainer = distrl_trainer(algo, env_id, root, 0, 2 * COUNTED, "cpu", "fp32", dataset_id)
        try:
            trainer.train(stop_at=COUNTED)
            with FlopCounterMode(display=False) as counter:
                trainer.train(stop_at=2 * COUNTED)
        finally:
            trainer.close()
    else:
        model, dataset = d3rlpy_model(algo, root, 0, "cpu:0", dataset_id)
        for _ in range(COUNTED):
            model.update(dataset.sample_transition_batch(BATCH_SIZE))
        with FlopCounterMode(display=False) as counter:
            for _ in range(COUNTED):
                model.update(dataset.sample_transition_batch(BATCH_SIZE))
    return counter.get_total_flops() / COUNTED


def product_rate() -> dict[str, float]:
    """GFLOP/s of ``torch.mm`` at each of :data:`SHAPES` (m x k by k x n), back to back on one thread, about half
    a second each, and of oneDNN's linear kernel at the same shapes where distrl's layers use it on this CPU."""
    from distrl.nets.dense import onednn_products

    libraries = {"mm": False, **({"oneDNN": True} if onednn_products() else {})}
    return {
        f"{name} {m}x{k}x{n}": mm_gflops(m, k, n, max(5, round(5e10 / (2 * m * k * n))), onednn)
        for name, onednn in libraries.items()
        for m, k, n in SHAPES
    }


def synchronize(device: str) -> None:
    """Wait for the GPU's queued work, where ``device`` is one."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize()


def child(lib: str, algo: str, seed: int, arg: str) -> dict:
    import torch

    torch.set_num_threads(1)
    settings = json.loads(arg)
    env_id, root, steps, warmup = settings["env"], settings["root"], settings["steps"], settings["warmup"]
    dataset_id = settings["dataset"]
    if lib == "products":
        return product_rate()
    if settings.get("count"):
        return {"gflop": product_flops(lib, algo, root, env_id, dataset_id) / 1e9}
    if lib == "distrl":
        return {KEY: run_distrl(algo, env_id, root, seed, steps, warmup, "cpu", settings["precision"], dataset_id)}
    return {KEY: run_d3rlpy(algo, root, seed, steps, warmup, dataset_id=dataset_id)}


# ---- the report ----


def versions() -> str:
    from importlib.metadata import version

    return ", ".join(f"{p} {version(p)}" for p in ("distrl", "d3rlpy", "torch", "minari", "gymnasium"))


def rate(steps_per_s: float) -> str:
    """Steps a second to three figures or more: 551, 17.3, 8.61."""
    return f"{steps_per_s:,.0f}" if steps_per_s >= 100 else f"{steps_per_s:.3g}"


def report_table(results: dict[str, dict]) -> list[str]:
    rows = []
    for algo, res in results.items():
        d, r = median(res["values"].get("distrl", [])), median(res["values"]["d3rlpy"])
        paired = paired_ratio(res["values"].get("distrl", []), res["values"]["d3rlpy"])
        rss_d, rss_r = median(res["rss"].get("distrl", [])), median(res["rss"]["d3rlpy"])
        rows.append(
            [
                NAMES[algo],
                "n/a" if d is None else rate(d),
                rate(r),
                "n/a" if d is None else f"{d / r:.2f}×",
                "n/a" if paired is None else f"{paired:.2f}×",
                f"{'n/a' if rss_d is None else f'{rss_d:,.0f}'} / {rss_r:,.0f}",
            ]
        )
    header = [
        "algorithm",
        "distrl steps/s",
        "d3rlpy steps/s",
        "distrl / d3rlpy",
        "per seed, median",
        "peak RSS distrl / d3rlpy (MB)",
    ]
    return markdown_table(header, rows)


def ceiling_table(results: dict[str, dict], flops: dict[str, dict[str, float]], rates: dict[str, float]) -> list[str]:
    """Each algorithm's step against its products at the machine's best measured rate: the most steps a second any
    implementation running those products reaches, and whether twice d3rlpy's rate is under it."""
    best = max(rates.values())
    rows = []
    for algo, res in results.items():
        d, r = median(res["values"].get("distrl", [])), median(res["values"]["d3rlpy"])
        gflop = flops[algo]
        ceiling = best / gflop.get("distrl", gflop["d3rlpy"])
        rows.append(
            [
                NAMES[algo],
                f"{gflop['distrl']:.3f} / {gflop['d3rlpy']:.3f}"
                if "distrl" in gflop
                else f"n/a / {gflop['d3rlpy']:.3f}",
                rate(ceiling),
                "n/a" if d is None else f"{rate(d)} ({d / ceiling:.0%})",
                f"{rate(r)} ({r * gflop['d3rlpy'] / best:.0%})",
                rate(2 * r),
                "yes" if 2 * r <= ceiling else "no",
            ]
        )
    header = [
        "algorithm",
        "product GFLOP a step distrl / d3rlpy",
        "ceiling steps/s (distrl's products)",
        "distrl steps/s (of its ceiling)",
        "d3rlpy steps/s (of its ceiling)",
        "2× d3rlpy",
        "2× under the ceiling",
    ]
    return markdown_table(header, rows)


def main() -> None:
    if child_main(child):
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", choices=ENVS, default=ENVS[0], help="Hopper-v5 needs mujoco")
    parser.add_argument("--steps", type=int, default=None, help="timed gradient steps per child (2,000)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed gradient steps before them (200)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per library and algorithm (3)")
    parser.add_argument("--only", choices=ALGOS, default=None, help="one algorithm")
    parser.add_argument("--dataset-steps", type=int, default=50_000, help="transitions in the dataset")
    parser.add_argument(
        "--dataset", default="", help="time on this Minari dataset under --datasets-dir instead of making one"
    )
    parser.add_argument("--datasets-dir", default="", help="where --dataset lives")
    parser.add_argument("--quick", action="store_true", help="500 timed steps after 50, one run each")
    parser.add_argument("--write", action="store_true", help="write the section of docs/benchmarks.md")
    parser.add_argument(
        "--precision", choices=("fp32", "bf16"), default="fp32", help="distrl's (d3rlpy trains in float32 only)"
    )
    parser.add_argument(
        "--ceiling",
        action="store_true",
        help="also count each step's product FLOPs and time the machine's product rate (float32 only)",
    )
    args = parser.parse_args()
    steps = args.steps or (500 if args.quick else 2_000)
    warmup = args.warmup if args.warmup is not None else (50 if args.quick else 200)
    repeats = args.repeats or (1 if args.quick else 3)
    if min(steps, repeats, args.dataset_steps) < 1 or warmup < 0:
        parser.error("--steps, --repeats and --dataset-steps must be at least 1, --warmup at least 0")
    if args.ceiling and args.precision != "fp32":
        parser.error("--ceiling counts float32 products: leave --precision at fp32")
    if bool(args.dataset) != bool(args.datasets_dir):
        parser.error("--dataset and --datasets-dir go together")
    algos = (args.only,) if args.only else ALGOS
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{versions()}; load average at start {load}", flush=True)
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        root, dataset_id = (args.datasets_dir, args.dataset) if args.dataset else (scratch, DATASET_ID)
        os.environ["MINARI_DATASETS_PATH"] = root  # the children inherit it
        start = time.perf_counter()
        try:
            if args.dataset:
                transitions, episodes = dataset_size(dataset_id)
                data = f"`{dataset_id}`, {transitions:,} transitions in {episodes:,} episodes"
            else:
                transitions, episodes = make_dataset(args.env, args.dataset_steps, root)
                data = f"{transitions:,} transitions of uniformly random actions in {episodes:,} episodes"
        except ConfigError as e:  # the env's dependencies are missing (Hopper-v5 without mujoco)
            parser.error(str(e))
        print(f"dataset: {data} of {args.env} ({time.perf_counter() - start:.1f} s)", flush=True)
        settings = {
            "env": args.env,
            "root": root,
            "dataset": dataset_id,
            "steps": steps,
            "warmup": warmup,
            "precision": args.precision,
        }
        arg = json.dumps(settings)
        rates: dict[str, float] = {}
        if args.ceiling:
            rates = measure(__file__, "products", "rate", 0, arg)
            rates.pop("max_rss_mb")
            print("products, GFLOP/s on one thread: " + ", ".join(f"{k} {v:.0f}" for k, v in rates.items()))
        flops: dict[str, dict[str, float]] = {}
        for algo in algos:
            libs = ("distrl", "d3rlpy") if distrl_has(algo) else ("d3rlpy",)
            print(f"{NAMES[algo]} ...", flush=True)
            results[algo] = alternate(__file__, algo, repeats, arg, KEY, libs)  # type: ignore[arg-type]
            if args.ceiling:
                counting = json.dumps({**settings, "count": True})
                flops[algo] = {lib: measure(__file__, lib, algo, 0, counting)["gflop"] for lib in libs}
    lines = [
        f"`python benchmarks/offline_vs_d3rlpy.py` — {time.strftime('%Y-%m-%d')}, {platform.machine()}, "
        f"{os.cpu_count()} CPUs, {args.env}: {data} (a Minari dataset both read), {repeats} runs each (seeds "
        f"0..{repeats - 1}), alternating, medians; one torch thread "
        f"each; gradient steps per second over {steps:,} steps after {warmup:,}; {versions()}. Batch 256, "
        "(256, 256) ReLU networks, Adam lr 3e-4 (CQL's policy 1e-4), the papers' settings (see the script's "
        "docstring for what each side times and what differs)."
        + (f" distrl with --precision {args.precision} (d3rlpy in float32)." if args.precision != "fp32" else ""),
        "",
        *report_table(results),
    ]
    if args.ceiling:
        lines += [
            "",
            "The arithmetic ceiling, float32: each step's matrix products (forward and backward, counted by "
            "`torch.utils.flop_counter` over two steps) at this machine's best product rate on one thread ("
            + ", ".join(f"{k} {v:.0f}" for k, v in rates.items())
            + " GFLOP/s). No step running distrl's products is faster than the ceiling; the percentages are each "
            "library's steps/s against its own products' ceiling.",
            "",
            *ceiling_table(results, flops, rates),
        ]
    if "cql" in results and "distrl" not in results["cql"]["values"]:
        lines += ["", "- CQL: this distrl has no `CQLConfig`; d3rlpy alone."]
    body = "\n".join(lines)
    if args.write:
        write_section("Offline RL: distrl vs d3rlpy", body)
    else:
        print(body)


if __name__ == "__main__":
    main()
