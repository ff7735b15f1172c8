"""Turn-based games of more than two players: knock-out Nim for three (tests/distrl_aecgames) from one seat."""

import itertools
import json
import warnings

import numpy as np
import pytest
import torch

pytest.importorskip("pettingzoo")

from pettingzoo.utils.wrappers import BaseWrapper  # noqa: E402

from distrl.cli import main  # noqa: E402
from distrl.envs.selfplay import RandomOpponent, SnapshotPool, TurnBasedGame, aec_factory  # noqa: E402

KNOCKOUT = "distrl_aecgames.knockout"
PILE = 7  # the game's default: the stones in a full pile


class TakeOne(RandomOpponent):
    """Takes one stone every move; each seat gets its own handle, and every move and finished game is noted."""

    def __init__(self):
        self.handles = itertools.count()
        self.moved: list[int] = []
        self.ended: list[tuple[int, float]] = []

    def begin_game(self, rng):
        return next(self.handles)

    def act(self, who, obs, rng):
        self.moved.append(who)
        return 0

    def end_game(self, who, margin):
        self.ended.append((who, margin))


def stones(obs) -> int:
    return int(np.argmax(obs["observation"][: PILE + 1]))


def players_in(obs) -> int:
    return int(np.argmax(obs["observation"][PILE + 1 :])) + 2


def test_the_game_passes_pettingzoos_api_test():
    from distrl_aecgames import knockout

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # pettingzoo.test imports PettingZoo's own envs
        from pettingzoo.test import api_test

        warnings.simplefilter("ignore", UserWarning)  # Dict observations, as in PettingZoo's classic games
        api_test(knockout.env(), num_cycles=200)


def test_the_learner_moves_on_one_seat_each_game():
    game = TurnBasedGame(aec_factory(KNOCKOUT, {}), TakeOne())
    seats, piles = [], []
    obs, info = game.reset(seed=4)  # env i of a vector env, seeded s + i, starts in seat (s + i) % 3
    for _ in range(4):
        seats.append(info["seat"])
        piles.append(stones(obs))
        obs, info = game.reset()
    assert seats == [1, 2, 0, 1]
    assert piles == [PILE - 1, PILE - 2, PILE, PILE - 1]  # the players before the learner have taken a stone each
    assert [game.reset(seed=s)[1]["seat"] for s in (0, 3, 5)] == [0, 0, 2]


def test_a_knocked_out_player_is_skipped_and_the_learners_game_ends_with_its_own():
    opponent = TakeOne()
    game = TurnBasedGame(aec_factory(KNOCKOUT, {}), opponent)
    obs, info = game.reset(seed=3)
    seat_of = {who: player for player, who in game.opponents.items()}
    assert info["seat"] == 0 and stones(obs) == 7 and players_in(obs) == 3
    # the learner takes 3 and 1 stones (7 - 3 - 1 - 1 leaves 2 for it, then 1 for player_1, who must take it)
    rewards = []
    for take in (3, 1):
        obs, reward, terminated, truncated, _ = game.step(take - 1)
        rewards.append(reward)
    # player_1 is out (-1; +0.5 to each player still in), leaves the game, and player_2 takes from a new pile
    assert rewards == [0.0, 0.5] and not terminated
    assert game.game.agents == ["player_0", "player_2"] and stones(obs) == 6 and players_in(obs) == 2
    for take in (1, 3):  # 6 - 1 - 1 - 3 leaves player_2 the last stone: the learner is the last one left
        obs, reward, terminated, truncated, _ = game.step(take - 1)
    assert reward == 1.0 and terminated and not truncated
    assert [seat_of[who] for who in opponent.moved] == ["player_1", "player_2", "player_1"] + ["player_2"] * 3
    # margins against each: the learner's 1.5 against player_1's -1 and player_2's 0.5 - 1
    assert sorted((seat_of[who], margin) for who, margin in opponent.ended) == [("player_1", 2.5), ("player_2", 2.0)]
    assert game.outcomes.tolist() == [1, 0, 0]

    opponent.moved.clear()
    obs, _ = game.reset(seed=3)
    for _ in range(3):  # 7 - 1 - 1 - 1 - 1 - 1 - 1 leaves the learner the last stone
        obs, reward, terminated, truncated, _ = game.step(0)
    assert reward == -1.0 and terminated and len(opponent.moved) == 4
    assert game.game.unwrapped.in_game() == ["player_1", "player_2"]  # the game goes on without the learner
    assert game.outcomes.tolist() == [1, 0, 1]


class Recorded(BaseWrapper):
    """Notes every move of a player still in the game since the last reset, as (player, action)."""

    def __init__(self, env):
        super().__init__(env)
        self.moves: list[tuple[str, int]] = []

    def reset(self, seed=None, options=None):
        self.moves = []
        super().reset(seed, options)

    def step(self, action):
        if action is not None:
            self.moves.append((self.agent_selection, int(action)))
        super().step(action)


def replayed_rewards(moves: list[tuple[str, int]], learner: str) -> list[float]:
    """The learner's rewards at each of its turns (PettingZoo's ``last()``: its rewards since its last move) in
    PettingZoo's own loop over the game, the same moves made again, until its game ends."""
    from distrl_aecgames import knockout

    env = knockout.env()
    env.reset()
    moves = iter(moves)
    rewards = []
    for agent in env.agent_iter():
        _, reward, terminated, truncated, _ = env.last()
        if agent == learner:
            rewards.append(float(reward))
            if terminated or truncated:
                return rewards
        if terminated or truncated:
            env.step(None)
            continue
        player, action = next(moves)
        assert player == agent
        env.step(action)
    raise AssertionError(f"{learner}'s game did not end")


