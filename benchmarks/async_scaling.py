"""APPO with asynchronous actors (``--strategy pipeline``) on a slow env: SPS with 1, 2, 4, 8 and 16 actors
against N x one actor's, the learner's busy fraction and the policy lag; on this machine's own Ray, and on a
two-node Ray cluster started on this machine.

    python benchmarks/async_scaling.py                        # embedded Ray; writes its section of docs/benchmarks.md
    python benchmarks/async_scaling.py --cluster two-node     # the same on two Ray nodes (head + one more)
    python benchmarks/async_scaling.py --quick                # 1 and 2 actors, 5 s each, once; prints, writes nothing

Each mode takes about 20-25 minutes on a 2-core machine with the defaults (5 actor counts x 3 runs x about 60 s
of training plus 10-30 s of start-up and shut-down each); run it on an otherwise idle machine. Besides the
section of docs/benchmarks.md it writes the raw summaries to docs/results/async_scaling/MODE.json and a chart to
docs/results/async_scaling/MODE.png (MODE: local or two-node).

The env is ``slow_envs:SleepyCartPole``: CartPole-v1 whose every step also sleeps ``--step-ms`` (4 ms), a remote
simulator whose step costs wall time but little CPU. Each actor steps its ``--n-envs`` (4) envs one after the other
(Gymnasium's SyncVectorEnv: distrl's choice for an env class without a vector entry point), so one actor collects at
most 1000 / step_ms = 250 steps/s whatever its env count, and N actors should collect N times what one does even on
2 cores. APPO (``--preset none``, 64x64 MLPs, fragments of 4 envs x 32 steps = 128 steps, minibatch 128, one epoch,
the default ``--fragments-per-step``: one fragment per actor in every learner step, so the learner batch grows with
N) trains in the driver on the CPU. Ray reserves ``--worker-cpus`` 0.1 per actor, so that 16 fit on 2 cores.

Every run trains ``--seconds`` x 250 steps per actor (rounded up to whole fragments), so each lasts about as long.
SPS is summary.json's ``sps`` = ``total_steps`` / ``train_s``: the training loop only, without the actors'
start-up (``startup_s``) or the final evaluation (1 episode of at most 100 steps: it cannot be turned off).
Actor counts alternate over ``--repeats`` rounds; medians are reported.

``--cluster two-node`` starts a Ray cluster of two nodes on this machine before the first run, as
tests/ray_two_nodes.py does (``ray.cluster_utils.Cluster``: a head and a second raylet with ``--node-cpus`` CPUs
each), passes its address to every run with ``--ray-address``, and shuts it down at the end, whatever happens.
Ray's default placement fills the head node to half its CPUs before it uses the other (10 actors of 0.1 CPU on 2),
so the cluster is started with ``scheduler_spread_threshold`` 0 (each actor to the less loaded node: about half on
each); ``--no-spread`` keeps Ray's default. The table says how many actors each node held.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from harness import alternating, child_env, markdown_table, measured_run, median, write_section

RESULTS = Path(__file__).parents[1] / "docs" / "results" / "async_scaling"
ENV = "slow_envs:SleepyCartPole"
ACTORS = (1, 2, 4, 8, 16)
QUICK_ACTORS, QUICK_SECONDS = (1, 2), 5.0
N_ENVS, N_STEPS = 4, 32
FRAGMENT = N_ENVS * N_STEPS
WORKER_CPUS = 0.1  # what Ray reserves per actor, so that 16 actors fit on 2 cores
APPO = [
    *("--preset", "none", "--net-arch", "64", "64", "--device", "cpu"),
    *("--n-envs", str(N_ENVS), "--n-steps", str(N_STEPS), "--batch-size", str(FRAGMENT)),
    # the final evaluation cannot be turned off: one episode of at most 100 steps keeps it under half a second
    *("--eval-episodes", "1", "--eval-max-steps", "100"),
]
TITLES = {
    "local": "APPO: asynchronous actors on a slow env, 1-16 actors",
    "two-node": "APPO: asynchronous actors on a slow env, 1-16 actors, two Ray nodes",
}


class TwoNodes:
    """A Ray cluster of two nodes on this machine, in a child process (this script with ``--serve-cluster``):
    its address, node ids and environment for the runs; :meth:`close` shuts it down and ends every process it
    started."""

    def __init__(self, node_cpus: int, spread: bool):
        self.tmp = tempfile.mkdtemp(prefix="as", dir="/tmp")  # short: Ray's socket paths live under it
        self.env = child_env({"RAY_TMPDIR": self.tmp})
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--serve-cluster", str(node_cpus)]
            + ([] if spread else ["--no-spread"]),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=self.env,
        )
        line = self.proc.stdout.readline()
        if not line:
            self.close()
            raise RuntimeError("the two-node Ray cluster did not start (its error is above)")
        info = json.loads(line)
        self.address = info["address"]
        self.nodes = {info["head"]: "head", info["second"]: "second"}

    def close(self) -> None:
        try:  # everything the cluster started: its GCS, raylets, workers
            started = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            started = []
        if self.proc.stdin:
            self.proc.stdin.close()  # end of input: the child shuts the cluster down
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for proc in started:
            try:
                proc.kill()
            except psutil.Error:  # already gone, as it should be
                pass
        for proc in psutil.process_iter(["cmdline"]):  # and any of it that left the tree, by its own temp dir
            try:
                if proc.pid != os.getpid() and any(self.tmp in arg for arg in proc.info["cmdline"] or ()):
                    proc.kill()
            except psutil.Error:
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)


def serve_cluster(node_cpus: int, spread: bool) -> None:
    """In the child: start the two nodes, print their address and ids as one JSON line, wait for the end of
    input, shut them down (as tests/ray_two_nodes.py does). ``spread``: Ray places each actor on the less
    loaded node, so that both nodes hold about half of them whatever their number."""
    from ray.cluster_utils import Cluster

    head = {"num_cpus": node_cpus, "include_dashboard": False}
    if spread:  # Ray's default packs actors onto the head until it is half full: 10 of 0.1 CPU on 2 CPUs
        head["_system_config"] = {"scheduler_spread_threshold": 0.0}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        second = cluster.add_node(num_cpus=node_cpus)
        cluster.wait_for_nodes()
        info = {"address": cluster.address, "head": cluster.head_node.node_id, "second": second.node_id}
        print(json.dumps(info), flush=True)
        sys.stdin.read()
    finally:
        cluster.shutdown()


def steps_per_actor(seconds: float, step_ms: float) -> int:
    """``seconds`` of one actor's ceiling (1000 / step_ms steps/s), rounded up to whole fragments."""
    return max(1, math.ceil(seconds * 1000.0 / step_ms / FRAGMENT)) * FRAGMENT


