"""Two-player turn-based games: one seat against an opponent, the snapshot pool, self-play and eval --opponent."""

import json

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from distrl.cli import main  # noqa: E402
from distrl.envs.selfplay import RandomOpponent, SnapshotPool, TurnBasedGame, aec_factory, outcomes  # noqa: E402

TICTACTOE = "pettingzoo.classic.tictactoe_v3"


class FirstLegal(RandomOpponent):
    """Always the lowest legal square; counts its games."""

    def __init__(self):
        self.ended: list[float] = []

    def act(self, who, obs, rng):
        return int(np.flatnonzero(obs["action_mask"])[0])

    def end_game(self, who, margin):
        self.ended.append(margin)


def test_the_learner_alternates_seats_and_the_opponent_moves_inside_step():
    opponent = FirstLegal()
    game = TurnBasedGame(aec_factory(TICTACTOE, {}), opponent)
    obs, info = game.reset(seed=4)
    assert info["seat"] == 0 and obs["action_mask"].sum() == 9  # first to move: an empty board
    # the learner takes squares 8, 7, 6 (the bottom row); the opponent the lowest free ones: 0, 1, then 2 wins
    rewards = []
    for square in (8, 7, 6):
        obs, reward, terminated, truncated, _ = game.step(square)
        rewards.append(reward)
        if terminated:
            break
    assert rewards == [0.0, 0.0, 1.0] and terminated and not truncated  # the learner's row completes first
    assert opponent.ended == [2.0] and game.outcomes.tolist() == [1, 0, 0]  # the learner's 1 against its -1
    obs, info = game.reset()
    assert info["seat"] == 1 and obs["action_mask"].sum() == 8  # second: the opponent has already moved
    assert obs["action_mask"][0] == 0  # into the lowest square
    obs, info = game.reset(seed=5)
    assert info["seat"] == 1  # env i of a vector env, seeded s + i, starts in seat (s + i) % 2


def test_the_pool_snapshots_every_k_versions_keeps_the_newest_and_rates_games():
    class Agent:
        observation_space = TurnBasedGame(aec_factory(TICTACTOE, {})).observation_space
        params = type("P", (), {"data": torch.zeros(3)})()

    pool = SnapshotPool(Agent(), size=2, every=5)
    for version in range(0, 16):
        pool.observe(version, torch.full((3,), float(version)))
    assert [s["version"] for s in pool.snapshots] == [10, 15]
    assert torch.equal(pool.snapshots[0]["params"], torch.full((3,), 10.0))
    for _ in range(30):  # the learner beats snapshot 10 always and loses to 15 always
        pool.end_game(10, 1.0)
        pool.end_game(15, -1.0)
    rng = np.random.default_rng(0)
    picks = [pool.begin_game(rng) for _ in range(4000)]
    # pfsp: weights (1 - p)^2 + 1e-3: 1 for the copy it cannot beat, 1/4 for the unplayed random player, ~0 else
    assert (
        abs(picks.count(15) / 4000 - 1.001 / 1.252) < 0.03 and abs(picks.count("random") / 4000 - 0.251 / 1.252) < 0.03
    )
    table = pool.table()
    assert [o["version"] for o in table["opponents"]] == ["random", 10, 15]
    assert table["opponents"][1]["learner_win_rate"] == 1.0 and table["opponents"][2]["learner_win_rate"] == 0.0
    assert table["opponents"][2]["elo"] > 1000 > table["opponents"][1]["elo"]
    pool.sampling = "uniform"
    assert 0.28 < [pool.begin_game(rng) for _ in range(3000)].count(15) / 3000 < 0.39
    assert outcomes(np.array([1.0, 0.0, -1.0, 1.0]), "") == {"wins": 2, "draws": 1, "losses": 1}
    pool.random_share = 0.5  # half the seats to the random player outright, the rest uniform over all three
    assert abs([pool.begin_game(rng) for _ in range(4000)].count("random") / 4000 - (0.5 + 0.5 / 3)) < 0.03


