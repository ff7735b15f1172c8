"""distrl's replay buffers against stable-baselines3's on CarRacing-sized frames: memory, add and sample time.

    python benchmarks/replay_vs_sb3.py            # writes its section of docs/benchmarks.md
    python benchmarks/replay_vs_sb3.py --quick

Each buffer (capacity 40,000) takes 30,000 transitions of 96x96x3 uint8 frames in 1,000-step
episodes, the last step of each truncated, then draws batches of 256. Peak RSS of the process
(numpy allocates pages as they are written, so it counts what was stored), microseconds per add and
per batch. Each measurement runs in its own subprocess; libraries alternate; medians are reported.
"""

from __future__ import annotations

import argparse
import platform
import time

from harness import alternating, child_main, markdown_table, measure, median, write_section

SHAPE, CAPACITY, EPISODE, BATCH, DRAWS = (96, 96, 3), 40_000, 1_000, 256, 400
KINDS = {"full": "two observation arrays", "compact": "one observation per step"}


def child(lib: str, kind: str, seed: int, arg: str) -> dict:
    import numpy as np

    transitions = int(arg)
    rng = np.random.default_rng(seed)
    frames = rng.integers(0, 256, (64, *SHAPE), dtype=np.uint8)  # cycled: writing them is what is measured
    action, reward = np.zeros((1, 3), np.float32), np.zeros(1, np.float32)

    def after(t: int) -> np.ndarray:
        """Step t's next frame: the next step's, or at a truncation the episode's own last one."""
        return frames[(t + 33 if (t + 1) % EPISODE == 0 else t + 1) % 64][None]

    if lib == "distrl":
        from distrl.data.replay import CompactReplayBuffer, ReplayBuffer

        rb = (CompactReplayBuffer if kind == "compact" else ReplayBuffer)(CAPACITY, SHAPE, 3, np.uint8)
        valid, terminated = np.ones(1, bool), np.zeros(1, np.float32)

        def add(t: int) -> None:
            rb.add(frames[t % 64][None], action, reward, after(t), terminated, valid)

        def sample() -> None:
            rb.sample(BATCH, rng)
    else:
        import gymnasium as gym
        from stable_baselines3.common.buffers import ReplayBuffer as SB3Buffer

        obs_space = gym.spaces.Box(0, 255, SHAPE, np.uint8)
        # optimize_memory_usage needs handle_timeout_termination=False: a truncated step's last frame is not kept
        rb = SB3Buffer(
            CAPACITY,
            obs_space,
            gym.spaces.Box(-1, 1, (3,), np.float32),
            device="cpu",
            optimize_memory_usage=kind == "compact",
            handle_timeout_termination=kind != "compact",
        )

        def add(t: int) -> None:
            end = (t + 1) % EPISODE == 0
            rb.add(frames[t % 64][None], after(t), action, reward, np.array([end]), [{"TimeLimit.truncated": end}])

        def sample() -> None:
            rb.sample(BATCH)

    start = time.perf_counter()
    for t in range(transitions):
        if lib == "distrl" and t % EPISODE == 0 and t:  # the reset step after a truncation: not stored
            rb.add(after(t - 1), action, reward, frames[t % 64][None], terminated, ~valid)
        add(t)
    add_us = 1e6 * (time.perf_counter() - start) / transitions
    for _ in range(DRAWS // 4):  # the first draws after filling run slower (the pages' first reads)
        sample()
    start = time.perf_counter()
    for _ in range(DRAWS):
        sample()
    return {"add_us": add_us, "sample_ms": 1e3 * (time.perf_counter() - start) / DRAWS}


def main() -> None:
    if child_main(child):
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeats, transitions = (1, 5_000) if args.quick else (3, 30_000)
    results: dict[tuple[str, str], list[dict]] = {}
    for kind in KINDS:
        for i, lib in enumerate(alternating(["distrl", "sb3"], repeats)):
            r = measure(__file__, lib, kind, i // 2, transitions)
            results.setdefault((lib, kind), []).append(r)
            print(f"  {lib} {kind}: {r}", flush=True)
    med = {
        key: {m: median([r[m] for r in runs]) for m in ("max_rss_mb", "add_us", "sample_ms")}
        for key, runs in results.items()
    }
    rows = []
    for kind, what in KINDS.items():
        d, s = med[("distrl", kind)], med[("sb3", kind)]
        rows.append(
            [
                f"{kind} ({what})",
                f"{d['max_rss_mb']:,.0f} / {s['max_rss_mb']:,.0f}",
                f"{d['add_us']:.1f} / {s['add_us']:.1f}",
                f"{d['sample_ms']:.2f} / {s['sample_ms']:.2f}",
            ]
        )
    import stable_baselines3

    import distrl

    saved = med[("distrl", "full")]["max_rss_mb"] - med[("distrl", "compact")]["max_rss_mb"]
    lines = [
        f"`python benchmarks/replay_vs_sb3.py` — {time.strftime('%Y-%m-%d')}, {platform.machine()}; distrl "
        f"{distrl.__version__}, stable-baselines3 {stable_baselines3.__version__}; {transitions:,} transitions of "
        f"96×96×3 uint8 frames (CarRacing-v3's) into a buffer of {CAPACITY:,}, {EPISODE:,}-step episodes ending in "
        f"truncation; {repeats} runs each, alternating, medians.",
        "",
        *markdown_table(
            [
                "buffer",
                "peak RSS distrl / SB3 (MB)",
                "µs per add distrl / SB3",
                f"ms per batch of {BATCH} distrl / SB3",
            ],
            rows,
        ),
        "",
        f"- `--optimize-memory-usage` saved {saved:,.0f} MB here, {saved / transitions * 1e6 / 2**10:.1f} KB per "
        "transition (a frame is 27 KB).",
        "- Adds fill a new buffer, so they include the first write to each page, whose cost varies widely from run "
        f"to run (raw values below); batches are timed over {DRAWS} draws after {DRAWS // 4} untimed ones.",
        "- distrl's compact buffer keeps a truncated episode's last frame in a row of its own, so SAC bootstraps "
        "from it. stable-baselines3's `optimize_memory_usage` requires `handle_timeout_termination=False`; its "
        "truncated steps are then learned as terminations.",
        "- Raw values: "
        + "; ".join(
            f"{lib} {kind}: RSS {[round(r['max_rss_mb']) for r in runs]}, add µs "
            f"{[round(r['add_us'], 1) for r in runs]}, batch ms "
            f"{[round(r['sample_ms'], 2) for r in runs]}"
            for (lib, kind), runs in results.items()
        ),
    ]
    write_section("Replay buffers: distrl vs stable-baselines3", "\n".join(lines))


if __name__ == "__main__":
    main()
