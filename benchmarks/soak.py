"""Soak: long actor-learner and pipeline runs with workers killed on a schedule, checked for leaks.

For each strategy (actor-learner, then pipeline), PPO on CartPole-v1 with ``--workers`` Ray rollout
workers runs for ``--minutes`` as a subprocess in a session of its own. Every ``--kill-every-min``
minutes the oldest live rollout worker process is SIGKILLed (so the kills go round the workers in
turn) and the run must replace it and keep training (new worker process, monitor.csv still growing).
Every ``--sample-every-s`` seconds it samples:

- the learner (the distrl process): resident memory, open file descriptors, threads, child processes
  (recursive);
- the rollout workers (processes of the run's session whose title is ``ray::RolloutWorker...``):
  resident memory, descriptors and threads, per process and as the mean over the live workers;
- the run's Ray processes (every process of its session but the learner) and ``/dev/shm``'s entries
  (the ones present before the run started are not counted).

At the end the run gets SIGINT (then SIGTERM, then SIGKILL for whatever of its session is left) and
the benchmark checks that no process of the run survives and nothing new is left in /dev/shm. Growth
is measured after ``--warmup-min``: memory as the least-squares slope in % of its first value per
hour; descriptors, threads and processes as the median of the last third of the samples against the
median of the first third. The bounds are in ``BOUNDS``; the exit status is 1 when any fails.

    python benchmarks/soak.py --minutes 30          # about an hour: both strategies, 30 minutes each

It writes OUT/soak.json (every sample and kill, the growth figures, bounds, verdicts, machine facts)
and prints a markdown table. Run it alone on the machine: other processes' use of /dev/shm and CPU
would be blamed on the run or slow it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

from harness import markdown_table

WORKER_TITLE = "ray::RolloutWorker"
MEMORY_BOUND_PCT_PER_H = 2.0
COUNT_TOLERANCE = {"fds": 2, "threads": 2, "processes": 0}
"""How much the median of the last third of the post-warm-up samples may exceed that of the first third.
Medians of several samples drop what one sample catches in passing (a Ray connection being opened, a
log or checkpoint file being written); 2 descriptors or threads more leaves room for one lazily created
resource (a gRPC channel, a thread pool's thread) that appears once and stays, while a leak of one per
iteration, evaluation or kill grows well past it over a run. Processes have no tolerance."""

QUANTITIES: list[tuple[str, str, str]] = [
    # (key in a sample, label, kind: memory or one of COUNT_TOLERANCE's keys)
    ("learner_rss", "learner RSS", "memory"),
    ("worker_rss_mean", "worker RSS, mean per live worker", "memory"),
    ("learner_fds", "learner open fds", "fds"),
    ("worker_fds_mean", "worker open fds, mean per live worker", "fds"),
    ("learner_threads", "learner threads", "threads"),
    ("worker_threads_mean", "worker threads, mean per live worker", "threads"),
    ("learner_children", "learner child processes (recursive)", "processes"),
    ("ray_processes", "Ray processes of the run", "processes"),
    ("shm_new_entries", "new /dev/shm entries", "processes"),
]
BOUNDS = {
    "memory": f"< {MEMORY_BOUND_PCT_PER_H:g}%/h",
    **{kind: f"last third - first third <= {tol}" for kind, tol in COUNT_TOLERANCE.items()},
}


def shm_entries() -> dict[str, int]:
    """``/dev/shm``'s entries and their sizes in bytes."""
    sizes = {}
    for entry in Path("/dev/shm").iterdir():
        try:
            sizes[entry.name] = entry.lstat().st_size
        except OSError:  # removed meanwhile
            pass
    return sizes


def session_processes(sid: int) -> list[psutil.Process]:
    """Every live process of session ``sid`` (the run's driver, its Ray processes and their workers)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except (ProcessLookupError, PermissionError):
            pass
    return found


def title(proc: psutil.Process) -> str:
    try:
        return " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return ""


def rollout_workers(sid: int) -> list[psutil.Process]:
    """The run's rollout worker processes, oldest first."""
    workers = [p for p in session_processes(sid) if title(p).startswith(WORKER_TITLE)]
    return sorted(workers, key=lambda p: p.create_time())


def usage(proc: psutil.Process) -> dict[str, int] | None:
    """Resident bytes, open descriptors and threads of ``proc``; None when it has gone."""
    try:
        with proc.oneshot():
            return {
                "pid": proc.pid,
                "rss": proc.memory_info().rss,
                "fds": proc.num_fds(),
                "threads": proc.num_threads(),
            }
    except psutil.NoSuchProcess:
        return None


def line_count(path: Path) -> int:
    try:
        with path.open("rb") as f:
            return sum(1 for _ in f)
    except FileNotFoundError:
        return 0


def sample(driver: psutil.Process, sid: int, t: float, shm_before: dict[str, int], run_dir: Path) -> dict[str, Any]:
    learner = usage(driver) or {"rss": 0, "fds": 0, "threads": 0}
    try:
        children = len(driver.children(recursive=True))
    except psutil.NoSuchProcess:
        children = 0
    workers = [u for u in map(usage, rollout_workers(sid)) if u is not None]
    shm = shm_entries()
    new_shm = {name: size for name, size in shm.items() if name not in shm_before}

    def mean(key: str) -> float:
        return statistics.fmean(w[key] for w in workers) if workers else 0.0

    return {
        "t_s": round(t, 1),
        "learner_rss": learner["rss"],
        "learner_fds": learner["fds"],
        "learner_threads": learner["threads"],
        "learner_children": children,
        "workers": workers,
        "n_workers": len(workers),
        "worker_rss_total": sum(w["rss"] for w in workers),
        "worker_rss_mean": mean("rss"),
        "worker_rss_max": max((w["rss"] for w in workers), default=0),
        "worker_fds_total": sum(w["fds"] for w in workers),
        "worker_fds_mean": mean("fds"),
        "worker_fds_max": max((w["fds"] for w in workers), default=0),
        "worker_threads_total": sum(w["threads"] for w in workers),
        "worker_threads_mean": mean("threads"),
        "worker_threads_max": max((w["threads"] for w in workers), default=0),
        "ray_processes": len([p for p in session_processes(sid) if p.pid != driver.pid]),
        "shm_new_entries": len(new_shm),
        "shm_new_bytes": sum(new_shm.values()),
        "shm_used_bytes": psutil.disk_usage("/dev/shm").used,
        "monitor_rows": line_count(run_dir / "monitor.csv"),
    }


def slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of ``(seconds, value)`` points, per hour."""
    if len(points) < 3:
        return None
    ts, vs = [p[0] for p in points], [p[1] for p in points]
    t_mean, v_mean = statistics.fmean(ts), statistics.fmean(vs)
    var = sum((t - t_mean) ** 2 for t in ts)
    if var == 0:
        return None
    return sum((t - t_mean) * (v - v_mean) for t, v in zip(ts, vs, strict=True)) / var * 3600


def growth(samples: list[dict], warmup_s: float) -> dict[str, dict[str, Any]]:
    """Per quantity: first and last value after warm-up, slope per hour, thirds' medians, verdict."""
    after = [s for s in samples if s["t_s"] >= warmup_s]
    results = {}
    for key, label, kind in QUANTITIES:
        points = [(s["t_s"], float(s[key])) for s in after]
        slope = slope_per_hour(points)
        row: dict[str, Any] = {"label": label, "kind": kind, "bound": BOUNDS[kind], "samples": len(points)}
        if slope is None:
            results[key] = {**row, "passed": False, "why": "fewer than 3 samples after warm-up"}
            continue
        first = points[0][1]
        third = max(1, len(points) // 3)
        head = statistics.median(v for _, v in points[:third])
        tail = statistics.median(v for _, v in points[-third:])
        row.update(first=first, last=points[-1][1], slope_per_h=slope, median_first_third=head, median_last_third=tail)
        if kind == "memory":
            row["slope_pct_per_h"] = 100 * slope / first if first else None
            row["passed"] = first > 0 and row["slope_pct_per_h"] < MEMORY_BOUND_PCT_PER_H
        else:
            row["passed"] = tail - head <= COUNT_TOLERANCE[kind]
        results[key] = row
    return results


def stop(proc: subprocess.Popen, sid: int, grace_s: float) -> dict[str, Any]:
    """SIGINT the learner, then SIGTERM, then SIGKILL; then SIGKILL whatever of its session remains."""
    ended_by = "already gone" if proc.poll() is not None else None
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        if ended_by is not None:
            break
        proc.send_signal(sig)
        try:
            proc.wait(wait_s)
            ended_by = sig.name
        except subprocess.TimeoutExpired:
            pass
    time.sleep(10)  # Ray's processes end on their own once the driver has shut the session down
    left = [{"pid": p.pid, "cmd": title(p)[:120]} for p in session_processes(sid)]
    for p in session_processes(sid):
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(session_processes(sid), timeout=10)
    return {"driver_ended_by": ended_by, "left_after_driver_exit": left}


def soak(strategy: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    run_dir = out / strategy / "run"
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    shm_before = shm_entries()
    restarts = int(args.minutes // args.kill_every_min) + 2
    cmd = [
        sys.executable,
        "-m",
        "distrl",
        "train",
        "ppo",
        "CartPole-v1",
        "--strategy",
        strategy,
        "--workers",
        str(args.workers),
        "--total-steps",
        str(10**12),
        "--max-worker-restarts",
        str(restarts),
        "--eval-every",
        str(args.eval_every),
        "--checkpoint-every",
        str(args.checkpoint_every),
        "--keep-checkpoints",
        "2",
        "--quiet",
        "--run-dir",
        str(run_dir),
    ]
    print(f"\n{strategy}: {' '.join(cmd[1:])}", flush=True)
    log = (out / strategy / "run.log").open("wb")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    driver, sid = psutil.Process(proc.pid), proc.pid
    seen: dict[int, float] = {}
    """Every process of the run seen while sampling: pid -> create time, to check that none survives."""
    samples: list[dict] = []
    kills: list[dict] = []
    end_s = args.minutes * 60
    next_sample, next_kill = args.sample_every_s, args.kill_every_min * 60
    ended_early = None
    while (t := time.monotonic() - start) < end_s:
        if proc.poll() is not None:
            ended_early = f"the run exited with status {proc.returncode} at {t:.0f}s"
            log.flush()
            tail = (out / strategy / "run.log").read_text(errors="replace").splitlines()[-5:]
            print(f"  {ended_early}:", *tail, sep="\n    ", flush=True)
            break
        for p in session_processes(sid):
            try:
                seen.setdefault(p.pid, p.create_time())
            except psutil.NoSuchProcess:
                pass
        pending = [k for k in kills if k["replaced_by"] is None]
        if pending:
            live = rollout_workers(sid)
            fresh = [p.pid for p in live if p.pid not in pending[0]["workers_at_kill"]]
            if len(live) >= args.workers and fresh:
                pending[0].update(replaced_by=fresh[0], replaced_after_s=round(t - pending[0]["t_s"], 1))
                print(f"  {t:6.0f}s worker {pending[0]['pid']} replaced by {fresh[0]}", flush=True)
        if t >= next_sample:
            s = sample(driver, sid, t, shm_before, run_dir)
            samples.append(s)
            next_sample += args.sample_every_s
            print(
                f"  {t:6.0f}s learner {s['learner_rss'] / 2**20:.0f} MB {s['learner_fds']} fds "
                f"{s['learner_threads']} threads {s['learner_children']} children; {s['n_workers']} workers "
                f"{s['worker_rss_mean'] / 2**20:.0f} MB {s['worker_fds_mean']:.0f} fds "
                f"{s['worker_threads_mean']:.0f} threads each; {s['ray_processes']} Ray processes; "
                f"/dev/shm +{s['shm_new_entries']}; monitor.csv {s['monitor_rows']} rows",
                flush=True,
            )
        if t >= next_kill:
            next_kill += args.kill_every_min * 60
            live = rollout_workers(sid)
            if live:
                victim = live[0]
                victim.kill()
                kills.append(
                    {
                        "t_s": round(t, 1),
                        "pid": victim.pid,
                        "workers_at_kill": [p.pid for p in live],
                        "monitor_rows_at_kill": line_count(run_dir / "monitor.csv"),
                        "replaced_by": None,
                        "replaced_after_s": None,
                    }
                )
                print(f"  {t:6.0f}s killed rollout worker {victim.pid}", flush=True)
        time.sleep(1)
    rows_at_end = line_count(run_dir / "monitor.csv")
    stopped = stop(proc, sid, args.grace_s)
    log.close()
    for k in kills:
        k["progress_after"] = rows_at_end > k["monitor_rows_at_kill"]
    survivors = []
    for pid, created in seen.items():
        try:
            if psutil.Process(pid).create_time() == created:
                survivors.append(pid)
        except psutil.NoSuchProcess:
            pass
    shm_after = shm_entries()
    events = run_dir / "events.log"
    checks = {
        "ran to the end": ended_early is None,
        "every killed worker replaced": all(k["replaced_by"] is not None for k in kills),
        "training went on after every kill": all(k["progress_after"] for k in kills),
        "the learner stopped cleanly on SIGINT (status 0 or 130)": stopped["driver_ended_by"] == "SIGINT"
        and proc.returncode in (0, 130),
        "no process left after the learner exited": not stopped["left_after_driver_exit"],
        "no process of the run survives": not survivors,
        "nothing new left in /dev/shm": not [n for n in shm_after if n not in shm_before],
    }
    return {
        "strategy": strategy,
        "command": cmd,
        "samples": samples,
        "kills": kills,
        "events_log": events.read_text().splitlines() if events.exists() else [],
        "ended_early": ended_early,
        "stop": stopped,
        "exit_status": proc.returncode,
        "survivors": survivors,
        "shm_left": {n: s for n, s in shm_after.items() if n not in shm_before},
        "growth": growth(samples, args.warmup_min * 60),
        "checks": checks,
    }


def machine() -> dict[str, Any]:
    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=Path(__file__).parent)
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "cpu_count": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        **{name: version(name) for name in ("distrl", "torch", "ray", "gymnasium", "psutil")},
        "commit": commit.stdout.strip() or None,
    }


def report(results: list[dict]) -> list[str]:
    def show(row: dict, key: str) -> str:
        value = row.get(key)
        if value is None:
            return "n/a"
        return f"{value / 2**20:,.1f} MB" if row["kind"] == "memory" else f"{value:.1f}"

    rows = []
    for r in results:
        for g in r["growth"].values():
            if "slope_per_h" not in g:
                rows.append([r["strategy"], g["label"], "n/a", "n/a", "n/a", "n/a", g["bound"], "FAIL"])
                continue
            if g["kind"] == "memory":
                slope = f"{g['slope_pct_per_h']:+.2f}%/h" if g["slope_pct_per_h"] is not None else "n/a"
                thirds = f"{(g['median_last_third'] - g['median_first_third']) / 2**20:+.1f} MB"
            else:
                slope = f"{g['slope_per_h']:+.1f}/h"
                thirds = f"{g['median_last_third'] - g['median_first_third']:+.1f}"
            verdict = "PASS" if g["passed"] else "FAIL"
            rows.append(
                [r["strategy"], g["label"], show(g, "first"), show(g, "last"), slope, thirds, g["bound"], verdict]
            )
        for check, ok in r["checks"].items():
            rows.append([r["strategy"], check, "", "", "", "", "yes", "PASS" if ok else "FAIL"])
    header = ["strategy", "measure", "first after warm-up", "last", "growth per hour", "last - first third", "bound"]
    return markdown_table([*header, "verdict"], rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", nargs="+", default=["actor-learner", "pipeline"])
    parser.add_argument("--minutes", type=float, default=30.0, help="length of each run")
    parser.add_argument("--kill-every-min", type=float, default=5.0, help="minutes between worker kills")
    parser.add_argument("--sample-every-s", type=float, default=60.0)
    parser.add_argument("--warmup-min", type=float, default=5.0, help="samples before this are not used for growth")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--eval-every", type=int, default=1_000_000, help="steps between evaluations")
    parser.add_argument(
        "--checkpoint-every", type=int, default=500_000, help="steps between checkpoints (0: none); the newest 2 kept"
    )
    parser.add_argument("--grace-s", type=float, default=60.0, help="wait after SIGINT before SIGTERM")
    parser.add_argument("--out", type=Path, default=Path("soak-results"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    facts = machine()
    print(json.dumps(facts), flush=True)
    results = [soak(strategy, args, args.out) for strategy in args.strategies]
    table = report(results)
    passed = all(g["passed"] for r in results for g in r["growth"].values()) and all(
        ok for r in results for ok in r["checks"].values()
    )
    (args.out / "soak.json").write_text(
        json.dumps(
            {
                "machine": facts,
                "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                "bounds": {"memory_pct_per_h": MEMORY_BOUND_PCT_PER_H, "count_tolerance": COUNT_TOLERANCE},
                "passed": passed,
                "runs": results,
                "table": table,
            },
            indent=1,
        )
    )
    print(
        f"\n`python benchmarks/soak.py --minutes {args.minutes:g}` — {facts['date']}, {facts['cpu_count']} CPUs, "
        f"PPO on CartPole-v1, {args.workers} workers, a worker killed every {args.kill_every_min:g} min, "
        f"sampled every {args.sample_every_s:g}s, growth after {args.warmup_min:g} min of warm-up.\n"
    )
    print("\n".join(table))
    print(f"\n{'PASS' if passed else 'FAIL'}; details in {args.out / 'soak.json'}")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
