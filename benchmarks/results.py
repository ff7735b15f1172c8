"""docs/results.md from the runs kept under docs/results/: the learning table, reward curves, speedup charts.

    python benchmarks/results.py collect RUN_DIR [RUN_DIR ...]  # keep a finished run's small files
    python benchmarks/results.py collect RUN_DIR --timing-not-comparable "WHY"  # e.g. paused, resumed
    python benchmarks/results.py collect-bench BENCH_DIR NAME    # keep a `distrl bench scaling` result
    python benchmarks/results.py                                  # rewrite docs/results.md and its PNGs

Only small files are kept (monitor.csv, summary.json, config.json; speedup.png and
scaling.json of a scaling bench), never checkpoints. The commands that produced every run
are listed in the generated page, so anyone can regenerate them.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from distrl.run.logs import monitor_agents, read_monitor
from distrl.run.plots import mean_curves, reward_curves
from harness import markdown_table

ROOT = Path(__file__).parents[1]
RESULTS = ROOT / "docs" / "results"
PAGE = ROOT / "docs" / "results.md"
KEPT = ("monitor.csv", "summary.json", "config.json")
CAVEATS = "caveats.json"

# Published 1M-step figures (v3/v4 environments): RL Zoo's benchmark table, CleanRL's reports, and Tianshou's
# MuJoCo PPO benchmark (examples/mujoco/README.md, mean over 10 seeds at 1M steps of 3M-step runs).
REFERENCES = {
    ("ppo", "Hopper-v5"): "RL Zoo 2410; CleanRL 2383; Tianshou 2609",
    ("ppo", "HalfCheetah-v5"): "RL Zoo 5819; CleanRL 1443; Tianshou 5784",
    ("ppo", "Walker2d-v5"): "RL Zoo 3479; CleanRL 2288; Tianshou 3589",
    ("ppo", "Ant-v5"): "RL Zoo 1327; Tianshou 3258",
    ("sac", "HalfCheetah-v5"): "RL Zoo 9535; CleanRL 9635",
    ("sac", "Hopper-v5"): "RL Zoo 2326; CleanRL 2310",
    ("sac", "Walker2d-v5"): "RL Zoo 3863",
    ("sac", "Ant-v5"): "RL Zoo 4616",
    ("ppo", "CartPole-v1"): "solved at 475",
    ("sac", "Pendulum-v1"): "solved at -200",
    ("dqn", "LunarLander-v3"): "RL Zoo 154 ± 79 (v2, 100k steps)",
}
# Published Atari curves at the same agent-step counts, on NoFrameskip-v4: no sticky actions, where the v5
# envs distrl trains on repeat the previous action with probability 0.25 (harder). All count whole games (all
# lives) with their real scores. PPO: PPO's Atari settings (8 envs x 128 steps, 4 epochs x 4 minibatches,
# lr 2.5e-4 and clip 0.1 annealed, ent 0.01). APPO: IMPALA's V-trace actor-critic (no clipped surrogate).
ATARI_POINTS = (500_000, 1_000_000, 1_500_000, 2_000_000)
ATARI_REFERENCES = {
    ("ppo", "ALE/Breakout-v5"): [
        ("RL Zoo PPO", (14.4, 25.8, 43.0, 61.7)),
        ("baselines ppo2", (13.3, 22.0, 31.7, 46.8)),
    ],
    ("ppo", "ALE/Pong-v5"): [("RL Zoo PPO", (-18.7, -12.0, -1.9, 15.1)), ("baselines ppo2", (-17.4, -2.6, 10.2, 14.1))],
    ("appo", "ALE/Breakout-v5"): [("RLlib IMPALA, mean of 6 seeds", (12.2, 23.7, 44.2, 70.0))],
    ("appo", "ALE/Pong-v5"): [("RLlib IMPALA, 32 workers", (-20.2, -20.0, -19.8, -19.3))],
}
ATARI_SOURCES = [
    "RL Zoo PPO: stable-baselines3's trained agents, DLR-RM/rl-trained-agents at 83f477ed, "
    "`ppo/BreakoutNoFrameskip-v4_1/` and `ppo/PongNoFrameskip-v4_1/` (one seed, 10M steps; their config.yml holds "
    "the settings above). Mean of the last 100 training games before each step count, computed from the "
    "eight `*.monitor.csv` files with the games placed on the step axis by their lengths, as here; at 10M the "
    "same computation gives 391 and 21.0, the zoo's published 398 ± 33 and 20.99.",
    'baselines ppo2: openai/baselines, `benchmarks_atari10M.htm`, section "Learning Curves" (reward against '
    "timesteps, average over 6 runs; ppo2 at baselines 7bfbcf1); values are the plotted curve's points, read from "
    "the page's vector graphics at these step counts, smoothing unstated.",
    "RLlib IMPALA, Breakout: ray-project/rl-experiments at 66c7949d, `atari-impala/2020-05-11/0{0..5}_IMPALA_"
    "BreakoutNoFrameskip-v4_use_pytorch={False,True}_2020-05-11/results.zip` (3 TensorFlow and 3 PyTorch runs; "
    "config.yaml beside each: 15 workers x 5 envs, fragments of 50 steps, train batch 500, lr 5e-4 decaying "
    "linearly to 0 at 20M steps, rewards clipped, RLlib's default Atari CNN). The value is each progress.csv's "
    "`episode_reward_mean` (RLlib's mean over its default window of 100 training games, scored before its "
    "episodic-life and reward-clipping wrappers: whole games, real scores) at `timesteps_total` interpolated linearly "
    "between logged iterations (about 33k steps apart), then the mean over the 6 runs; their spread at 2M is 58-91.",
    "RLlib IMPALA, Pong: the same repository, `pong-speedrun/pong-impala-lowlatency-32/IMPALA_PongNoFrameskip-"
    "v4_0_2018-11-10_03-45-30PllGMK/progress.csv` (one seed; `pong-impala-fast.yaml` with 32 workers x 5 envs, "
    "fragments of 50, train batch 1000, lr 5e-4, 42x42 frames, 2 GPUs), the same column interpolated the same "
    "way (iterations about 125k steps apart). This setting, tuned for wall time, solves Pong between 4M and 5M "
    "steps; its runs with 64 and 128 workers give -19.4 and -18.8 at 2M.",
]
NOT_LEARNING = {
    "save_replay",
    "optimize_memory_usage",
}  # algorithm fields that change what is stored, not what is learned
SHORT = {
    "Hopper-v5": "hopper",
    "HalfCheetah-v5": "halfcheetah",
    "Walker2d-v5": "walker2d",
    "Ant-v5": "ant",
    "CartPole-v1": "cartpole",
    "Pendulum-v1": "pendulum",
    "LunarLander-v3": "lunarlander",
    "mpe2.simple_spread_v3": "simple-spread",
    "ALE/Breakout-v5": "breakout",
    "ALE/Pong-v5": "pong",
}


def collect(run_dirs: list[str], timing_caveat: str = "") -> None:
    """Keep each run's small files; ``timing_caveat`` says why its wall time and SPS do not compare
    with other runs' (stopped for a while, resumed in another session), and the table says so."""
    unfinished = [run for run in run_dirs if not (Path(run) / "summary.json").is_file()]
    if unfinished:  # checked before anything is copied
        print(f"results.py collect: error: {unfinished[0]}: no summary.json, the run has not finished", file=sys.stderr)
        raise SystemExit(2)
    for run in map(Path, run_dirs):
        target = RESULTS / "runs" / run.name
        target.mkdir(parents=True, exist_ok=True)
        for name in KEPT:
            shutil.copy2(run / name, target / name)
        if timing_caveat:
            (target / CAVEATS).write_text(json.dumps({"timing": timing_caveat}, indent=2) + "\n")
        print(f"kept {target}")


