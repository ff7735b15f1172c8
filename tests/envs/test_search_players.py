"""The fixed search player: perfect tic-tac-toe, alpha-beta connect four, and ``distrl eval --opponent search``."""

import importlib
import json
import warnings

import gymnasium as gym
import numpy as np
import pytest

pytest.importorskip("pettingzoo")

from distrl.cli import main  # noqa: E402
from distrl.config import ConfigError  # noqa: E402
from distrl.envs.search_players import SearchOpponent  # noqa: E402
from distrl.envs.selfplay import RandomOpponent  # noqa: E402

TICTACTOE = "pettingzoo.classic.tictactoe_v3"
with warnings.catch_warnings():  # pettingzoo.classic warns on import that its env() is an older API
    warnings.simplefilter("ignore", DeprecationWarning)
    tictactoe_v3 = importlib.import_module(TICTACTOE)
    connect_four_v3 = importlib.import_module("pettingzoo.classic.connect_four_v3")


def make_game(module):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return module.env()


def search_player(module, depth=4):
    game = make_game(module)
    return SearchOpponent(game.observation_space(game.possible_agents[0]), module.__name__, depth)


def play(module, first, second, rng):
    """One whole game, ``first`` moving first: its reward (+1 win, 0 draw, -1 loss)."""
    game = make_game(module)
    game.reset(seed=int(rng.integers(2**31)))
    players = dict(zip(game.possible_agents, (first, second)))
    for agent in game.agent_iter():
        obs, _, terminated, truncated, _ = game.last()
        if terminated or truncated:
            break
        game.step(players[agent].act(None, obs, rng))
    return game.rewards[game.possible_agents[0]]


def record(module, search, other, games, seed=0):
    """The search player's wins, draws and losses over ``games`` games, moving first in every other one."""
    rng = np.random.default_rng(seed)
    results = [
        play(module, search, other, rng) if i % 2 == 0 else -play(module, other, search, rng) for i in range(games)
    ]
    return sum(r > 0 for r in results), sum(r == 0 for r in results), sum(r < 0 for r in results)


def position(shape, mine, theirs):
    """An observation of the player to move: ``mine`` and ``theirs`` are (row, column) cells, the mask every column
    (connect four) or cell (tic-tac-toe) still open."""
    board = np.zeros(shape, np.int8)
    for plane, cells in enumerate((mine, theirs)):
        for row, column in cells:
            board[row, column, plane] = 1
    taken = board.sum(axis=2)
    mask = taken[0] == 0 if shape[0] == 6 else taken.reshape(-1) == 0
    return {"observation": board, "action_mask": mask.astype(np.int8)}


def moves(player, obs, tries=20):
    """Every move ``player`` makes in ``obs`` over ``tries`` random streams (its ties are broken at random)."""
    return {player.act(None, obs, np.random.default_rng(seed)) for seed in range(tries)}


def test_perfect_tictactoe_never_loses_to_random_in_either_seat_and_wins_most_games():
    wins, draws, losses = record(tictactoe_v3, search_player(tictactoe_v3), RandomOpponent(), 200)
    # measured: 176 wins and 24 draws
    assert losses == 0 and wins >= 150, (wins, draws, losses)


def test_two_perfect_tictactoe_players_always_draw_yet_play_different_games():
    player = search_player(tictactoe_v3)
    rng = np.random.default_rng(1)
    assert [play(tictactoe_v3, player, player, rng) for _ in range(20)] == [0] * 20
    openings = {player.act(None, position((3, 3, 2), [], []), np.random.default_rng(seed)) for seed in range(20)}
    assert len(openings) > 1  # every first move draws with perfect play: the ties are broken at random


