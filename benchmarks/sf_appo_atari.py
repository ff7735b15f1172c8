"""Sample Factory's APPO on Breakout, CPU only: agent steps per second, for a side-by-side with distrl's APPO.

    python benchmarks/sf_appo_atari.py --steps 200000 --out /tmp/sf.json
    python benchmarks/sf_appo_atari.py --python /work/sfvenv/bin/python --workers 2 --envs-per-worker 4

Sample Factory (2.1.1) needs numpy<2 and gymnasium<1.0, so it lives in its own venv (``--python``,
default /work/sfvenv/bin/python: torch==2.13.0 (CPU), sample-factory==2.1.1, gymnasium==0.29.1,
ale-py==0.9.1, numpy<2). This process only starts it as a subprocess and reads its log; it never
imports sample_factory. The subprocess runs this very file in that venv::

    PYTHON benchmarks/sf_appo_atari.py --sf-child --env=atari_breakout_v5 --device=cpu \\
        --num_workers=2 --num_envs_per_worker=1 --worker_num_splits=1 \\
        --async_rl=True --with_vtrace=True --normalize_returns=False --rollout=32 --recurrence=32 \\
        --batch_size=256 --num_batches_per_epoch=1 --num_epochs=1 \\
        --encoder_conv_architecture=convnet_atari --encoder_conv_mlp_layers 512 --normalize_input=False \\
        --env_frameskip=4 --env_framestack=4 --summaries_use_frameskip=False \\
        --train_for_env_steps=STEPS --seed=0 --save_every_sec=1000000 --save_best_every_sec=1000000 \\
        --experiment=sf_appo_breakout --train_dir=/tmp/sf_appo_XXXX --restart_behavior=overwrite

which is ``python -m sf_examples.atari.train_atari`` (the Atari example's defaults under these flags)
plus one env, ``atari_breakout_v5``: ``ALE/Breakout-v5`` made at ``frameskip=1`` (its sticky actions,
0.25, kept, as distrl's Atari family keeps them) under the example's own wrappers: no-ops, frame
skip 4 with max-pooling, episodic life, FIRE at reset, reward clipping, 84x84 grey, 4 stacked
frames. (The stock ``atari_breakout`` is ``BreakoutNoFrameskip-v4``, no sticky actions; ale-py 0.9
registers its ids only when imported, which the stock example never does, so it cannot find it.)
One fix is applied in every Sample Factory process: 2.1.1's learner crashes recording train summaries
under V-trace (see ``fix_vtrace_summaries``).

The flags: APPO is ``--async_rl=True --with_vtrace=True`` (the Atari example's defaults are
synchronous PPO); V-trace requires ``--recurrence`` equal to ``--rollout`` and no return
normalisation. Rollout 32, batches of 256, one epoch are distrl's ``APPOConfig`` defaults (Sample
Factory's own APPO defaults, except its batch of 1024). ``convnet_atari`` with ``--encoder_conv_mlp_layers
512`` is the Nature CNN (32 8x8/4, 64 4x4/2, 64 3x3/1, ReLU, linear 512, ReLU; shared actor-critic
with linear heads); ``--normalize_input=False`` leaves only the division by 255 (``obs_scale``).
``--num_envs_per_worker`` defaults to the Atari example's 1 (``--envs-per-worker 4`` gives distrl's
APPO default of 8 envs with 2 workers); double-buffered sampling (``--worker_num_splits=2``) is used
whenever that number is even.

Counting: with ``--summaries_use_frameskip=False`` Sample Factory counts agent steps (calls of the
frame-skipped env's ``step``, 4 emulator frames each), not frames; its default for Atari (True)
multiplies by 4. Its "Total num frames" is the learner's count of steps trained on; its "Samples"
the inference worker's count of steps it chose actions for (collected). Both are logged every 5 s
with a timestamp. ``sps`` is the learner's count from its first report with a trained batch to its
last report, over the time between them: steady state, after the processes, the envs and the
TorchScript encoder have started, like distrl's ``steps / train_s``. ``collected_sps`` is the same
window on the collected count, ``sps_wall`` the final count (``steps``: the run stops once the
learner has passed ``--steps``) over the whole subprocess, start-up included, and ``sf_fps`` Sample
Factory's own closing figure (its count after the learner's first report, over its main loop's
time). The other hyperparameters are the Atari example's (lr 2.5e-4 decayed linearly, entropy 0.01,
gradient norm 0.5, clip 0.1); they do not change the cost of a step.

Threads: Sample Factory sets one torch thread in the learner, the inference worker and each rollout
worker (with 2 rollout workers on 2 cores, each is pinned to a core of its own by its default
``--set_workers_cpu_affinity=True``, and runs at nice +10); the learner and the inference worker
are not pinned. OMP_NUM_THREADS is left as the caller's environment has it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime

ENV_ID = "ALE/Breakout-v5"
SF_ENV = "atari_breakout_v5"
DEFAULT_PYTHON = "/work/sfvenv/bin/python"
PACKAGES = ("sample-factory", "torch", "gymnasium", "ale-py", "numpy")

_STAMP = r"^\[(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3})\]\[\d+\] "
FPS_LINE = re.compile(_STAMP + r"Fps is .*?Total num frames: (\d+)\..*?Samples: (\d+)\.", re.M)
COLLECTED_LINE = re.compile(r"Collected \{0: (\d+)\}, FPS: ([\d.]+)")


def worker_num_splits(envs_per_worker: int) -> int:
    """Double-buffered sampling (Sample Factory's default) when the envs split evenly, else none."""
    return 2 if envs_per_worker % 2 == 0 else 1


def sf_flags(args: argparse.Namespace, train_dir: str) -> list[str]:
    """Sample Factory's command-line flags for APPO on Breakout with the Nature CNN, on CPU."""
    return [
        f"--env={SF_ENV}",
        "--device=cpu",
        f"--num_workers={args.workers}",
        f"--num_envs_per_worker={args.envs_per_worker}",
        f"--worker_num_splits={worker_num_splits(args.envs_per_worker)}",
        "--async_rl=True",
        "--with_vtrace=True",
        "--normalize_returns=False",
        f"--rollout={args.rollout}",
        f"--recurrence={args.rollout}",
        f"--batch_size={args.batch_size}",
        "--num_batches_per_epoch=1",
        "--num_epochs=1",
        "--encoder_conv_architecture=convnet_atari",
        "--encoder_conv_mlp_layers",
        "512",
        "--normalize_input=False",
        "--env_frameskip=4",
        "--env_framestack=4",
        "--summaries_use_frameskip=False",
        f"--train_for_env_steps={args.steps}",
        f"--seed={args.seed}",
        "--save_every_sec=1000000",
        "--save_best_every_sec=1000000",
        "--experiment=sf_appo_breakout",
        f"--train_dir={train_dir}",
        "--restart_behavior=overwrite",
    ]


def versions(python: str) -> dict:
    code = f"import importlib.metadata as m, json; print(json.dumps({{p: m.version(p) for p in {PACKAGES!r}}}))"
    out = subprocess.run([python, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def _seconds(stamp: str) -> float:
    return datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S,%f").timestamp()


def parse_log(text: str) -> dict:
    """The rates defined in the module docstring, from Sample Factory's sf_log.txt."""
    reports = [(_seconds(t), int(trained), int(collected)) for t, trained, collected in FPS_LINE.findall(text)]
    reports = [r for r in reports if r[1] > 0]  # from the learner's first trained batch on
    if len(reports) < 2:
        raise RuntimeError(f"fewer than two 'Fps is' reports in the log ({len(reports)}): run more --steps")
    (t0, trained0, collected0), (t1, trained1, collected1) = reports[0], reports[-1]
    final = COLLECTED_LINE.search(text)
    if final is None:
        raise RuntimeError("no closing 'Collected {0: N}, FPS: X' line: the run did not finish")
    return {
        "sps": (trained1 - trained0) / (t1 - t0),
        "collected_sps": (collected1 - collected0) / (t1 - t0),
        "window_s": t1 - t0,
        "window_steps": trained1 - trained0,
        "steps": int(final.group(1)),
        "sf_fps": float(final.group(2)),
    }


def run(args: argparse.Namespace) -> dict:
    train_dir = tempfile.mkdtemp(prefix="sf_appo_", dir="/tmp")
    cmd = [args.python, os.path.abspath(__file__), "--sf-child", *sf_flags(args, train_dir)]
    print(" ".join(cmd), file=sys.stderr)
    stderr_path = os.path.join(train_dir, "stderr.txt")
    try:
        with open(stderr_path, "w") as err:
            start = time.perf_counter()
            proc = subprocess.Popen(cmd, cwd=train_dir, stdout=err, stderr=err, start_new_session=True)
            try:
                code = proc.wait(timeout=args.timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # its workers too: they share its new session
                proc.wait()
                code = None
            wall_s = time.perf_counter() - start
        log_path = os.path.join(train_dir, "sf_appo_breakout", "sf_log.txt")
        if code != 0 or not os.path.exists(log_path):
            with open(stderr_path) as f:
                tail = f.read()[-3000:]
            why = f"timed out after {args.timeout_s} s" if code is None else f"exited {code}"
            raise RuntimeError(f"Sample Factory {why}:\n{tail}")
        with open(log_path) as f:
            result = parse_log(f.read())
    finally:
        if not args.keep:
            shutil.rmtree(train_dir, ignore_errors=True)
    result["sps_wall"] = result["steps"] / wall_s
    result["wall_s"] = wall_s
    result["settings"] = {
        "env": ENV_ID,
        "sticky_actions": 0.25,
        "frameskip": 4,
        "framestack": 4,
        "network": "Nature CNN (convnet_atari + 512), shared actor-critic",
        "workers": args.workers,
        "envs_per_worker": args.envs_per_worker,
        "worker_num_splits": worker_num_splits(args.envs_per_worker),
        "rollout": args.rollout,
        "batch_size": args.batch_size,
        "epochs": 1,
        "device": "cpu",
        "counted": "agent steps (frame-skipped env.step calls), trained on by the learner",
        "command": cmd,
        "versions": versions(args.python),
    }
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--python", default=DEFAULT_PYTHON, help="python of the venv that has sample-factory")
    p.add_argument("--steps", type=int, default=200_000, help="agent steps to train for")
    p.add_argument("--workers", type=int, default=2, help="rollout worker processes")
    p.add_argument("--envs-per-worker", type=int, default=1, help="envs per rollout worker (Atari example: 1)")
    p.add_argument("--rollout", type=int, default=32, help="steps per env per trajectory")
    p.add_argument("--batch-size", type=int, default=256, help="agent steps per gradient step")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout-s", type=float, default=3600.0, help="kill the run after this long")
    p.add_argument("--keep", action="store_true", help="keep the train dir (log, config) under /tmp")
    p.add_argument("--out", help="write the result as JSON here too")
    args = p.parse_args()
    result = run(args)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


# ---- the child: runs in Sample Factory's venv (spawned workers re-import this file, so imports stay inside) ----


def make_breakout_v5(env_name, cfg, env_config, render_mode=None):
    """Sample Factory's ``make_atari_env`` (sf_examples/atari/atari_utils.py) on ``ALE/Breakout-v5``."""
    import ale_py  # noqa: F401 - registers the ALE/ ids with gymnasium
    import gymnasium as gym
    from sample_factory.envs.env_wrappers import (
        ClipRewardEnv,
        EpisodicLifeEnv,
        FireResetEnv,
        MaxAndSkipEnv,
        NoopResetEnv,
        NumpyObsWrapper,
    )

    env = gym.make(ENV_ID, frameskip=1, render_mode=render_mode)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = NoopResetEnv(env, noop_max=30)
    env = MaxAndSkipEnv(env, skip=cfg.env_frameskip)
    env = EpisodicLifeEnv(env)
    if "FIRE" in env.unwrapped.get_action_meanings():
        env = FireResetEnv(env)
    env = ClipRewardEnv(env)
    env = gym.wrappers.ResizeObservation(env, (84, 84))
    env = gym.wrappers.GrayScaleObservation(env)
    env = gym.wrappers.FrameStack(env, cfg.env_framestack)
    return NumpyObsWrapper(env)


def fix_vtrace_summaries() -> None:
    """Sample Factory 2.1.1 (the latest on PyPI) crashes its learner at the first train summary under V-trace:
    ``_record_summaries`` reads ``mb.advantages``, which only GAE fills (upstream PRs #278, #286, #332, after
    the release). Hand it the minibatch's V-trace advantages (normalised) instead; training is unchanged."""
    from sample_factory.algo.learning.learner import Learner

    record = Learner._record_summaries

    def record_with_vtrace(self, var):
        if "advantages" not in var.mb:
            var.mb.advantages = var.adv
        return record(self, var)

    Learner._record_summaries = record_with_vtrace


def sf_child(argv: list[str]) -> int:
    """``python -m sf_examples.atari.train_atari`` with ``atari_breakout_v5`` registered."""
    from sample_factory.envs.env_utils import register_env
    from sample_factory.train import run_rl
    from sf_examples.atari.train_atari import parse_atari_args

    fix_vtrace_summaries()
    register_env(SF_ENV, make_breakout_v5)
    return run_rl(parse_atari_args(argv))


if __name__ == "__mp_main__":  # a worker Sample Factory spawned from sf_child (spawn re-imports this file)
    fix_vtrace_summaries()  # the learner runs in one of them

if __name__ == "__main__":
    if sys.argv[1:2] == ["--sf-child"]:
        sys.exit(sf_child(sys.argv[2:]))
    main()