def collect_bench(bench_dir: str, name: str) -> None:
    target = RESULTS / "scaling" / name
    target.mkdir(parents=True, exist_ok=True)
    for file in ("speedup.png", "scaling.json"):
        shutil.copy2(Path(bench_dir) / file, target / file)
    print(f"kept {target}")


def load_runs() -> list[dict]:
    runs = []
    for summary_path in sorted((RESULTS / "runs").glob("*/summary.json")):
        run_dir = summary_path.parent
        summary = json.loads(summary_path.read_text())
        config = json.loads((run_dir / "config.json").read_text())
        returns = read_monitor(run_dir / "monitor.csv")["r"]
        caveats = json.loads((run_dir / CAVEATS).read_text()) if (run_dir / CAVEATS).is_file() else {}
        run = {
            "dir": run_dir,
            "summary": summary,
            "config": config,
            "timing_caveat": caveats.get("timing", ""),
            "last100": float(returns[-100:].mean()),
            "multiagent": monitor_agents(run_dir / "monitor.csv") > 0,
            "seed": config["run"]["seed"],
        }
        run["settings"] = settings(run)
        runs.append(run)
    return runs


def settings(run: dict) -> str:
    """The preset whose hyperparameters the run trained with (whatever it was called then), else "custom"."""
    from distrl.config import ALGO_CONFIGS, to_dict
    from distrl.training.presets import PRESETS

    algo, env = run["summary"]["algo"], run["summary"]["env"]

    def learned(cfg: dict) -> dict:  # JSON-normalised (tuples as lists), without NOT_LEARNING fields
        return {k: v for k, v in json.loads(json.dumps(cfg)).items() if k not in NOT_LEARNING}

    used = learned({**to_dict(ALGO_CONFIGS[algo]()), **run["config"][algo]})  # fields added since: their defaults
    presets = PRESETS.get(algo, {})
    short = SHORT.get(env, env).lower() + "-"

    def mine_first(item: tuple[str, dict]) -> tuple:  # the env's own preset, then those named after it (ant-...)
        return item[0] != env, not item[0].startswith(short), item[0]

    fields = set(to_dict(ALGO_CONFIGS[algo]()))
    for name, values in sorted(presets.items(), key=mine_first):
        params = {k: v for k, v in values.items() if k in fields}  # a preset's run settings (total_steps, ...) aside
        if learned(to_dict(ALGO_CONFIGS[algo](**params))) == used:
            return name
    return "custom"


