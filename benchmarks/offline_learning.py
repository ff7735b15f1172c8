"""Offline learning curves, distrl against d3rlpy, on a Minari dataset made here: the normalised return of the
policy every ``--eval-every`` gradient steps, per algorithm and seed, for both libraries with the same networks and
hyperparameters (those of ``offline_vs_d3rlpy.py``, the papers').

    /tmp/d3venv/bin/python benchmarks/offline_learning.py --env Hopper-v5 --dataset hopper/medium-v0 \\
        --datasets-dir DATASETS --algos td3bc iql --seeds 0 1 2 --steps 200000 --parallel 2
    /tmp/d3venv/bin/python benchmarks/offline_learning.py --report --dataset hopper/medium-v0   # table and plot
    /tmp/d3venv/bin/python benchmarks/offline_learning.py ... --libs distrl --precision bf16  # distrl in bfloat16

Runs go to ``docs/results/offline/<dataset>.json``, one record per (library, algorithm, seed) written as it
finishes; a run already there is not run again, so a long comparison is made over several sittings. ``--parallel``
runs that many children at once, each with one torch thread: these are learning figures, not timings. The file
also keeps the dataset's fingerprint (transitions, episodes, mean return), and runs on a dataset of the same id
with another are refused (exit 2): the same command makes another dataset on another kind of CPU (DATASETS.md).

Each child trains on the whole dataset and evaluates the deterministic policy on ``--eval-episodes`` (10) episodes
of the env, reset with seeds 0.. (the same on both sides), at step 0 and every ``--eval-every`` (10,000) gradient
steps. distrl trains through ``OfflineTrainer.train(stop_at=...)`` and evaluates with its own evaluation; d3rlpy
trains through ``update`` on ``sample_transition_batch`` (``fit``'s loop) and its policy acts through ``predict``
in an env loop written here. The normalised return is D4RL's, ``100 (R - random) / (expert - random)`` with D4RL's
reference returns for the env's family (Hopper: -20.3 and 3,234.3); they were measured on D4RL's v2 envs, and this
runs Gymnasium's v5, so the figures are comparable between the two libraries here, and only roughly with papers.
d3rlpy lives in a virtualenv of its own (see ``offline_vs_d3rlpy.py``); distrl runs in the same interpreter.
With ``--precision bf16`` distrl's networks run their products in bfloat16 (``--precision bf16`` of ``distrl
train``); those runs are kept apart (a record's ``precision``), shown in a column and a colour of their own.

A run of CQL takes hours on one core. With ``--work-dir DIR`` each run leaves its state in ``DIR`` at every evaluation
(distrl: its checkpoint; d3rlpy: ``save_model``, its step count and its random states) and the same command goes on
from there, so a run outlives the process and the sitting that started it. A distrl run with ``--work-dir`` draws
fresh random streams at each evaluation, as a resumed distrl run does; stopped or not, it draws the same batches.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent
RESULTS = HERE.parent / "docs" / "results" / "offline"
REFERENCE = {"Hopper": (-20.272305, 3234.3), "HalfCheetah": (-280.178953, 12135.0), "Walker2d": (1.629008, 4592.3)}
"""D4RL's random and expert returns per env family (d4rl/infos.py)."""
PAPERS = {
    ("Hopper", "medium"): {"bc": 52.9, "td3bc": 59.3, "iql": 66.3, "cql": 58.5},
    ("Hopper", "medium-replay"): {"bc": 18.1, "td3bc": 60.9, "iql": 94.7, "cql": 95.0},
}
"""Normalised returns the papers report on D4RL's dataset of the same kind (``hopper-medium-v2``,
``hopper-medium-replay-v2``): the IQL paper's Table 1 (Kostrikov et al. 2021), which gathers BC's from the Decision
Transformer paper, TD3+BC's from Fujimoto and Gu (2021) and CQL's from its own runs. Other datasets than the ones
made here: shown beside the tables, not compared with them."""
NAMES = {"bc": "BC", "td3bc": "TD3+BC", "iql": "IQL", "cql": "CQL"}
SIDES = {"distrl": "tab:blue", "distrl bf16": "tab:green", "d3rlpy": "tab:orange"}
"""The columns of the tables and the colours of the curves."""


def normalised(env_id: str, value: float) -> float | None:
    family = env_id.split("-")[0]
    if family not in REFERENCE:
        return None
    low, high = REFERENCE[family]
    return 100.0 * (value - low) / (high - low)