def run_once(actors: int, steps: int, step_ms: float, seed: int, cluster: TwoNodes | None, timeout_s: float) -> dict:
    """One APPO run in its own process: its summary.json with peak memory and the process's wall time."""
    args = [
        *("appo", ENV, "--env-kwargs", f"step_ms={step_ms:g}", *APPO),
        *("--strategy", "pipeline", "--workers", str(actors), "--worker-cpus", str(WORKER_CPUS)),
        *("--total-steps", str(steps * actors), "--seed", str(seed)),
        *(("--ray-address", cluster.address) if cluster else ()),
    ]
    env = cluster.env if cluster else child_env()
    others = [cluster.proc.pid] if cluster else []
    summary = measured_run(args, env, f"async_scaling: {actors} actors, seed {seed}", timeout_s, *others)
    nodes = [row[0]["node"] for row in summary.get("placement", {}).get("generators", []) if row]
    names = cluster.nodes if cluster else {}
    per_node: dict[str, int] = {}
    for node in nodes:
        name = names.get(node, "this node" if not cluster else node[:8])
        per_node[name] = per_node.get(name, 0) + 1
    summary.update(actors_per_node=per_node)
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", choices=("local", "two-node"), default="local", help="Ray: embedded, or two nodes")
    parser.add_argument("--actors", type=int, nargs="+", default=None, help=f"actor counts (default {ACTORS})")
    parser.add_argument("--seconds", type=float, default=None, help="training seconds per run at the ceiling (60)")
    parser.add_argument("--repeats", type=int, default=None, help="runs per actor count (3)")
    parser.add_argument("--step-ms", type=float, default=4.0, help="the env's sleep per step")
    parser.add_argument("--node-cpus", type=int, default=2, help="two-node: CPUs each Ray node declares")
    parser.add_argument(
        "--spread",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="two-node: Ray places each actor on the less loaded node (its default fills the head first)",
    )
    parser.add_argument("--quick", action="store_true", help="1 and 2 actors, 5 s, once; prints, writes nothing")
    parser.add_argument("--json", type=Path, default=None, help="raw results (default docs/results/async_scaling/)")
    parser.add_argument("--serve-cluster", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_cluster is not None:
        serve_cluster(args.serve_cluster, args.spread)
        return
    actor_counts = args.actors or (QUICK_ACTORS if args.quick else ACTORS)
    seconds = args.seconds or (QUICK_SECONDS if args.quick else 60.0)
    repeats = args.repeats or (1 if args.quick else 3)
    steps = steps_per_actor(seconds, args.step_ms)
    timeout_s = 10 * steps / (1000.0 / args.step_ms) + 300  # a hung run fails instead of stalling the benchmark
    machine = f"{os.cpu_count()} CPUs, {platform.machine()}, {platform.platform()}, Python {platform.python_version()}"
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"{machine}; load average at start {load}; Ray: {args.cluster}", flush=True)
    results: dict[int, list[dict]] = {n: [] for n in actor_counts}
    cluster = None
    try:
        if args.cluster == "two-node":
            cluster = TwoNodes(args.node_cpus, args.spread)
            print(f"two-node cluster at {cluster.address}", flush=True)
        for i, n in enumerate(alternating(list(actor_counts), repeats)):
            r = run_once(n, steps, args.step_ms, i // len(actor_counts), cluster, timeout_s)
            results[n].append(r)
            print(
                f"  N={n}: {r['sps']:,.0f} SPS, learner busy {r['learner_busy_fraction']:.1%}, lag mean "
                f"{r['policy_lag_mean']:.2f} p95 {r['policy_lag_p95']:.0f} max {r['policy_lag_max']:.0f}, dropped "
                f"{r['fragments_dropped_for_lag_fraction']:.1%}, generators busy {r['generator_utilisation']:.0%}, "
                f"train {r['train_s']:.1f} s, start-up {r['startup_s']:.1f} s, wall {r['process_wall_s']:.1f} s, "
                f"actors {r['actors_per_node']}, RSS {r['learner_rss_mb']:.0f} / {r['tree_rss_mb']:.0f} MB",
                flush=True,
            )
            for line in [*r["events"], *r["stderr"].splitlines()[-5:]]:
                print(f"    {line}", flush=True)
    finally:
        if cluster is not None:
            cluster.close()
    load_end = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    settings = dict(
        cluster=args.cluster,
        node_cpus=args.node_cpus if cluster else None,
        spread=args.spread if cluster else None,
        step_ms=args.step_ms,
        seconds=seconds,
        steps_per_actor=steps,
        repeats=repeats,
        machine=machine,
        load_start=load,
        load_end=load_end,
        date=time.strftime("%Y-%m-%d"),
        command=" ".join(["python", "benchmarks/async_scaling.py", *sys.argv[1:]]),
    )
    body = report(results, settings)
    out = args.json or (None if args.quick else RESULTS / f"{args.cluster}.json")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({**settings, "runs": {str(n): runs for n, runs in results.items()}}, indent=1))
        print(f"raw results: {out}")
    if args.quick:
        print(body)
        return
    chart = chart_png(results, settings, RESULTS / f"{args.cluster}.png")
    if chart is not None:
        body += f"\n\n![SPS against actors, {args.cluster}](results/async_scaling/{chart.name})"
    write_section(TITLES[args.cluster], body)