def env_label(run: dict) -> str:
    """The env, with the constructor arguments the run gave it (another observation, say) when it gave any."""
    kwargs = run["config"]["run"].get("env_kwargs") or []
    return run["summary"]["env"] + (f" ({', '.join(kwargs)})" if kwargs else "")


def algo_label(run: dict) -> str:
    """The algorithm as the table names it: IPPO or MAPPO (the centralised critic) for PPO on a multi-agent env."""
    algo = run["summary"]["algo"]
    if run.get("multiagent") and algo == "ppo":
        return "MAPPO" if run["config"]["run"].get("critic") == "centralised" else "IPPO"
    return algo.upper()


def group_key(run: dict) -> tuple:
    s = run["summary"]
    return (
        algo_label(run),
        env_label(run),
        s["strategy"],
        s["workers"],
        run["config"]["strategy"].get("scaling", "per-worker"),
        run["settings"],
    )


def mean_std(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:,.0f}"
    return f"{statistics.mean(values):,.0f} ± {statistics.stdev(values):,.0f}"


def learning_table(runs: list[dict]) -> list[str]:
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for run in runs:
        groups[group_key(run)].append(run)
    rows: list[list[str]] = []
    caveats: dict[str, list[str]] = {}  # why a run's timing does not compare -> the runs it applies to
    for (algo, env, strategy, workers, scaling, preset), members in sorted(
        groups.items(), key=lambda kv: (kv[0][1], kv[0])
    ):
        members.sort(key=lambda r: r["seed"])
        strat = strategy_label(strategy, workers, scaling)
        steps = members[0]["summary"]["total_steps"]
        timed = [r for r in members if not r["timing_caveat"]]
        for r in members:
            if r["timing_caveat"]:
                caveats.setdefault(r["timing_caveat"], []).append(r["dir"].name)
        rows.append(
            [
                env,
                algo,
                preset,
                strat,
                ", ".join(str(r["seed"]) for r in members),
                f"{steps:,}",
                mean_std([r["last100"] for r in members]),
                mean_std([r["summary"]["final_eval_mean_return"] for r in members]),
                f"{statistics.mean(r['summary']['wall_s'] for r in timed) / 60:,.1f}" if timed else "n/c",
                f"{statistics.mean(r['summary']['sps'] for r in timed):,.0f}" if timed else "n/c",
                REFERENCES.get((members[0]["summary"]["algo"], members[0]["summary"]["env"]), ""),
            ]
        )
    header = [
        "env",
        "algo",
        "preset",
        "strategy",
        "seeds",
        "steps",
        "last 100 training episodes",
        "10-episode eval",
        "wall min",
        "SPS",
        "reference (1M steps)",
    ]
    lines = markdown_table(header, rows)
    if caveats:  # wall time and SPS of these runs are left out of the means ("n/c" when no run is left)
        lines += [
            "",
            "Wall time and SPS leave out runs whose timing does not compare (n/c: none left): "
            + "; ".join(f"{', '.join(names)}: {why}" for why, names in caveats.items())
            + ".",
        ]
    return lines