def evaluate(act: Any, env_id: str, episodes: int) -> float:
    """The mean return of ``act(obs) -> action`` over ``episodes`` episodes reset with seeds 0..episodes-1."""
    import gymnasium as gym
    import numpy as np

    env = gym.make(env_id)
    total = 0.0
    for i in range(episodes):
        obs, _ = env.reset(seed=i)
        done = False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(np.asarray(obs, np.float32)[None])[0])
            total += float(reward)
            done = terminated or truncated
    env.close()
    return total / episodes


class DistrlLearner:
    """distrl's side of a run: ``OfflineTrainer.train(stop_at=...)``, its own evaluation, and its checkpoints."""

    def __init__(self, algo: str, settings: dict):
        from distrl.config import RunConfig
        from distrl.training import OfflineTrainer
        from offline_vs_d3rlpy import distrl_config

        run = RunConfig(
            algo=algo,
            env=settings["env"],
            total_steps=settings["steps"],
            seed=settings["seed"],
            quiet=True,
            threads=1,
            device="cpu",
            preset="none",
            eval_every=0,
            eval_episodes=settings["eval_episodes"],
            precision=settings.get("precision", "fp32"),
        )
        self.trainer = OfflineTrainer(run, distrl_config(algo, settings["root"], settings["dataset"]))

    def train_to(self, step: int) -> None:
        self.trainer.train(stop_at=step)

    def act(self, obs: Any) -> Any:
        return self.trainer.act_for_eval(obs, None)

    def save(self, folder: Path) -> None:
        """A checkpoint, then fresh random streams keyed by the step count, as on resuming from it: a run that
        stops and goes on draws what one that does not stop draws."""
        self.trainer.save_checkpoint(folder / "checkpoint")
        self.trainer.start_segment()

    def restore(self, folder: Path) -> None:
        self.trainer.load_checkpoint(folder / "checkpoint")

    def close(self) -> None:
        self.trainer.close()


class D3rlpyLearner:
    """d3rlpy's side of a run: ``update`` on ``sample_transition_batch`` (``fit``'s loop), ``predict`` to act, and
    ``save_model`` (networks and optimizers) with its step count and random states to stop and go on."""

    def __init__(self, algo: str, settings: dict):
        import d3rlpy
        from d3rlpy.algos.utility import build_scalers_with_transition_picker

        from offline_vs_d3rlpy import BATCH_SIZE, d3rlpy_config, d3rlpy_dataset

        d3rlpy.seed(settings["seed"])
        self.dataset, low, high = d3rlpy_dataset(settings["root"], settings["dataset"])
        self.model = d3rlpy_config(algo, low, high).create(device="cpu:0")
        build_scalers_with_transition_picker(self.model, self.dataset)
        self.model.build_with_dataset(self.dataset)
        self.batch_size, self.done = BATCH_SIZE, 0

    def train_to(self, step: int) -> None:
        while self.done < step:
            self.model.update(self.dataset.sample_transition_batch(self.batch_size))
            self.done += 1

    def act(self, obs: Any) -> Any:
        return self.model.predict(obs)

    def save(self, folder: Path) -> None:
        import numpy as np
        import torch

        self.model.save_model(str(folder / "model.d3"))
        kind, keys, position, has_gauss, gauss = np.random.get_state()
        rngs = {"numpy": [kind, keys.tolist(), position, has_gauss, gauss], "torch": torch.get_rng_state().tolist()}
        (folder / "d3rlpy.json").write_text(json.dumps({"done": self.done, **rngs}))

    def restore(self, folder: Path) -> None:
        import numpy as np
        import torch

        self.model.load_model(str(folder / "model.d3"))
        state = json.loads((folder / "d3rlpy.json").read_text())
        self.done = self.model._grad_step = state["done"]  # the counter TD3+BC's delayed actor steps read
        kind, keys, position, has_gauss, gauss = state["numpy"]
        np.random.set_state((kind, np.asarray(keys, dtype=np.uint32), position, has_gauss, gauss))
        torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))

    def close(self) -> None:
        pass


def last_state(folder: Path | None) -> Path | None:
    """The newest complete state under ``folder`` (``at-<step>`` folders; an unfinished one is a ``.partial``)."""
    if folder is None or not folder.is_dir():
        return None
    done = [p for p in folder.glob("at-*") if p.name[3:].isdigit() and (p / "progress.json").exists()]
    return max(done, key=lambda p: int(p.name[3:]), default=None)