def report(results: dict[int, list[dict]], settings: dict) -> str:
    def med(n: int, key: str) -> float:
        return median([r[key] for r in results[n]])

    one = med(1, "sps") if 1 in results else None
    ceiling = 1000.0 / settings["step_ms"]
    two_node = settings["cluster"] == "two-node"
    rows, ratios = [], {}
    for n in results:
        sps = med(n, "sps")
        ratios[n] = None if one is None else sps / (n * one)
        nodes: dict[str, list[int]] = {}
        for r in results[n]:
            for name, count in r["actors_per_node"].items():
                nodes.setdefault(name, []).append(count)
        rows.append(
            [
                str(n),
                f"{settings['steps_per_actor'] * n:,}",
                f"{sps:,.0f}",
                "n/a" if ratios[n] is None else f"{ratios[n]:.2f}",
                f"{sps / (n * ceiling):.2f}",
                f"{med(n, 'learner_busy_fraction'):.1%}",
                f"{med(n, 'policy_lag_mean'):.2f} / {med(n, 'policy_lag_p95'):.0f} / {med(n, 'policy_lag_max'):.0f}",
                f"{med(n, 'fragments_dropped_for_lag_fraction'):.1%}",
                f"{med(n, 'generator_utilisation'):.0%}",
                f"{med(n, 'train_s'):.1f}",
                f"{med(n, 'startup_s'):.1f}",
                *([" / ".join(f"{k} {median(v):.0f}" for k, v in sorted(nodes.items()))] if two_node else []),
                f"{med(n, 'learner_rss_mb'):,.0f} / {med(n, 'tree_rss_mb'):,.0f}",
            ]
        )
    met = [n for n, ratio in ratios.items() if ratio is not None and ratio >= 0.8]
    missed = [n for n, ratio in ratios.items() if ratio is not None and ratio < 0.8]
    goal = (
        "n/a (no 1-actor run)"
        if one is None
        else f"met with {', '.join(map(str, met)) or 'no'} actors"
        + (f"; not met with {', '.join(map(str, missed))}" if missed else "")
    )
    where = (
        f"a Ray cluster of two nodes on this machine (`ray.cluster_utils.Cluster`: a head and a second raylet, "
        f"{settings['node_cpus']} CPUs each, joined with `--ray-address`"
        + (", `scheduler_spread_threshold` 0: each actor goes to the less loaded node)" if settings["spread"] else ")")
        if two_node
        else "the run's embedded Ray"
    )
    lines = [
        f"`{settings['command']}` — {settings['date']}, {settings['machine']}, load average at start "
        f"{settings['load_start']}, at the end {settings['load_end']}. APPO (`--preset none`, 64x64 MLPs, "
        f"{N_ENVS} envs x {N_STEPS} steps = {FRAGMENT}-step fragments, minibatch {FRAGMENT}, one epoch, the default "
        f"`--fragments-per-step`: one fragment per actor per learner step, learner on the CPU) with "
        f"`--strategy pipeline --worker-cpus {WORKER_CPUS}` on {where}, on `slow_envs:SleepyCartPole`: CartPole-v1 "
        f"sleeping {settings['step_ms']:g} ms per step, each actor's {N_ENVS} envs stepped one after the other, so "
        f"one actor collects at most {ceiling:,.0f} steps/s. {settings['steps_per_actor']:,} steps per actor; runs "
        f"per actor count: {settings['repeats']}, alternating, medians. Goal: SPS ≥ 0.8 × N × one actor's, up to "
        f"16 actors: {goal}.",
        "",
        *markdown_table(
            [
                "actors",
                "total steps",
                "SPS",
                "vs actors × 1 actor's (goal ≥ 0.8)",
                "vs the sleep's ceiling",
                "learner busy",
                "lag mean / p95 / max (versions)",
                "fragments dropped for lag",
                "actors busy",
                "training s",
                "start-up s",
                *(["actors per node"] if two_node else []),
                "peak RSS learner / all processes (MB)",
            ],
            rows,
        ),
        "",
        "SPS = summary.json's `sps`: `total_steps` / `train_s`, the training loop without the actors' start-up "
        f"(the column beside: N processes importing torch at once) or the final evaluation. The sleep's ceiling is "
        f"actors × {ceiling:,.0f}/s. Learner busy = the learner's update time / training time. Lag = policy versions "
        "(learner steps) between the weights that collected a fragment and the learner's when it trained on it; "
        "fragments more than `--max-policy-lag` (4) versions old are dropped, and counted. Actors busy = the "
        "actors' collecting time / (training time × actors): below 100%, they waited for the learner "
        "(back-pressure) or for their next request; above 100%: the fragments under way when the loop ended, drained after it, count too. Peak RSS is sampled every 0.5 s: the learner's process, and the "
        "sum over it and every process under it"
        + (" and under the cluster's process (its GCS, raylets and idle workers included)" if two_node else "")
        + "; shared pages count once per process.",
        "",
        "Raw values per run, in run order (SPS): "
        + "; ".join(f"N={n}: " + ", ".join(f"{r['sps']:,.0f}" for r in runs) for n, runs in results.items()),
    ]
    return "\n".join(lines)