def self_play_tictactoe(tmp_path, capsys, steps: int, seed: int = 0) -> dict:
    """Train tic-tac-toe by self-play for ``steps`` and play 400 games against a random player in both seats."""
    run = tmp_path / f"run-{seed}"
    args = ["--n-envs", "8", "--n-steps", "64", "--batch-size", "128", "--learning-rate", "1e-3", "--quiet"]
    args += ["--seed", str(seed)]
    args += ["--lr-schedule", "linear", "--ent-coef", "0.01", "--random-opponent-share", "0.5"]
    code = main(["train", "ppo", TICTACTOE, "--self-play", *args, "--total-steps", str(steps), "--run-dir", str(run)])
    assert code in (0, None)
    summary = json.loads((run / "summary.json").read_text())
    played = summary["self_play"]
    assert sum(played["training_games"].values()) > 1000 and played["opponents"]
    assert played["opponents"][0]["version"] == "random" and len(played["opponents"]) == 1 + 8
    assert all(o["version"] % 5 == 0 for o in played["opponents"][1:])
    capsys.readouterr()
    assert main(["eval", str(run), "--opponent", "random", "--episodes", "400", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert (
        result["games"] == 400
        and result["seat_1"]["wins"] + result["seat_1"]["draws"] + result["seat_1"]["losses"] == 200
    )
    return result


def test_self_play_learns_tictactoe_to_lose_far_less_than_a_random_player_in_either_seat(tmp_path, capsys):
    # a random player loses 45% of its games against another (30% moving first, 60% second; measured); 50k steps
    # of self-play brought that to 5.5% (22 of 400, none moving first; 5.75% at 80k, 5.25% at 100k; measured when
    # a step was spent on each reset) and 25k steps to 10.25% (41 of 400, 7 moving first; 44 at 30k; on a Xeon,
    # 2026-11-30): under 20% at 25k here, where a run's figure moves from one CPU to another, and the 5% in
    # the slow test below, at 300k
    result = self_play_tictactoe(tmp_path, capsys, 25_000)
    assert result["losses"] <= 0.20 * 400, result


@pytest.mark.slow
def test_self_play_learns_tictactoe_to_lose_at_most_5_percent_against_a_random_player(tmp_path, capsys):
    # 300k steps, losses in 400 games: seeds 0, 1, 2 lost 23, 11, 13 (each next episode begun at once); 15-16 (two
    # evaluation seeds), 16 and 8 when a step was spent on each reset. One seed's figure moves by as much as the two
    # differ, so the 5% is asked of seeds 0 and 1 together (docs/results.md: benchmarks/selfplay_games.py)
    results = [self_play_tictactoe(tmp_path, capsys, 300_000, seed) for seed in (0, 1)]
    assert sum(r["losses"] for r in results) <= 0.05 * 800, results


TTT = ["train", "ppo", TICTACTOE, "--self-play"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["train", "ppo", "CartPole-v1", "--self-play"], "self_play is not allowed for env='CartPole-v1'"),
        ([*TTT, "--random-opponent-share", "1.5"], "random_opponent_share=1.5 is not allowed: must be in [0, 1]"),
        ([*TTT, "--snapshot-every", "0"], "snapshot_every=0 is not allowed: must be > 0 updates"),
        ([*TTT, "--opponent-pool", "-1"], "opponent_pool=-1 is not allowed: must be >= 0"),
    ],
)
def test_bad_self_play_input_is_one_line_exit_2(tmp_path, capsys, args, message):
    code = main([*args, "--total-steps", "256", "--quiet", "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1


def test_eval_opponent_needs_a_two_player_game(tmp_path, capsys):
    run = tmp_path / "cartpole"
    main(
        [
            "train",
            "ppo",
            "CartPole-v1",
            "--total-steps",
            "256",
            "--n-steps",
            "64",
            "--batch-size",
            "64",
            "--quiet",
            "--run-dir",
            str(run),
        ]
    )
    capsys.readouterr()
    assert main(["eval", str(run), "--opponent", "random"]) == 2
    assert "opponent= is not allowed for env='CartPole-v1': it is not a turn-based game" in capsys.readouterr().err


@pytest.mark.multiprocess
@pytest.mark.parametrize("strategy", ["actor-learner", "pipeline"])
@pytest.mark.heavy
def test_rollout_workers_report_their_own_pools_to_the_learners_summary(tmp_path, strategy):
    # each rollout worker plays its games against a pool of its own: summary.json lists every worker's table and
    # sums their records
    run = tmp_path / "run"
    args = ["--strategy", strategy, "--workers", "2", "--n-envs", "2", "--n-steps", "16", "--batch-size", "32"]
    code = main(
        ["train", "ppo", TICTACTOE, "--self-play", *args, "--total-steps", "640", "--quiet", "--run-dir", str(run)]
    )
    assert code in (0, None)
    played = json.loads((run / "summary.json").read_text())["self_play"]
    tables = played["workers"]
    assert len(tables) == 2
    for outcome in ("wins", "draws", "losses"):
        assert played["training_games"][outcome] == sum(table["training_games"][outcome] for table in tables)
    for table in tables:
        games = sum(table["training_games"].values())
        assert games > 0 and sum(opponent["games"] for opponent in table["opponents"]) == games
        assert table["opponents"][0]["version"] == "random" and len(table["opponents"]) > 1