def strategy_label(strategy: str, workers: int, scaling: str) -> str:
    return (
        strategy if strategy == "single" else f"{strategy} ×{workers}" + (f", {scaling}" if strategy == "ddp" else "")
    )


def curve_label(run: dict) -> str:
    """A row of the learning table as a curve's name: its preset, with the env's arguments and the strategy
    when the run gave any."""
    algo, _, strategy, workers, scaling, preset = group_key(run)
    extra = list(run["config"]["run"].get("env_kwargs") or [])
    extra += [] if strategy == "single" else [strategy_label(strategy, workers, scaling)]
    label = f"{algo} {preset}" if run.get("multiagent") else preset
    return label + (f" ({'; '.join(extra)})" if extra else "")


def curve_figures(runs: list[dict], draw: bool = True) -> list[str]:
    """One PNG per (algorithm, env): each setting's runs as one curve (the mean over seeds, the band from the
    lowest to the highest), against total steps. ``draw=False``: only the page's lines that show them."""
    by_env: dict[tuple, dict[str, list[Path]]] = defaultdict(lambda: defaultdict(list))
    for run in sorted(runs, key=lambda r: (curve_label(r), r["seed"])):
        by_env[(run["summary"]["algo"], run["summary"]["env"])][curve_label(run)].append(run["dir"])
    lines = []
    for (algo, env), groups in sorted(by_env.items(), key=lambda kv: kv[0][1]):
        dirs = [d for members in groups.values() for d in members]
        name = f"{algo}-{SHORT.get(env, env)}.png"
        lines += [f"![{algo.upper()} {env}](results/{name})", ""]
        with_time = len({run["summary"]["strategy"] for run in runs if run["dir"] in dirs}) > 1
        if with_time:
            lines += [f"![{algo.upper()} {env} against wall time](results/{name.replace('.png', '-time.png')})", ""]
        if not draw:
            continue
        smooth = 100 if (algo, env) in ATARI_REFERENCES else 20 if env not in ("CartPole-v1", "Pendulum-v1") else 10
        for reference in sorted((RESULTS / "sb3").glob(f"sb3-{algo}-{env}-*")):  # sb3_reference.py, same env
            groups[f"stable-baselines3 {reference.name.split(env + '-')[-1]}"].append(reference)
        fig = mean_curves(
            groups,
            "total-steps",
            k=smooth,
            out=RESULTS / name,
            title=f"{algo.upper()} {env} (mean of {smooth} episodes; band: lowest to highest seed)",
        )
        if (algo, env) in ATARI_REFERENCES:  # the published curves' points at the same step counts
            for (label, values), marker in zip(ATARI_REFERENCES[algo, env], "os"):
                fig.axes[0].plot(ATARI_POINTS, values, marker=marker, linestyle="--", label=f"{label} (v4, published)")
            fig.axes[0].legend(loc="best", fontsize=8)
            fig.savefig(RESULTS / name, dpi=100)
        if with_time:
            reward_curves(
                sorted(dirs),
                "time",
                k=smooth,
                out=RESULTS / name.replace(".png", "-time.png"),
                title=f"{algo.upper()} {env} against wall time",
            )
    return lines