def test_tictactoe_takes_an_immediate_win_and_blocks_an_immediate_loss():
    player = search_player(tictactoe_v3)
    # cells 0 and 1 are the player's: 2 wins, though 5 would block the other player's 3, 4
    assert moves(player, position((3, 3, 2), mine=[(0, 0), (0, 1)], theirs=[(1, 0), (1, 1)])) == {2}
    # the other player threatens 5 (with 3 and 4); the player has no win of its own
    assert moves(player, position((3, 3, 2), mine=[(0, 0), (2, 1)], theirs=[(1, 0), (1, 1)])) == {5}


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_connect_four_takes_an_immediate_win_rather_than_block(depth):
    player = search_player(connect_four_v3, depth)
    obs = position((6, 7, 2), mine=[(5, 0), (5, 1), (5, 2)], theirs=[(5, 6), (4, 6), (3, 6)])
    assert moves(player, obs) == {3}


@pytest.mark.parametrize("depth", [2, 3, 4])
def test_connect_four_blocks_an_immediate_loss(depth):
    player = search_player(connect_four_v3, depth)
    obs = position((6, 7, 2), mine=[(5, 0), (5, 2), (4, 0)], theirs=[(5, 6), (4, 6), (3, 6)])
    assert moves(player, obs) == {6}


def test_connect_four_at_depth_4_beats_random_in_95_percent_of_games():
    wins, draws, losses = record(connect_four_v3, search_player(connect_four_v3, 4), RandomOpponent(), 100)
    # measured: 200 wins in 200 games (2.5 s on one core)
    assert wins >= 95, (wins, draws, losses)


def test_an_unknown_game_or_depth_is_a_one_line_config_error():
    go_like = gym.spaces.Dict(
        {"observation": gym.spaces.Box(0, 1, (5, 5, 17)), "action_mask": gym.spaces.Box(0, 1, (26,), np.int8)}
    )
    with pytest.raises(ConfigError, match="opponent='search' is not allowed for env='pettingzoo.classic.go_v5'") as err:
        SearchOpponent(go_like, "pettingzoo.classic.go_v5")
    assert "tic-tac-toe" in str(err.value) and "connect four" in str(err.value) and "(5, 5, 17)" in str(err.value)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="depth=0 is not allowed"):
        search_player(connect_four_v3, depth=0)


@pytest.fixture(scope="module")
def tictactoe_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("search") / "run"
    args = ["--n-envs", "4", "--n-steps", "32", "--total-steps", "2000", "--quiet", "--run-dir", str(run)]
    assert main(["train", "ppo", TICTACTOE, *args]) in (0, None)
    return run


def test_eval_against_the_search_player_never_wins_tictactoe(tictactoe_run, capsys):
    capsys.readouterr()
    assert main(["eval", str(tictactoe_run), "--opponent", "search", "--episodes", "20", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["opponent"] == "search" and result["games"] == 20
    assert result["wins"] + result["draws"] + result["losses"] == 20 and result["wins"] == 0, result
    assert main(["eval", str(tictactoe_run), "--opponent", "search:2", "--episodes", "4"]) == 0
    assert "against search:2: 0 wins" in capsys.readouterr().out


@pytest.mark.parametrize("opponent", ["search:0", "search:deep"])
def test_a_bad_search_depth_is_one_line_exit_2(tictactoe_run, capsys, opponent):
    capsys.readouterr()
    assert main(["eval", str(tictactoe_run), "--opponent", opponent]) == 2
    err = capsys.readouterr().err
    assert f"opponent='{opponent}' is not allowed: search:DEPTH takes a whole number" in err and err.count("\n") == 1


def test_eval_against_the_search_player_needs_a_game_it_knows(tmp_path, capsys):
    run = tmp_path / "cartpole"
    args = ["--total-steps", "256", "--n-steps", "64", "--batch-size", "64", "--quiet", "--run-dir", str(run)]
    assert main(["train", "ppo", "CartPole-v1", *args]) in (0, None)
    capsys.readouterr()
    assert main(["eval", str(run), "--opponent", "search"]) == 2
    err = capsys.readouterr().err
    assert "opponent='search' is not allowed for env='CartPole-v1': the search player plays tic-tac-toe" in err
    assert err.count("\n") == 1
