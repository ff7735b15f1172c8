"""A fixed search player for tic-tac-toe and connect four: an opponent to evaluate self-play policies against.

:class:`SearchOpponent` follows the opponent protocol of :mod:`distrl.envs.selfplay` (``begin_game``, ``act``,
``end_game``) and reads the board from the PettingZoo observation the opponent's seat gets: plane 0 holds the
marks of the player to move, plane 1 the other player's, and ``action_mask`` the legal moves.

- **Tic-tac-toe** (``pettingzoo.classic.tictactoe_v3``, a (3, 3, 2) board, action ``a`` = cell ``a`` of the
  flattened 3x3 board): exact negamax over the whole game tree, memoised on the board, so the player is perfect:
  it never loses. A win scores more the sooner it comes, a loss less the later it comes.
- **Connect four** (``pettingzoo.classic.connect_four_v3``, a (6, 7, 2) board with row 0 on top, action = the
  column): negamax with alpha-beta pruning, ``depth`` plies ahead (4 by default), on bitboards (Pascal Pons,
  "Solving Connect 4", http://blog.gamesolver.org/solving-connect-four/06-bitboard/). A position it stops at
  scores open threes and twos (lines of four with no stone of the other player) and stones in the centre
  column, its own less the other player's; a win outscores any of that, and the sooner it comes the more.

Among the moves of equal best value the player picks one at random with the ``rng`` it is given, so games vary.
"""

from __future__ import annotations

import functools
from typing import Any

import gymnasium as gym
import numpy as np

from distrl.config import ConfigError

DEFAULT_DEPTH = 4
TICTACTOE_SHAPE = (3, 3, 2)
CONNECT_FOUR_SHAPE = (6, 7, 2)
SUPPORTED = (
    f"tic-tac-toe (pettingzoo.classic.tictactoe_v3, boards of shape {TICTACTOE_SHAPE}) and connect four "
    f"(pettingzoo.classic.connect_four_v3, {CONNECT_FOUR_SHAPE})"
)


class SearchOpponent:
    """A fixed search player (see the module docstring) for the game whose observations ``observation_space``
    describes; ``env`` names that game in errors, ``depth`` is connect four's search depth in plies."""

    def __init__(self, observation_space: gym.Space, env: str, depth: int = DEFAULT_DEPTH):
        if depth < 1:
            raise ConfigError(f"depth={depth} is not allowed: the search player looks at least 1 move ahead")
        shape = None
        if isinstance(observation_space, gym.spaces.Dict) and {"observation", "action_mask"} <= set(observation_space):
            shape = observation_space["observation"].shape
        if shape not in (TICTACTOE_SHAPE, CONNECT_FOUR_SHAPE):
            found = "hold no board and action mask" if shape is None else f"are boards of shape {shape}"
            raise ConfigError(
                f"opponent='search' is not allowed for env={env!r}: the search player plays {SUPPORTED} only, "
                f"and this env's observations {found}"
            )
        self.game = "tictactoe" if shape == TICTACTOE_SHAPE else "connect_four"
        self.depth = depth

    def begin_game(self, rng: np.random.Generator) -> Any:
        return None

    def act(self, who: Any, obs: dict[str, np.ndarray], rng: np.random.Generator) -> int:
        board = np.asarray(obs["observation"], dtype=np.int64)
        legal = [int(a) for a in np.flatnonzero(obs["action_mask"])]
        if self.game == "tictactoe":
            best = tictactoe_best_moves(*tictactoe_bits(board), legal)
        else:
            best = connect_four_best_moves(*connect_four_bits(board), legal, self.depth)
        return best[int(rng.integers(len(best)))]

    def end_game(self, who: Any, margin: float) -> None:
        pass


# Tic-tac-toe: a player's marks are 9 bits, bit a for cell a (the action that marks it).

TICTACTOE_CELL_BITS = (1 << np.arange(9, dtype=np.int64)).reshape(3, 3)
TICTACTOE_LINES = tuple(
    sum(1 << cell for cell in line)
    for line in ((0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6))
)


def tictactoe_bits(board: np.ndarray) -> tuple[int, int]:
    """The marks of the player to move and of the other player as bits, from a (3, 3, 2) observation."""
    return int((board[:, :, 0] * TICTACTOE_CELL_BITS).sum()), int((board[:, :, 1] * TICTACTOE_CELL_BITS).sum())


def tictactoe_best_moves(mine: int, theirs: int, legal: list[int]) -> list[int]:
    """The moves among ``legal`` of the highest exact value to the player to move."""
    values = {a: -tictactoe_value(theirs, mine | 1 << a) for a in legal}
    best = max(values.values())
    return [a for a, value in values.items() if value == best]


@functools.cache
def tictactoe_value(mine: int, theirs: int) -> int:
    """The exact value of a tic-tac-toe position to the player to move, with perfect play on both sides: 0 for a
    draw, 1 + the empty cells left when the game is won (a quicker win is worth more), minus that when lost."""
    empty = 9 - (mine | theirs).bit_count()
    if any(theirs & line == line for line in TICTACTOE_LINES):
        return -(1 + empty)
    if empty == 0:
        return 0
    return max(-tictactoe_value(theirs, mine | 1 << a) for a in range(9) if not (mine | theirs) >> a & 1)


