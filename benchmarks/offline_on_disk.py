"""An offline dataset larger than a run's memory: TD3+BC with the dataset in memory and with ``--dataset-on-disk``,
each in a child process whose private memory is capped below the decoded dataset.

    python benchmarks/offline_on_disk.py             # prints the table
    python benchmarks/offline_on_disk.py --write     # and writes it to docs/benchmarks.md
    python benchmarks/offline_on_disk.py --transitions 20000 --limit-mb 700 --steps 30   # a quick look

The dataset is made here, nothing is downloaded: ``--transitions`` (250,000) of uniformly random actions in
``WideEnv`` below, whose observations are ``--obs-dim`` (1,024) float32 values, written as a Minari dataset in a
temporary folder. Decoded, a transition's observation and next observation take 2 x 4 x 1,024 bytes: the dataset
is 2 GB in memory.

Each child trains TD3+BC (``--steps`` gradient steps, 300, after 20 untimed) in one process with one torch thread,
``--preset none``, networks (256, 256), batch 256. Capped children run in a memory cgroup of their own (cgroup v1,
made under this process's, which needs the right to write there) limited to ``--limit-mb`` (1,200): everything the
child holds counts (its own memory and the page cache of the files it reads), and the kernel kills it when what it
holds cannot be brought under the limit; the page cache of files it only reads can be, its own memory cannot.
Uncapped children time the same run both ways on the same dataset: what reading batches from the files costs once
the operating system has their pages cached. Reported per child: whether it finished (or how it failed), the peak
of its anonymous resident memory (``RssAnon`` in ``/proc/self/status``, sampled every 10 ms), its ``VmHWM`` (peak
resident memory, the dataset's cached file pages included), the seconds to load the dataset and the gradient steps
a second after it. Linux only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE))
from harness import child_env, markdown_table, write_section  # noqa: E402

ENV_ID = "offline_on_disk:WideEnv"
DATASET = "wide/random-v0"


class WideEnv(gym.Env):
    """Observations of ``obs_dim`` values drawn at random each step, four Box actions, a reward of minus the
    actions' squared norm, episodes of 1,000 steps: an env whose transitions are large, for a large dataset."""

    def __init__(self, obs_dim: int = 1024):
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (obs_dim,), np.float32)
        self.action_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
        self.t = 0

    def _obs(self) -> np.ndarray:
        return self.np_random.uniform(-1.0, 1.0, self.observation_space.shape).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def step(self, action):
        self.t += 1
        return self._obs(), -float(np.square(action).sum()), False, self.t >= 1000, {}


