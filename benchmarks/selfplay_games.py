"""Self-play on PettingZoo's tic-tac-toe and connect four: win rates against a random player and a search player.

    python benchmarks/selfplay_games.py            # seed 0 of each game; writes docs/results/selfplay.json
    python benchmarks/selfplay_games.py --seeds 0 1 2
    python benchmarks/selfplay_games.py --games "connect four"   # one game; the other's kept result stays
    python benchmarks/selfplay_games.py --quick    # tiny budgets, prints the table, writes nothing

Each game is trained with ``distrl train ppo GAME --self-play`` and the settings in :data:`GAMES` (one process,
``--strategy single``), then the trained run plays whole games with ``distrl eval RUN --opponent ...``, its seat
moving on by one each game, deterministically (the most probable legal move):

- ``random``: uniformly random legal moves;
- ``search``: the fixed search player of ``distrl.envs.search_players``: perfect at tic-tac-toe (the best a policy
  can do is draw every game), an alpha-beta search ``DEPTH`` moves ahead at connect four.

The table gives wins, draws and losses per opponent, overall and moving second (the harder seat), and the
training time; docs/results.md shows it (``python benchmarks/results.py``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from harness import markdown_table

RESULT = Path(__file__).parents[1] / "docs" / "results" / "selfplay.json"

SHARED = ["--n-envs", "8", "--n-steps", "64", "--batch-size", "128", "--learning-rate", "1e-3", "--ent-coef", "0.01"]
GAMES: dict[str, dict] = {
    "tic-tac-toe": {
        "env": "pettingzoo.classic.tictactoe_v3",
        "args": [*SHARED, "--self-play", "--random-opponent-share", "0.5", "--lr-schedule", "linear"],
        "steps": 300_000,
        "opponents": {"random": 400, "search": 100},
    },
    "connect four": {
        "env": "pettingzoo.classic.connect_four_v3",
        "args": [*SHARED, "--self-play", "--random-opponent-share", "0.5", "--lr-schedule", "linear"]
        + ["--net-arch", "128", "128"],
        "steps": 1_000_000,
        "opponents": {"random": 400, "search:1": 100, "search:2": 100, "search:4": 100},
    },
}


def distrl(*args: str) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "distrl", *args], capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"distrl {' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return out


def play(game: str, seed: int, root: Path, steps: int) -> dict:
    """Train one run of ``game`` and play it against every opponent in :data:`GAMES`."""
    setting = GAMES[game]
    run_dir = root / f"{game.replace(' ', '_')}-s{seed}"
    start = time.perf_counter()
    train = ["train", "ppo", setting["env"], *setting["args"], "--total-steps", str(steps), "--seed", str(seed)]
    distrl(*train, "--quiet", "--run-dir", str(run_dir))
    trained_s = time.perf_counter() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    against = {}
    for opponent, games in setting["opponents"].items():
        out = distrl("eval", str(run_dir), "--opponent", opponent, "--episodes", str(games), "--seed", "0", "--json")
        against[opponent] = json.loads(out.stdout.strip().splitlines()[-1])
    return {
        "seed": seed,
        "steps": summary["total_steps"],
        "train_s": trained_s,
        "training_games": summary["self_play"]["training_games"],
        "pool": len(summary["self_play"]["opponents"]),
        "against": against,
        "command": "distrl " + " ".join(train),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--games", nargs="+", default=list(GAMES), choices=list(GAMES))
    parser.add_argument("--root", default="/tmp/distrl-selfplay", help="where the trained runs are kept")
    parser.add_argument("--quick", action="store_true", help="5,000 steps a game, print only")
    args = parser.parse_args()
    root = Path(args.root)
    root.mkdir(parents=True, exist_ok=True)
    data: dict = {"games": {}}
    for game in args.games:
        steps = 5_000 if args.quick else GAMES[game]["steps"]
        runs = []
        for seed in args.seeds:
            runs.append(play(game, seed, root, steps))
            print(f"  {game} seed {seed}: {json.dumps(runs[-1]['against'])}", flush=True)
        data["games"][game] = {"env": GAMES[game]["env"], "runs": runs}
    body = "\n".join(report(data))
    print(body)
    if not args.quick:  # the games not run now keep their results
        kept = json.loads(RESULT.read_text()) if RESULT.is_file() else {"games": {}}
        kept["games"].update(data["games"])
        RESULT.write_text(json.dumps(kept, indent=1) + "\n")


def report(data: dict) -> list[str]:
    """The table of a result of this benchmark (as written to docs/results/selfplay.json)."""
    rows = []
    for game, kept in data["games"].items():
        for run in kept["runs"]:
            for opponent, r in run["against"].items():
                second = r["seat_2"]
                rows.append(
                    [
                        game,
                        str(run["seed"]),
                        f"{run['steps']:,}",
                        opponent,
                        str(r["games"]),
                        f"{r['wins']} / {r['draws']} / {r['losses']}",
                        f"{100 * r['losses'] / r['games']:.1f}%",
                        f"{second['wins']} / {second['draws']} / {second['losses']}",
                        f"{run['train_s'] / 60:.1f}",
                    ]
                )
    commands = [f"- {game}: `{kept['runs'][0]['command']}`" for game, kept in data["games"].items() if kept["runs"]]
    return [
        "PPO trained by self-play (`--self-play`: past copies of itself and the random player as opponents), then "
        "evaluated with `distrl eval RUN --opponent OPPONENT --episodes N --json`, moving first and second in turn, "
        "always playing its most probable legal move. `search` is perfect at tic-tac-toe (a policy can at best "
        "draw it); at connect four `search:D` searches D moves ahead with alpha-beta. Reproduce: "
        "`python benchmarks/selfplay_games.py`; training minutes were taken with other runs beside on the 2 cores, "
        "so they do not compare. The training commands:",
        "",
        *commands,
        "",
        *markdown_table(
            [
                "game",
                "seed",
                "steps",
                "opponent",
                "games",
                "wins / draws / losses",
                "losses",
                "moving second: w / d / l",
                "training min",
            ],
            rows,
        ),
    ]


if __name__ == "__main__":
    main()