def last100_at(run: dict, step: int) -> float | None:
    """Mean return of the last 100 games that ended by ``step`` (games on the step axis by their lengths)."""
    data = read_monitor(run["dir"] / "monitor.csv")
    ended = data["r"][np.cumsum(data["l"]) <= step]
    return float(ended[-100:].mean()) if len(ended) and run["summary"]["total_steps"] >= step else None


def atari_section(runs: list[dict]) -> list[str]:
    """PPO and APPO on Atari beside the published curves, at the same step counts."""
    atari = [r for r in runs if (r["summary"]["algo"], r["summary"]["env"]) in ATARI_REFERENCES]
    if not atari:
        return []
    rows = []
    for algo, env in sorted({(r["summary"]["algo"], r["summary"]["env"]) for r in atari}, key=lambda k: (k[1], k[0])):
        mine = (r for r in atari if (r["summary"]["algo"], r["summary"]["env"]) == (algo, env))
        for run in sorted(mine, key=lambda r: r["seed"]):
            values = [last100_at(run, step) for step in ATARI_POINTS]
            rows.append(
                [
                    env,
                    algo.upper(),
                    f"distrl, seed {run['seed']} ({run['settings']}, v5)",
                    *("—" if v is None else f"{v:,.1f}" for v in values),
                ]
            )
        rows += [
            [env, algo.upper(), f"{label} (v4)", *(f"{v:,.1f}" for v in values)]
            for label, values in ATARI_REFERENCES[algo, env]
        ]
    header = ["env", "algorithm", "run", *(f"{step / 1e6:g}M steps" for step in ATARI_POINTS)]
    return [
        "## PPO and APPO on Atari beside the published curves",
        "",
        "Mean real game score (all lives, unclipped) of the last 100 training games ended by each step count.",
        "",
        *markdown_table(header, rows),
        "",
        "Not like for like: distrl's runs play ALE v5, whose sticky actions (the previous action repeated with "
        "probability 0.25; Machado et al. 2018) make control harder, and ran under `--precision bf16`; the "
        "published runs play NoFrameskip-v4 without sticky actions, in float32. Through 1M steps distrl's "
        "PPO on Breakout follows both published curves; after that, and on Pong from the start, it learns more "
        "slowly. A reference run of stable-baselines3 on the same v5 envs, which would separate the env from the "
        "implementation, has not been made (about three hours per game on this machine).",
        "",
        "No published APPO curve with readable values within 2M steps was found; the nearest are RLlib's IMPALA "
        "runs (V-trace without APPO's clipped surrogate) with 75 and 160 envs, where distrl's APPO ran 2 actors of "
        "8 envs each on two cores (the `atari` preset: fragments of 128 steps, 4 epochs). On Breakout distrl's "
        "APPO is level with RLlib's IMPALA at 0.5M steps and behind it at 1M (14.7 against 23.7; the run stops "
        "there); on Pong it is ahead from 1M steps on, where RLlib's throughput-tuned setting is still near -20.",
        "",
        "Sources:",
        "",
        *(f"- {source}" for source in ATARI_SOURCES),
        "",
    ]