def test_the_learners_reward_is_what_the_game_pays_its_seat_until_its_next_turn():
    from distrl_aecgames import knockout

    recorded = Recorded(knockout.env())
    game = TurnBasedGame(lambda: recorded)
    rng = np.random.default_rng(0)
    paid_between_turns = 0
    for seed in range(30):  # ten games in each seat
        obs, _ = game.reset(seed=seed)
        rewards, done = [], False
        while not done:
            obs, reward, terminated, truncated, _ = game.step(rng.choice(np.flatnonzero(obs["action_mask"])))
            rewards.append(reward)
            done = terminated or truncated
        turns = replayed_rewards(recorded.moves, game.learner)
        assert turns[0] == 0.0 and rewards == turns[1:], (seed, rewards, turns)
        assert sum(rewards) == game.returns[game.learner]
        paid_between_turns += sum(r == 0.5 for r in rewards)
    assert paid_between_turns > 0  # another player knocked out while the learner waited for its turn


def test_each_other_seat_draws_its_own_opponent_from_the_pool():
    class Agent:
        observation_space = TurnBasedGame(aec_factory(KNOCKOUT, {})).observation_space
        params = type("P", (), {"data": torch.zeros(3)})()

    pool = SnapshotPool(Agent(), size=4, every=1, sampling="uniform")
    for version in range(3):
        pool.observe(version, torch.full((3,), float(version)))
    game = TurnBasedGame(aec_factory(KNOCKOUT, {}), pool)
    seated = []
    for k in range(20):
        game.reset(seed=3 * k)  # seat 0: no opponent has moved yet (the fake agent cannot)
        seated.append(len(set(game.opponents.values())))
    assert 2 in seated and 1 in seated  # mostly two different members of the pool, sometimes the same one twice


def test_self_play_on_three_players_records_two_opponents_a_game(tmp_path):
    run = tmp_path / "run"
    args = ["--snapshot-every", "1", "--opponent-pool", "100", "--n-envs", "4", "--n-steps", "32", "--batch-size", "64"]
    code = main(
        ["train", "ppo", KNOCKOUT, "--self-play", *args, "--total-steps", "512", "--quiet", "--run-dir", str(run)]
    )
    assert code in (0, None)
    played = json.loads((run / "summary.json").read_text())["self_play"]
    games = sum(played["training_games"].values())
    opponents = played["opponents"]
    assert games > 50 and opponents[0]["version"] == "random" and len(opponents) > 2
    assert sum(o["games"] for o in opponents) == 2 * games  # every game seats two opponents, each with a record
    assert all(o["wins"] + o["draws"] + o["losses"] == o["games"] for o in opponents)


def test_ppo_learns_to_beat_two_random_players(tmp_path, capsys):
    # a random player wins a third of its games against two others (by symmetry; measured 0.33); 4000 steps of PPO
    # win 78% (measured with seeds 0, 1 and 2), from every seat
    game = TurnBasedGame(aec_factory(KNOCKOUT, {}))
    rng = np.random.default_rng(1)
    for seed in range(1500):
        obs, _ = game.reset(seed=seed)
        done = False
        while not done:
            obs, _, terminated, truncated, _ = game.step(rng.choice(np.flatnonzero(obs["action_mask"])))
            done = terminated or truncated
    random_rate = game.outcomes[0] / 1500
    assert 0.28 < random_rate < 0.38

    run = tmp_path / "run"
    args = ["--n-envs", "8", "--n-steps", "64", "--batch-size", "128", "--learning-rate", "1e-3", "--quiet"]
    assert main(["train", "ppo", KNOCKOUT, *args, "--total-steps", "4000", "--run-dir", str(run)]) in (0, None)
    capsys.readouterr()
    assert main(["eval", str(run), "--opponent", "random", "--episodes", "600", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert [sum(result[f"seat_{s}"].values()) for s in (1, 2, 3)] == [200, 200, 200]
    assert result["wins"] / 600 > random_rate + 0.25, result


def test_a_game_whose_players_have_unlike_spaces_is_one_line_exit_2(tmp_path, capsys):
    args = ["train", "ppo", "distrl_aecgames.unequal_spaces", "--total-steps", "256", "--quiet"]
    code = main([*args, "--run-dir", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "the observation or action spaces of player_2 differ from player_0's" in err


@pytest.mark.parametrize(
    ("name", "players"), [("distrl_aecgames:Knockout", 3), ("distrl_aecgames:two_player_knockout", 2)]
)
def test_a_game_named_as_package_module_name_is_a_class_or_a_function(tmp_path, name, players):
    from distrl.envs.selfplay import is_turn_based_game

    assert is_turn_based_game(name) and not is_turn_based_game("distrl_aecgames:stones")
    assert len(TurnBasedGame(aec_factory(name, {})).players) == players
    run = tmp_path / "run"
    args = ["--n-envs", "2", "--n-steps", "16", "--batch-size", "32", "--total-steps", "64", "--eval-episodes", "4"]
    assert main(["train", "ppo", name, *args, "--quiet", "--run-dir", str(run)]) in (0, None)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final_eval_wins"] + summary["final_eval_draws"] + summary["final_eval_losses"] == 4