# Connect four: bit 7 * column + height for each cell, height 0 at the bottom; bit 6 of each column stays empty
# so that no line of four wraps from one column into the next.

ROWS, COLUMNS = 6, 7
CONNECT_FOUR_CELL_BITS = np.array(
    [[1 << (7 * column + ROWS - 1 - row) for column in range(COLUMNS)] for row in range(ROWS)], dtype=np.int64
)
BOTTOM = tuple(1 << 7 * column for column in range(COLUMNS))
TOP = tuple(1 << 7 * column + ROWS - 1 for column in range(COLUMNS))
BOARD = sum(((1 << ROWS) - 1) << 7 * column for column in range(COLUMNS))
CENTER = ((1 << ROWS) - 1) << 7 * (COLUMNS // 2)
DIRECTIONS = (1, 7, 6, 8)
"""Shifts to a cell's neighbour up, right, down-right and up-right."""
CENTER_ORDER = (3, 2, 4, 1, 5, 0, 6)
"""Moves near the centre are most often the best: searching them first lets alpha-beta prune the most."""

WIN = 1_000_000
THREE, TWO, CENTER_STONE = 5, 2, 3
INFINITY = 10 * WIN


def connect_four_bits(board: np.ndarray) -> tuple[int, int]:
    """The stones of the player to move and of the other player as bitboards, from a (6, 7, 2) observation."""
    return int((board[:, :, 0] * CONNECT_FOUR_CELL_BITS).sum()), int((board[:, :, 1] * CONNECT_FOUR_CELL_BITS).sum())


def connect_four_best_moves(mine: int, theirs: int, legal: list[int], depth: int) -> list[int]:
    """The columns among ``legal`` of the highest value to the player to move, searching ``depth`` plies ahead."""
    occupied = mine | theirs
    best, best_moves = -INFINITY, []
    for column in sorted(legal, key=CENTER_ORDER.index):
        after = occupied | (occupied + BOTTOM[column])
        if connects_four(mine | (after ^ occupied)):
            value = WIN + depth
        else:
            # a window from just below the best so far: a move that ties with it gets its exact value
            value = -negamax(theirs, after, depth - 1, -INFINITY, 1 - best)
        if value > best:
            best, best_moves = value, [column]
        elif value == best:
            best_moves.append(column)
    return best_moves


def negamax(mine: int, occupied: int, depth: int, alpha: int, beta: int) -> int:
    """The value of a connect four position to the player to move, whose stones are ``mine`` (``occupied``: both
    players' stones), ``depth`` plies ahead: exact when it falls between ``alpha`` and ``beta``, otherwise a bound
    on the side it fell (alpha-beta pruning)."""
    theirs = mine ^ occupied
    if depth == 0:
        return evaluate(mine, theirs)
    moves = [occupied | (occupied + BOTTOM[column]) for column in CENTER_ORDER if not occupied & TOP[column]]
    if not moves:
        return 0
    if any(connects_four(mine | (after ^ occupied)) for after in moves):
        return WIN + depth
    best = -INFINITY
    for after in moves:
        best = max(best, -negamax(theirs, after, depth - 1, -beta, -alpha))
        alpha = max(alpha, best)
        if alpha >= beta:
            break
    return best


def connects_four(stones: int) -> bool:
    """Whether ``stones`` hold four in a row in any direction."""
    for shift in DIRECTIONS:
        pairs = stones & (stones >> shift)
        if pairs & (pairs >> 2 * shift):
            return True
    return False


def evaluate(mine: int, theirs: int) -> int:
    """A position's score to the player to move, where the search stops (see the module docstring)."""
    center = (mine & CENTER).bit_count() - (theirs & CENTER).bit_count()
    return CENTER_STONE * center + open_lines(mine, theirs) - open_lines(theirs, mine)


def open_lines(stones: int, other: int) -> int:
    """``THREE`` for each line of four cells holding three of ``stones`` and an empty cell, ``TWO`` for each with
    two and two empty cells. No line holds four: the search stops at a win."""
    free = BOARD & ~other
    score = 0
    for shift in DIRECTIONS:
        # bit p of each of these stands for the line of cells p, p + shift, p + 2 shift, p + 3 shift
        room = free & (free >> shift) & (free >> 2 * shift) & (free >> 3 * shift)
        first, second = stones, stones >> shift
        third, fourth = stones >> 2 * shift, stones >> 3 * shift
        one_of_first_pair, both_of_first_pair = first ^ second, first & second
        one_of_second_pair, both_of_second_pair = third ^ fourth, third & fourth
        three = (both_of_first_pair & one_of_second_pair) | (both_of_second_pair & one_of_first_pair)
        two = ((both_of_first_pair ^ both_of_second_pair) & ~(one_of_first_pair | one_of_second_pair)) | (
            one_of_first_pair & one_of_second_pair
        )
        score += THREE * (room & three).bit_count() + TWO * (room & two).bit_count()
    return score