SPREAD = "mpe2.simple_spread_v3"
SPREAD_POINTS = (250_000, 500_000, 750_000, 1_000_000)  # agent-steps: 3 per game step
SPREAD_RANDOM = -79.2  # uniformly random actions, mean team return of 2,000 games (std error 0.5), measured here
SPREAD_REFERENCE = [
    "Yu et al. 2022 (arXiv:2103.01955, MAPPO) train Spread with their own port of the particle world: every agent "
    "is paid the sum of all agents' rewards, a collision of an agent with itself included, and the logged figure "
    "is one agent's 25-step return of that reward, R. On PettingZoo's simple_spread_v3 (each agent paid half the "
    "shared distance term and its own collisions) the team return distrl logs is then T = (R + 75) / 2, step by "
    "step; their landmarks start within 0.8 of the centre instead of 1, which makes their task somewhat easier.",
    "Their MAPPO is trained 20M game steps with 128 games in parallel, 10 epochs of one minibatch, lr 7e-4, "
    "entropy 0.01, value normalisation and a recurrent network; distrl's runs here are 333k game steps of 8 games "
    "with a feed-forward 64x64 network.",
    "No published curve in this convention could be read for this page: the paper gives Spread as curves whose "
    "values were not readable here, and the figures found in other benchmarks' repositories (a raw curve file "
    "that stays flat from its first point, and a maximum-return table) are not mean training returns. The "
    "reference points are therefore the random policy, measured here, and 0, the bound a team reaches only by "
    "covering every landmark exactly and never colliding.",
]


def spread_at(run: dict, step: int) -> float | None:
    """Mean team return of the last 100 games that ended by agent-step ``step`` (each game step is one step of
    every agent)."""
    data = read_monitor(run["dir"] / "monitor.csv")
    agents = monitor_agents(run["dir"] / "monitor.csv")
    ended = data["r"][np.cumsum(data["l"]) * agents <= step]
    return float(ended[-100:].mean()) if len(ended) and run["summary"]["total_steps"] >= step else None


def spread_section(runs: list[dict]) -> list[str]:
    """IPPO and MAPPO on simple_spread_v3, per seed, at agent-step counts, beside the reference points."""
    spread = [r for r in runs if r["summary"]["env"] == SPREAD]
    if not spread:
        return []
    rows = []
    for run in sorted(spread, key=lambda r: (algo_label(r), r["seed"])):
        values = [spread_at(run, step) for step in SPREAD_POINTS]
        rows.append([f"{algo_label(run)}, seed {run['seed']}", *("—" if v is None else f"{v:,.1f}" for v in values)])
    for label in sorted({algo_label(r) for r in spread}):
        members = [r for r in spread if algo_label(r) == label]
        means = [[spread_at(r, step) for r in members] for step in SPREAD_POINTS]
        rows.append(
            [f"{label}, mean of {len(members)}", *("—" if None in v else f"{statistics.mean(v):,.1f}" for v in means)]
        )
    rows.append(["uniformly random actions", *(f"{SPREAD_RANDOM:,.1f}" for _ in SPREAD_POINTS)])
    config = spread[0]["config"]
    header = ["run", *(f"{step / 1e3:,.0f}k agent-steps" for step in SPREAD_POINTS)]
    return [
        "## Multi-agent: IPPO and MAPPO on simple_spread_v3",
        "",
        "Team return (the three agents' returns summed) of the last 100 games ended by each count of agent-steps "
        f"(`{SPREAD}` with `{' '.join(config['run']['env_kwargs'])}`: 3 agents, discrete actions, 25-step games). "
        "IPPO is one shared "
        "policy and critic on each agent's own observation and its one-hot index; MAPPO gives the critic the "
        "global state (`--critic centralised`). Both use `--normalize-value`. Command: "
        "`distrl train ppo mpe2.simple_spread_v3 --env-kwargs N=3 continuous_actions=false max_cycles=25 "
        "--preset none --n-envs 8 --n-steps 128 --batch-size 256 --n-epochs 10 --learning-rate 0.0007 "
        "--ent-coef 0.01 --max-grad-norm 0.5 --normalize-value --total-steps 1000000 --seed N [--critic centralised]`.",
        "",
        *markdown_table(header, rows),
        "",
        *(f"{paragraph}\n" for paragraph in SPREAD_REFERENCE),
    ]


def selfplay_section() -> list[str]:
    """Self-play tic-tac-toe and connect four against random and search players (benchmarks/selfplay_games.py)."""
    path = RESULTS / "selfplay.json"
    if not path.is_file():
        return []
    from selfplay_games import report

    return ["## Self-play: tic-tac-toe and connect four", "", *report(json.loads(path.read_text())), ""]