def learn(learner: Any, settings: dict, folder: Path | None, start: float) -> tuple[list[list[float]], float]:
    """The curve of evaluations every ``eval_every`` gradient steps, and the wall seconds of the sittings before
    this one (which started at ``start``). With ``folder`` the run goes on from its newest state there and leaves one at every evaluation but the
    last, so that a run stopped (a killed process, a machine that went away) loses at most ``eval_every`` steps."""
    curve: list[list[float]] = []
    wall_before = 0.0
    state = last_state(folder)
    if state is not None:
        progress = json.loads((state / "progress.json").read_text())
        if progress["settings"] != settings:
            raise SystemExit(f"{state} was left by a run with {progress['settings']}, not {settings}: remove it")
        curve, wall_before = progress["curve"], progress["wall_s"]
        learner.restore(state)
    for stop in range(0, settings["steps"] + 1, settings["eval_every"]):
        if curve and stop <= curve[-1][0]:
            continue
        if stop:
            learner.train_to(stop)
        curve.append([stop, evaluate(learner.act, settings["env"], settings["eval_episodes"])])
        if folder is not None and stop + settings["eval_every"] <= settings["steps"]:
            partial = folder / f"at-{stop}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            learner.save(partial)
            wall = wall_before + time.time() - start
            (partial / "progress.json").write_text(json.dumps({"settings": settings, "curve": curve, "wall_s": wall}))
            partial.rename(folder / f"at-{stop}")
            for old in folder.glob("at-*"):
                if old.name != f"at-{stop}":
                    shutil.rmtree(old, ignore_errors=True)
    return curve, wall_before


def child(lib: str, algo: str, settings: dict, folder: Path | None = None) -> dict:
    import torch

    torch.set_num_threads(1)
    start = time.time()
    learner = (DistrlLearner if lib == "distrl" else D3rlpyLearner)(algo, settings)
    try:
        curve, wall_before = learn(learner, settings, folder, start)
    finally:
        learner.close()
    return {
        "lib": lib,
        "algo": algo,
        "seed": settings["seed"],
        "curve": curve,
        "wall_s": wall_before + time.time() - start,
    }


def side(record: dict) -> str:
    """Which column a record belongs to: ``distrl``, ``distrl bf16`` or ``d3rlpy``."""
    precision = record.get("precision", "fp32")
    return record["lib"] if precision == "fp32" else f"{record['lib']} {precision}"


def results_file(dataset: str) -> Path:
    return RESULTS / (dataset.replace("/", "_") + ".json")


def load(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"runs": []}


def dataset_fingerprint(root: str, dataset: str) -> dict[str, float]:
    """What tells one dataset from another made by the same command on another kind of CPU (DATASETS.md): its
    transitions, its episodes and their mean return to two decimals, read through Minari."""
    from distrl.data.minari_store import open_dataset

    data = open_dataset(dataset, root or None)
    returns = [float(episode.rewards.sum(dtype="float64")) for episode in data.iterate_episodes()]
    return {
        "transitions": int(data.total_steps),
        "episodes": len(returns),
        "mean_return": round(statistics.fmean(returns), 2),
    }


def check_dataset(path: Path, here: dict[str, float]) -> str | None:
    """Why the runs of this dataset cannot go into ``path``, whose runs were made on a dataset of the same id with
    another fingerprint (``load(path)["dataset"]``); None where they can."""
    there = load(path).get("dataset")
    if there is None or (
        (there["transitions"], there["episodes"]) == (here["transitions"], here["episodes"])
        and abs(there["mean_return"] - here["mean_return"]) <= 0.011  # the last decimal as another sum rounds it
    ):
        return None

    def said(f: dict) -> str:
        return f"{f['transitions']:,} transitions, {f['episodes']:,} episodes, mean return {f['mean_return']:.2f}"

    return (
        f"dataset: this one has {said(here)}; the runs in {path.name} were made on one with {said(there)}: "
        "the same command made another dataset here (another kind of CPU? see DATASETS.md); give it a new version"
    )