def _status(field: str) -> int:
    """A field of /proc/self/status in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(field)


def child(root: str, on_disk: bool, steps: int, obs_dim: int) -> dict:
    import torch

    from distrl.config import RunConfig, TD3BCConfig
    from distrl.training import OfflineTrainer

    torch.set_num_threads(1)
    peak_anon = [_status("RssAnon")]
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.01):
            peak_anon[0] = max(peak_anon[0], _status("RssAnon"))

    threading.Thread(target=sample, daemon=True).start()
    run = RunConfig(
        algo="td3bc",
        env=ENV_ID,
        env_kwargs=(f"obs_dim={obs_dim}",),
        total_steps=20 + steps,
        seed=0,
        quiet=True,
        preset="none",
        device="cpu",
        threads=1,
        eval_every=0,
    )
    cfg = TD3BCConfig(dataset=DATASET, datasets_dir=root, dataset_on_disk=on_disk)
    result: dict = {"finished": False}
    with tempfile.TemporaryDirectory() as tmp:
        try:
            trainer = OfflineTrainer(run, cfg, run_dir=Path(tmp) / "run", log=False)
            start = time.perf_counter()
            trainer.train(stop_at=20)  # loads the dataset
            result["load_s"] = time.perf_counter() - start
            start = time.perf_counter()
            trainer.train(stop_at=20 + steps)
            result["steps_per_s"] = steps / (time.perf_counter() - start)
            result["finished"] = True
            trainer.close()
        except MemoryError:
            result["error"] = "MemoryError"
    done.set()
    result["peak_anon_mb"] = max(peak_anon[0], _status("RssAnon")) / 2**20
    result["vm_hwm_mb"] = _status("VmHWM") / 2**20
    return result


@contextlib.contextmanager
def memory_cgroup(limit_mb: int) -> Iterator[Callable[[], None] | None]:
    """A cgroup v1 memory cgroup limited to ``limit_mb`` (none for 0), under this process's: yields what a child
    calls before it starts to join it, and removes the cgroup afterwards."""
    if not limit_mb:
        yield None
        return
    line = next(x for x in Path("/proc/self/cgroup").read_text().splitlines() if ":memory:" in x)
    group = Path("/sys/fs/cgroup/memory") / line.split(":", 2)[2].lstrip("/") / f"distrl-bench-{os.getpid()}"
    group.mkdir()
    try:
        (group / "memory.limit_in_bytes").write_text(str(limit_mb * 2**20))
        procs = str(group / "cgroup.procs")

        def enter() -> None:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

        yield enter
    finally:
        group.rmdir()


def make_dataset(root: Path, transitions: int, obs_dim: int) -> float:
    from distrl.data.minari_store import write_dataset
    from distrl.data.recorder import record_episodes
    from distrl.envs.vector import make_env

    env = make_env(ENV_ID, 4, env_kwargs={"obs_dim": obs_dim})
    try:
        episodes = record_episodes(env, None, transitions, seed=0, random=True)
        spaces = env.single_observation_space, env.single_action_space
        write_dataset(DATASET, episodes, ENV_ID, *spaces, "random", str(root))
    finally:
        env.close()
    return sum(len(e["rewards"]) for e in episodes) * 2 * 4 * obs_dim / 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--transitions", type=int, default=250_000)
    parser.add_argument("--obs-dim", type=int, default=1024)
    parser.add_argument("--limit-mb", type=int, default=1200)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--write", action="store_true")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        root, on_disk, steps, obs_dim = args.child
        print(json.dumps(child(root, on_disk == "1", int(steps), int(obs_dim))))
        return
    import distrl

    env = child_env({"OMP_NUM_THREADS": "1"})
    with tempfile.TemporaryDirectory() as tmp:
        sys.path.insert(0, str(HERE))
        gib = make_dataset(Path(tmp), args.transitions, args.obs_dim)
        print(f"dataset: {args.transitions:,} transitions, {gib:.2f} GiB decoded", flush=True)
        rows = []
        for on_disk in (False, True, False, True):
            limit = args.limit_mb if len(rows) < 2 else 0
            flags = [tmp, "1" if on_disk else "0", str(args.steps), str(args.obs_dim)]
            with memory_cgroup(limit) as enter:
                out = subprocess.run(
                    [sys.executable, __file__, "--child", *flags],
                    capture_output=True,
                    text=True,
                    env=env,
                    preexec_fn=enter,
                )
            if out.returncode == -9:
                result = {"finished": False, "error": "killed by the kernel at the memory limit (SIGKILL)"}
            elif out.returncode != 0:
                result = {"finished": False, "error": f"exit {out.returncode}: {out.stderr.strip()[-300:]}"}
            else:
                result = json.loads(out.stdout.strip().splitlines()[-1])
            result.update(on_disk=on_disk, limit_mb=limit)
            print(json.dumps(result), flush=True)
            rows.append(result)

    def cell(r: dict, key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else "n/a"

    table = markdown_table(
        ["dataset", "memory limit", "finished", "peak RssAnon (MB)", "VmHWM (MB)", "load (s)", "gradient steps/s"],
        [
            [
                "on disk" if r["on_disk"] else "in memory",
                f"{r['limit_mb']:,} MB" if r["limit_mb"] else "none",
                "yes" if r["finished"] else f"no: {r.get('error', '?').splitlines()[-1][:80]}",
                cell(r, "peak_anon_mb", ".0f"),
                cell(r, "vm_hwm_mb", ".0f"),
                cell(r, "load_s", ".1f"),
                cell(r, "steps_per_s", ".0f"),
            ]
            for r in rows
        ],
    )
    command = "python benchmarks/offline_on_disk.py" + (
        f" --transitions {args.transitions} --obs-dim {args.obs_dim} --limit-mb {args.limit_mb} --steps {args.steps}"
    )
    body = "\n".join(
        [
            f"`{command}` — {time.strftime('%Y-%m-%d')}, {os.uname().machine}, nothing else running; distrl "
            f"{distrl.__version__}, one torch thread, a child process per row, in this order.",
            "",
            f"TD3+BC on {args.transitions:,} transitions of {args.obs_dim} float32 observations ({gib:.2f} GiB "
            "decoded), made by the script. The limit is a memory cgroup's around the child: its own memory and the "
            "page cache of what it reads count, and the kernel kills it when they cannot be brought under the "
            "limit (a file's cached pages can be dropped, its own memory cannot). RssAnon is the process's own "
            "memory; VmHWM adds the file pages it had resident.",
            "",
            *table,
        ]
    )
    print(body)
    if args.write:
        write_section("Offline RL: a dataset larger than memory", body)


if __name__ == "__main__":
    main()
