"""Turn-based games (PettingZoo AEC) from one seat, and self-play against a pool of past policies.

:class:`TurnBasedGame` is a Gymnasium env: the learner plays one seat of a PettingZoo AEC game of two players or
more (tic-tac-toe, connect four), one seat further on each game, and an opponent moves for every other seat
inside ``step``. The learner's reward is its own (+1 win, -1 loss, 0 draw in the classic games); observations
keep the game's Dict with its ``action_mask``, so the masks apply (:mod:`distrl.envs.masks`). Because the game is an
ordinary env to distrl, every algorithm, strategy and evaluation path plays it unchanged. A game is won, drawn
or lost as the learner's return is positive, zero or negative, which is what winning means in a zero-sum game.

The opponent is :class:`RandomOpponent` (uniform over the legal moves) until a run with ``--self-play`` attaches
a :class:`SnapshotPool`: copies of the learner's own weights taken every ``snapshot_every`` policy versions, at
most ``opponent_pool`` of them, and the random player. Each of the other seats samples its own for each game (a
three-player game can seat two different copies), uniformly or, as AlphaStar's prioritised fictitious self-play
does (Vinyals et al. 2019), with weight ``(1 - p)^2`` where ``p`` is the learner's win rate against it, so that
the opponents it cannot yet beat come up more often. Against each opponent of a game the learner wins, draws or
loses as its return is above, equal to or below that opponent's seat's when the learner's game ends (in a
two-player zero-sum game, the game's own result). That result goes into the opponent's record and into Elo
ratings updated pairwise, the learner against that opponent, once for each opponent of the game (K = 16,
everyone starting at 1000): comparing returns rather than crediting every opponent with the learner's result
keeps a learner as strong as its opponents at even odds against each, however many sit at the table.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any, Protocol

import gymnasium as gym
import numpy as np

from distrl.config import ConfigError
from distrl.envs.pettingzoo import names_a

ELO_K = 16.0
ELO_START = 1000.0


class Opponent(Protocol):
    def begin_game(self, rng: np.random.Generator) -> Any:
        """Who plays one seat of this game (a handle :meth:`act` and :meth:`end_game` get back); called once for
        each seat that is not the learner's."""
        ...

    def act(self, who: Any, obs: dict[str, np.ndarray], rng: np.random.Generator) -> int: ...

    def end_game(self, who: Any, margin: float) -> None:
        """The learner's game is over: ``margin`` is its return minus that of ``who``'s seat (positive when the
        learner came out ahead of it)."""
        ...