def scaling_section() -> list[str]:
    lines = []
    for bench in sorted((RESULTS / "scaling").glob("*/scaling.json")):
        data = json.loads(bench.read_text())
        rows = [
            [
                str(r["workers"]),
                r["strategy"],
                f"{r['total_steps']:,}",
                f"{r['train_s']:.1f}",
                f"{r['speedup']:.2f}×",
                f"{r['workers']}×",
            ]
            for r in data["runs"]
        ]
        lines += [
            f"### {data['strategy']}: {data['algo'].upper()} {data['env']}",
            "",
            *markdown_table(["workers", "strategy", "total steps", "training s", "speedup", "ideal"], rows),
            "",
            f"![speedup, {data['strategy']}](results/scaling/{bench.parent.name}/speedup.png)",
            "",
        ]
    return lines


def pbt_section() -> list[str]:
    """PBT against random search (benchmarks/pbt_vs_random.py): each kept result's table, then the notes and
    plots in docs/results/pbt/NOTES.md."""
    lines = []
    for path in sorted((RESULTS / "pbt").glob("pbt_vs_random-*.json")):
        data = json.loads(path.read_text())
        space = ", ".join(
            f"{name} ({r['low']:g} to {r['high']:g}{', log scale' if r.get('log') else ''})"
            for name, r in data["space"].items()
        )
        rows = []
        for name, label in (("pbt", "PBT"), ("random", "random search")):
            best = [r[name]["best_return"] for r in data["repeats"]]
            wall = [r[name]["wall_s"] for r in data["repeats"]]
            seeds = ", ".join(str(r["seed"]) for r in data["repeats"])
            rows.append(
                [
                    label,
                    f"{statistics.median(best):,.0f}",
                    f"{', '.join(f'{b:,.0f}' for b in best)} (seeds {seeds})",
                    f"{statistics.median(wall):.0f}",
                ]
            )
        runs, steps = data["population"], data["budget_steps"]
        lines += [
            f"### {data['algo'].upper()} {data['env']}",
            "",
            f"`python benchmarks/{data['command']}`: {data['algo'].upper()} on {data['env']} from its preset, "
            f"searching {space}. Both searches train {runs} runs of {steps:,} steps ({runs * steps:,} environment "
            f"steps a study), {data['parallel']} at a time: PBT (`distrl tune --scheduler pbt --population {runs}`, "
            f"synchronous, the worst quarter copying the best quarter and perturbing every {data['interval']:,} "
            f"steps) and random search (`distrl tune --trials {runs} --startup-trials {runs} --pruner none`: "
            f"{runs} configurations drawn at random, none stopped early). The score is a study's best final "
            f"evaluation ({data['eval_episodes']} deterministic episodes); each repeat uses another `--seed` for "
            f"both. Raw figures: [results/pbt/{path.name}](results/pbt/{path.name}).",
            "",
            *markdown_table(["search", "median best final return", "per repeat", "median wall s"], rows),
            "",
        ]
    notes = RESULTS / "pbt" / "NOTES.md"
    if lines and notes.is_file():
        lines += [notes.read_text().strip(), ""]
    return ["## Population-based training against random search", "", *lines] if lines else []


def offline_section(draw: bool) -> list[str]:
    """How the offline datasets were made (docs/results/offline/DATASETS.md) and, per dataset, distrl's and
    d3rlpy's learning on it (benchmarks/offline_learning.py's results files and their curves)."""
    folder = RESULTS / "offline"
    notes, files = folder / "DATASETS.md", sorted(folder.glob("*.json"))
    if not notes.is_file() and not files:
        return []
    from offline_learning import draw_curves, summary_lines

    lines = ["## Offline RL: datasets made with distrl, and learning against d3rlpy", ""]
    if notes.is_file():
        lines += [notes.read_text().strip(), ""]
    for path in files:
        runs = json.loads(path.read_text())["runs"]
        if not runs:
            continue
        if draw:
            draw_curves(runs, path.with_suffix(".png"))
        dataset = runs[0]["dataset"]
        lines += [
            f"### {dataset}",
            "",
            *summary_lines(runs),
            "",
            f"![{dataset}: learning curves](results/offline/{path.with_suffix('.png').name})",
            f"Raw figures: [results/offline/{path.name}](results/offline/{path.name}).",
            "",
        ]
    return lines