def run_all(args: argparse.Namespace) -> None:
    from distrl.config import ConfigError

    path = results_file(args.dataset)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fingerprint = dataset_fingerprint(args.datasets_dir, args.dataset)
        mismatch = check_dataset(path, fingerprint)
    except ConfigError as e:
        mismatch = str(e)
    if mismatch is not None:
        print(f"error: {mismatch}", file=sys.stderr)
        sys.exit(2)
    if "dataset" not in load(path):
        path.write_text(json.dumps({"dataset": fingerprint, **load(path)}, indent=1) + "\n")
    done = {(side(r), r["algo"], r["seed"]) for r in load(path)["runs"]}
    todo = [
        (lib, algo, seed)
        for seed in args.seeds
        for algo in args.algos
        for lib in args.libs
        if (side({"lib": lib, "precision": args.precision}), algo, seed) not in done
    ]
    print(f"{len(done)} runs in {path}; {len(todo)} to run", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join([str(HERE), str(HERE.parent / "src")])}

    def one(job: tuple[str, str, int]) -> None:
        lib, algo, seed = job
        settings = {
            "env": args.env,
            "dataset": args.dataset,
            "root": str(Path(args.datasets_dir).absolute()),
            "steps": args.steps,
            "eval_every": args.eval_every,
            "eval_episodes": args.eval_episodes,
            "seed": seed,
            **({"precision": args.precision} if args.precision != "fp32" else {}),
        }
        folder = state_folder(args, lib, algo, seed)
        if last_state(folder) is not None:
            print(f"{lib} {algo} seed {seed} goes on from {last_state(folder)}", flush=True)
        out = subprocess.run(
            [sys.executable, __file__, "--child", lib, algo, json.dumps(settings), str(folder or "")],
            capture_output=True,
            text=True,
            env=env,
        )
        if out.returncode != 0:
            print(f"{lib} {algo} seed {seed} failed:\n{out.stderr[-3000:]}", flush=True)
            return
        record = {**json.loads(out.stdout.strip().splitlines()[-1]), **settings}
        with open(path.with_suffix(".lock"), "w") as lock:  # one writer at a time, across sittings run side by side
            fcntl.flock(lock, fcntl.LOCK_EX)
            data = load(path)
            data["runs"].append(record)
            path.write_text(json.dumps(data, indent=1) + "\n")
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        last = record["curve"][-1]
        print(
            f"{side(record)} {algo} seed {seed}: return {last[1]:.1f} at {last[0]:,} ({record['wall_s'] / 60:.0f} min)"
        )

    with ThreadPoolExecutor(args.parallel) as pool:
        list(pool.map(one, todo))


def state_folder(args: argparse.Namespace, lib: str, algo: str, seed: int) -> Path | None:
    """Where a run keeps its state between sittings (with ``--work-dir``)."""
    if not args.work_dir:
        return None
    name = side({"lib": lib, "precision": args.precision}).replace(" ", "-")
    return Path(args.work_dir).absolute() / f"{args.dataset.replace('/', '_')}-{name}-{algo}-s{seed}"


LAST = 5
"""The evaluations at a run's end that the second table averages."""


def summary_lines(runs: list[dict]) -> list[str]:
    """What a results file says: how the runs were made, the final normalised returns per algorithm and library
    (mean ± standard deviation over the seeds that finished, each seed's in brackets; one seed's alone), and the
    same of each run's mean over its last :data:`LAST` evaluations, which one evaluation of a run that swings
    between two returns does not rank. Where the two libraries finished different seeds the last column names each
    one's."""
    first = runs[0]
    env_id, steps = first["env"], max(r["curve"][-1][0] for r in runs)
    known = normalised(env_id, 0.0) is not None
    every = first["curve"][1][0] - first["curve"][0][0] if len(first["curve"]) > 1 else steps
    lines = [
        f"`python benchmarks/offline_learning.py --env {env_id} --dataset {first['dataset']} --steps {steps}`: "
        f"{'normalised return (D4RL reference returns)' if known else 'return'} after {steps:,} gradient steps, "
        f"the deterministic policy over {first['eval_episodes']} episodes; distrl and d3rlpy with the same networks "
        "and hyperparameters (the papers', see benchmarks/offline_vs_d3rlpy.py), one torch thread each.",
        "",
        *_table(runs, env_id, steps, lambda curve: curve[-1][1], paper_scores(env_id, first["dataset"])),
        "",
        f"Each run's mean over its last {LAST} evaluations ({steps - (LAST - 1) * every:,} to {steps:,} steps):",
        "",
        *_table(runs, env_id, steps, lambda curve: statistics.mean(v for _, v in curve[-LAST:])),
    ]
    return lines


def paper_scores(env_id: str, dataset: str) -> dict[str, float]:
    """:data:`PAPERS`' scores for a dataset of this project's named like D4RL's (``hopper/medium-replay-v1``: the
    kind is what lies between the slash and the version); none for other datasets."""
    kind = dataset.rpartition("/")[2].rsplit("-v", 1)[0]
    return PAPERS.get((env_id.split("-")[0], kind), {})