class RandomOpponent:
    """Uniformly random legal moves."""

    def begin_game(self, rng: np.random.Generator) -> Any:
        return None

    def act(self, who: Any, obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
        return int(rng.choice(np.flatnonzero(obs["action_mask"])))

    def end_game(self, who: Any, margin: float) -> None:
        pass


def is_turn_based_game(name: str) -> bool:
    """Whether ``name`` builds a PettingZoo AEC game: a module whose ``env()`` builds one
    ("pettingzoo.classic.tictactoe_v3"), or 'package.module:Name' naming an AECEnv class or a function that
    returns one (called once here, without arguments, to find out)."""
    module_name, _, attr = name.partition(":")
    if "." not in module_name and not attr:
        return False
    try:
        import pettingzoo

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(module_name)
    except ImportError:
        return False
    if not attr:
        return callable(getattr(module, "env", None)) and not callable(getattr(module, "parallel_env", None))
    return names_a(module, attr, pettingzoo.AECEnv)


def aec_factory(name: str, env_kwargs: dict[str, Any]) -> Callable[[], Any]:
    """A function that builds the AEC game ``name`` (see :func:`is_turn_based_game`) with ``env_kwargs``."""
    module_name, _, attr = name.partition(":")

    def make() -> Any:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            module = importlib.import_module(module_name)
        return getattr(module, attr or "env")(**env_kwargs)

    return make


class TurnBasedGame(gym.Env):
    """One seat of an AEC game of two players or more; every other seat is ``opponent``'s (see the module
    docstring).

    The learner's step reward is its reward from its own move plus those it is paid during the other players'
    moves until its next turn. A player the game has ended for (terminated or truncated while the others play
    on) is stepped with None, as PettingZoo removes players, and its seat is skipped from then on; the
    learner's episode ends when its own game does.
    """

    metadata = {"render_modes": []}

    def __init__(self, make_game: Callable[[], Any], opponent: Opponent | None = None):
        self.game = make_game()
        self.players = tuple(self.game.possible_agents)
        if len(self.players) < 2:
            raise ConfigError(
                f"possible_agents={list(self.players)} is not allowed: a turn-based game needs two players or more"
            )
        first = self.players[0]
        observation_space, action_space = self.game.observation_space(first), self.game.action_space(first)
        unlike = [
            p
            for p in self.players[1:]
            if self.game.observation_space(p) != observation_space or self.game.action_space(p) != action_space
        ]
        if unlike:
            raise ConfigError(
                f"the observation or action spaces of {', '.join(unlike)} differ from {first}'s, which is not "
                "allowed: one policy plays every seat"
            )
        self.observation_space, self.action_space = observation_space, action_space
        self.opponent: Opponent = opponent if opponent is not None else RandomOpponent()
        self.rng = np.random.default_rng()
        self.games = 0
        self.seat = 0
        self.opponents: dict[str, Any] = {}
        """This game's opponent handle (from ``opponent.begin_game``) for each seat but the learner's."""
        self.returns: dict[str, float] = {}
        """Every seat's return so far in this game."""
        self.outcomes = np.zeros(3, np.int64)
        """This env's finished games from the learner's side: wins, draws, losses."""

    @property
    def learner(self) -> str:
        return self.players[self.seat]

    def _paid(self) -> float:
        """Adds the rewards of the game's last move to every seat's return, and gives back the learner's."""
        for player, reward in self.game.rewards.items():
            self.returns[player] += float(reward)
        return float(self.game.rewards[self.learner])

    def _play_others(self) -> float:
        """The other players' moves until the learner's turn or the end of its game; its reward meanwhile."""
        reward = 0.0
        while not self._over() and self.game.agent_selection != self.learner:
            player = self.game.agent_selection
            if self.game.terminations[player] or self.game.truncations[player]:
                self.game.step(None)  # PettingZoo's way out for a player whose game has ended
            else:
                self.game.step(self.opponent.act(self.opponents[player], self.game.observe(player), self.rng))
            reward += self._paid()
        return reward

    def _over(self) -> bool:
        return bool(self.game.terminations[self.learner] or self.game.truncations[self.learner])

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[Any, dict]:
        if seed is not None:  # env i of a vector env (seeded s + i) starts in seat (s + i) % players
            self.rng = np.random.default_rng(seed)
            self.games = seed % len(self.players)
        self.game.reset(seed=seed)
        self.seat = self.games % len(self.players)  # the seats take turns: all are learned and evaluated alike
        self.games += 1
        self.opponents = {p: self.opponent.begin_game(self.rng) for p in self.players if p != self.learner}
        self.returns = dict.fromkeys(self.players, 0.0)
        self._play_others()
        return self.game.observe(self.learner), {"seat": self.seat}

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict]:
        self.game.step(int(action))
        reward = self._paid() + self._play_others()
        done = self._over()
        truncated = bool(self.game.truncations[self.learner]) and not self.game.terminations[self.learner]
        if done:
            learner_return = self.returns[self.learner]
            self.outcomes[0 if learner_return > 0 else 2 if learner_return < 0 else 1] += 1
            for player, who in self.opponents.items():
                self.opponent.end_game(who, learner_return - self.returns[player])
        return self.game.observe(self.learner), reward, done and not truncated, truncated, {"seat": self.seat}

    def close(self) -> None:
        self.game.close()