def lag_section() -> list[str]:
    """APPO with lagged actors against lag 0 (benchmarks/appo_lag.py's kept result)."""
    path = RESULTS / "appo_lag.json"
    if not path.is_file():
        return []
    from appo_lag import report

    return ["## APPO: learning with lagged actors (V-trace)", "", *report(json.loads(path.read_text())), ""]


def sb3_section(runs: list[dict]) -> list[str]:
    """Reference runs of stable-baselines3 with distrl's preset on the same env version (sb3_reference.py)."""
    rows = []
    for summary_path in sorted((RESULTS / "sb3").glob("*/summary.json")):
        s = json.loads(summary_path.read_text())
        returns = read_monitor(summary_path.parent / "monitor.csv")["r"]
        distrl = [
            r["last100"]
            for r in runs
            if r["summary"]["env"] == s["env"]
            and r["summary"]["algo"] == s["algo"]
            and r["summary"]["strategy"] == "single"
            and r["seed"] == s["seed"]
            and r["settings"] == s["preset"]
        ]
        rows.append(
            [
                s["env"],
                s["algo"].upper(),
                s["preset"],
                s["library"],
                str(s["seed"]),
                f"{s['total_steps']:,}",
                f"{float(returns[-100:].mean()):,.0f}",
                f"{distrl[0]:,.0f}" if distrl else "—",
                f"{s['wall_s'] / 60:,.1f}",
            ]
        )
    if not rows:
        return []
    header = [
        "env",
        "algo",
        "preset",
        "library",
        "seed",
        "steps",
        "last 100 training episodes",
        "distrl, same seed",
        "wall min",
    ]
    return [
        "## Reference runs on the same env version",
        "",
        "`python benchmarks/sb3_reference.py ENV --seed N`: stable-baselines3 trained with exactly the "
        "hyperparameters of a distrl preset (VecNormalize for the normalisers). The published figures in the "
        "table above were measured on v3/v4 envs; these show what the reference implementation reaches on "
        "the v5 env distrl trains on.",
        "",
        *markdown_table(header, rows),
        "",
    ]


def page_text(draw: bool = True) -> str:
    """docs/results.md as it follows from the kept runs; ``draw`` also redraws its PNGs."""
    runs = load_runs()
    notes = RESULTS / "NOTES.md"
    body = [
        "# Results",
        "",
        "Learning results and speedups, regenerated by `python benchmarks/results.py` from the small files "
        "kept in `docs/results/` (each run's monitor.csv, summary.json and config.json). "
        "Return columns: mean ± std over seeds of each run's mean over its last 100 training episodes, "
        "and of its final 10-episode deterministic evaluation.",
        "",
        "## Learning",
        "",
        *learning_table(runs),
        "",
        *curve_figures(runs, draw),
        *atari_section(runs),
        *sb3_section(runs),
        *lag_section(),
        *spread_section(runs),
        *selfplay_section(),
        *offline_section(draw),
        "## Speedup against ideal, per strategy",
        "",
        *scaling_section(),
        *pbt_section(),
    ]
    if notes.is_file():
        body += [notes.read_text().strip(), ""]
    return "\n".join(body).rstrip() + "\n"


def write_page() -> None:
    PAGE.write_text(page_text())
    print(f"wrote {PAGE}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "collect":
        parser = argparse.ArgumentParser(prog="results.py collect")
        parser.add_argument("run_dirs", nargs="+")
        parser.add_argument(
            "--timing-not-comparable",
            default="",
            metavar="WHY",
            help="keep the run's returns but leave its wall time and SPS out of the table",
        )
        args = parser.parse_args(sys.argv[2:])
        collect(args.run_dirs, args.timing_not_comparable)
    elif len(sys.argv) > 1 and sys.argv[1] == "collect-bench":
        collect_bench(sys.argv[2], sys.argv[3])
    else:
        write_page()