def _table(runs: list[dict], env_id: str, steps: int, score: Any, papers: dict[str, float] | None = None) -> list[str]:
    """A row per algorithm, a column per library: ``score(curve)`` (a return) of each finished run, normalised; with
    ``papers``, a last column of the scores the papers report on D4RL's dataset of the same kind."""
    sides = [s for s in SIDES if any(side(r) == s for r in runs)]
    paper = " | paper, on D4RL's -v2 (another dataset)" if papers else ""
    lines = [f"| algorithm | {' | '.join(sides)} | seeds{paper} |", "|---|" + "---|" * (len(sides) + 1 + bool(papers))]
    for algo in [a for a in NAMES if any(r["algo"] == a for r in runs)]:
        cells, seeds = [], {}
        for lib in sides:
            mine = sorted(
                (r for r in runs if r["algo"] == algo and side(r) == lib and r["curve"][-1][0] == steps),
                key=lambda r: r["seed"],
            )
            seeds[lib] = ", ".join(str(r["seed"]) for r in mine)
            scores = [_score(env_id, score(r["curve"])) for r in mine]
            if len(scores) > 1:
                each = " / ".join(f"{f:.1f}" for f in scores)
                cells.append(f"{statistics.mean(scores):.1f} ± {statistics.stdev(scores):.1f} ({each})")
            else:
                cells.append(f"{scores[0]:.1f}" if scores else "n/a")
        ran = [lib for lib in sides if seeds[lib]]
        same = len({seeds[lib] for lib in ran}) <= 1
        shown = seeds[ran[0]] if same and ran else "; ".join(f"{lib} {seeds[lib]}" for lib in ran)
        reported = f" | {papers[algo]:.1f}" if papers else ""
        lines.append(f"| {NAMES[algo]} | {' | '.join(cells)} | {shown}{reported} |")
    return lines


def _score(env_id: str, value: float) -> float:
    """The normalised return, or the return where D4RL has no reference for the env."""
    score = normalised(env_id, value)
    return value if score is None else score


def draw_curves(runs: list[dict], png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    env_id, dataset = runs[0]["env"], runs[0]["dataset"]
    algos = [a for a in NAMES if any(r["algo"] == a for r in runs)]
    fig, axes = plt.subplots(1, len(algos), figsize=(4.5 * len(algos), 3.5), squeeze=False)
    for ax, algo in zip(axes[0], algos):
        for lib, colour in SIDES.items():
            mine = [r for r in runs if r["algo"] == algo and side(r) == lib]
            for k, r in enumerate(mine):
                xs = [p[0] for p in r["curve"]]
                ax.plot(
                    xs, [_score(env_id, p[1]) for p in r["curve"]], color=colour, alpha=0.8, label=None if k else lib
                )
        ax.set_title(f"{NAMES[algo]} on {dataset}")
        ax.set_xlabel("gradient steps")
        ax.set_ylabel("normalised return" if normalised(env_id, 0.0) is not None else "return")
        ax.legend()
    fig.tight_layout()
    fig.savefig(png, dpi=90)
    plt.close(fig)


def report(args: argparse.Namespace) -> None:
    """The table and the plot of the curves (beside the results file) of what the results file holds."""
    path = results_file(args.dataset)
    runs = load(path)["runs"]
    if not runs:
        raise SystemExit(f"no runs in {path}")
    print("\n".join(summary_lines(runs)))
    draw_curves(runs, path.with_suffix(".png"))
    print(f"plot: {path.with_suffix('.png')}")


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        folder = Path(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else None
        print(json.dumps(child(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]), folder)))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="Hopper-v5")
    parser.add_argument("--dataset", required=True)
    parser.add_argument("--datasets-dir", default=os.environ.get("MINARI_DATASETS_PATH", ""))
    parser.add_argument("--algos", nargs="+", choices=list(NAMES), default=["td3bc", "iql"])
    parser.add_argument("--libs", nargs="+", choices=["distrl", "d3rlpy"], default=["distrl", "d3rlpy"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--steps", type=int, default=200_000)
    parser.add_argument("--eval-every", type=int, default=10_000)
    parser.add_argument("--eval-episodes", type=int, default=10)
    parser.add_argument("--parallel", type=int, default=1)
    parser.add_argument("--precision", choices=("fp32", "bf16"), default="fp32", help="distrl's networks' products")
    parser.add_argument(
        "--work-dir",
        default="",
        help="keep each run's state here at every evaluation, and go on from it: a run that stopped (a killed "
        "process, a machine that went away) loses at most --eval-every steps",
    )
    parser.add_argument("--report", action="store_true", help="only the table and the plot of what is there")
    args = parser.parse_args()
    if args.precision != "fp32" and args.libs != ["distrl"]:
        parser.error(f"precision={args.precision} is distrl's alone: add --libs distrl (d3rlpy trains in float32)")
    if args.report:
        report(args)
    else:
        run_all(args)


if __name__ == "__main__":
    main()