class SnapshotPool:
    """Past copies of the learner's weights as opponents (see the module docstring); ``agent`` acts with them."""

    def __init__(self, agent: Any, size: int, every: int, sampling: str = "pfsp", random_share: float = 0.0):
        from distrl.envs.spaces import DictLayout

        self.agent, self.size, self.every, self.sampling = agent, size, every, sampling
        self.random_share = random_share
        """The share of seats the random player takes outright, before the others are sampled (among all the
        members, the random player included): a floor on how often the learner meets it."""
        self.layout = DictLayout(agent.observation_space)
        self.snapshots: list[dict[str, Any]] = []
        self.loaded = -1
        self.learner_elo = ELO_START
        self.random = RandomOpponent()
        self.baseline = {"version": "random", "games": 0, "wins": 0, "draws": 0, "losses": 0, "elo": ELO_START}
        """The uniformly random player, a member of the pool for good: a policy that only ever met copies of
        itself can miss moves that no copy plays, and a random player finds them (as a league keeps fixed
        players beside the learner's past selves)."""

    def observe(self, version: int, params: Any) -> None:
        """After an update: every ``every`` versions, the learner's weights join the pool (the oldest leave)."""
        if version % self.every or any(s["version"] == version for s in self.snapshots):
            return
        snapshot = {"version": version, "params": params.detach().cpu().clone(), "games": 0, "wins": 0}
        self.snapshots.append({**snapshot, "draws": 0, "losses": 0, "elo": self.learner_elo})
        if len(self.snapshots) > self.size:
            self.snapshots.pop(0)
            self.loaded = -1

    @property
    def members(self) -> list[dict[str, Any]]:
        return [self.baseline, *self.snapshots]

    def begin_game(self, rng: np.random.Generator) -> Any:
        members = self.members
        if self.random_share and rng.random() < self.random_share:
            return self.baseline["version"]
        if self.sampling == "uniform":
            return members[int(rng.integers(len(members)))]["version"]
        rates = np.array([s["wins"] / s["games"] if s["games"] else 0.5 for s in members])
        weights = (1.0 - rates) ** 2 + 1e-3
        return members[int(rng.choice(len(members), p=weights / weights.sum()))]["version"]

    def _find(self, version: Any) -> dict[str, Any] | None:
        return next((s for s in self.members if s["version"] == version), None)

    def act(self, who: Any, obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
        snapshot = self._find(who)
        if snapshot is None or snapshot is self.baseline:
            return self.random.act(None, obs, rng)
        if self.loaded != who:
            self.agent.params.data.copy_(snapshot["params"].to(self.agent.params.data.device))
            self.agent.refresh_acting_copy()
            self.loaded = who
        row = self.layout.pack({k: np.asarray(v)[None] for k, v in obs.items()})
        noise = np.stack([self.agent.spec.draw_noise(rng, ())])
        return int(np.asarray(self.agent.act(row, noise)).reshape(-1)[0])

    def end_game(self, who: Any, margin: float) -> None:
        snapshot = self._find(who)
        if snapshot is None:
            return
        score = 1.0 if margin > 0 else 0.0 if margin < 0 else 0.5
        snapshot["games"] += 1
        snapshot["wins" if score == 1.0 else "losses" if score == 0.0 else "draws"] += 1
        expected = 1.0 / (1.0 + 10 ** ((snapshot["elo"] - self.learner_elo) / 400.0))
        self.learner_elo += ELO_K * (score - expected)
        snapshot["elo"] -= ELO_K * (score - expected)

    def table(self) -> dict[str, Any]:
        """What summary.json keeps: the learner's Elo and each snapshot's record against it."""
        rows = [{k: v for k, v in s.items() if k != "params"} for s in self.members]
        for row in rows:
            row["learner_win_rate"] = row["wins"] / row["games"] if row["games"] else None
        return {"learner_elo": self.learner_elo, "opponents": rows}


def games_of(vec_env: Any) -> list[TurnBasedGame]:
    """The :class:`TurnBasedGame` envs inside a distrl vector env (sync or single; async ones are out of reach)."""
    inner = vec_env.env
    envs = inner.envs if hasattr(inner, "envs") else [getattr(inner, "env", None)]
    return [e.unwrapped for e in envs if e is not None and isinstance(e.unwrapped, TurnBasedGame)]


def attach_pool(vec_env: Any, make_agent: Callable[[], Any], run: Any) -> SnapshotPool | None:
    """With ``run.self_play``, a :class:`SnapshotPool` (acting through an agent ``make_agent`` builds) as the
    opponent of every game in ``vec_env``; None otherwise."""
    if not run.self_play:
        return None
    games = games_of(vec_env)
    if not games:
        raise ConfigError(
            f"self_play is not allowed for env={run.env!r}: it needs a turn-based PettingZoo game (a module "
            "with env(), e.g. pettingzoo.classic.tictactoe_v3) stepped in the training process (--vec auto or sync)"
        )
    pool = SnapshotPool(
        make_agent(), run.opponent_pool, run.snapshot_every, run.opponent_sampling, run.random_opponent_share
    )
    for game in games:
        game.opponent = pool
    return pool


def self_play_summary(pool: SnapshotPool, vec_env: Any) -> dict[str, Any]:
    """summary.json's ``self_play``: the training games' record from the learner's seat, its Elo, the pool."""
    wins, draws, losses = (int(n) for n in sum(game.outcomes for game in games_of(vec_env)))
    return {"training_games": {"wins": wins, "draws": draws, "losses": losses}, **pool.table()}


def outcomes(returns: np.ndarray, prefix: str = "final_eval_") -> dict[str, int]:
    """Wins, draws and losses of a turn-based game's episode returns (positive, zero, negative)."""
    returns = np.asarray(returns)
    return {
        f"{prefix}wins": int((returns > 0).sum()),
        f"{prefix}draws": int((returns == 0).sum()),
        f"{prefix}losses": int((returns < 0).sum()),
    }


class ModelOpponent:
    """A trained model (``distrl.Model``) playing the other seats."""

    def __init__(self, model: Any, deterministic: bool = True):
        self.model, self.deterministic = model, deterministic

    def begin_game(self, rng: np.random.Generator) -> Any:
        return None

    def act(self, who: Any, obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
        action, _ = self.model.predict(obs, deterministic=self.deterministic, rng=rng)
        return int(action)

    def end_game(self, who: Any, margin: float) -> None:
        pass