def chart_png(results: dict[int, list[dict]], settings: dict, out: Path) -> Path | None:
    """SPS against actors (every run, and the medians) with N × one actor's, 0.8 of it and the sleep's ceiling."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    counts = sorted(results)
    fig, ax = plt.subplots(figsize=(6, 4))
    for n in counts:
        ax.scatter([n] * len(results[n]), [r["sps"] for r in results[n]], color="tab:blue", alpha=0.4, s=12)
    ax.plot(counts, [median([r["sps"] for r in results[n]]) for n in counts], "o-", color="tab:blue", label="SPS")
    if 1 in results:
        one = median([r["sps"] for r in results[1]])
        ax.plot(counts, [n * one for n in counts], "--", color="grey", label="N × 1 actor's")
        ax.plot(counts, [0.8 * n * one for n in counts], ":", color="tab:red", label="goal: 0.8 × that")
    ax.plot(counts, [n * 1000.0 / settings["step_ms"] for n in counts], "-", color="lightgrey", label="sleep's ceiling")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(counts, [str(n) for n in counts])
    ax.set_xlabel("actors")
    ax.set_ylabel("env steps / s (training loop)")
    ax.set_title(f"APPO pipeline, SleepyCartPole {settings['step_ms']:g} ms/step, Ray {settings['cluster']}")
    ax.legend()
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


if __name__ == "__main__":
    main()
