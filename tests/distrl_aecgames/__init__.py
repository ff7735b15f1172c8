"""Tiny PettingZoo AEC games for distrl's turn-based games (each module's ``env()`` builds one, as PettingZoo's
classic games do: ``distrl_aecgames.knockout``, ``distrl_aecgames.unequal_spaces``)."""

from __future__ import annotations

import numpy as np
from gymnasium import spaces
from pettingzoo import AECEnv


class Knockout(AECEnv):
    """Knock-out Nim for ``players`` players: in turn, each takes 1 to ``most`` stones from a pile of
    ``pile``; whoever takes the last stone is knocked out, the pile is refilled, and the others play on from
    the next player. The last player left wins.

    A player knocked out is paid -1 and each player still in ``1 / (players still in)``, so the rewards of a
    game add up to zero: with three players the winner's return is 1.5, the runner-up's -0.5 and the first
    out's -1. The game is deterministic. A knocked-out player leaves ``agents`` through PettingZoo's dead step
    while the others play on.

    Observations are a Dict: ``observation``, the stones left (one-hot over 0..``pile``) and the number of
    players still in (one-hot over 2..``players``), and ``action_mask`` (no more stones than are left).
    """

    metadata = {"name": "knockout_v0", "is_parallelizable": False, "render_modes": []}

    def __init__(self, players: int = 3, pile: int = 7, most: int = 3):
        super().__init__()
        self.possible_agents = [f"player_{i}" for i in range(players)]
        self.pile, self.most = pile, most
        self.stones = pile
        size = pile + 1 + players - 1
        self._observation_space = spaces.Dict(
            {
                "observation": spaces.Box(0, 1, (size,), np.int8),
                "action_mask": spaces.Box(0, 1, (most,), np.int8),
            }
        )
        self._action_space = spaces.Discrete(most)

    def observation_space(self, agent: str) -> spaces.Space:
        return self._observation_space

    def action_space(self, agent: str) -> spaces.Space:
        return self._action_space

    def in_game(self) -> list[str]:
        """The players not knocked out, in turn order."""
        return [a for a in self.agents if not self.terminations[a]]

    def observe(self, agent: str) -> dict[str, np.ndarray]:
        observation = np.zeros(self._observation_space["observation"].shape, np.int8)
        observation[self.stones] = 1
        observation[self.pile + 1 + max(len(self.in_game()), 2) - 2] = 1
        mask = (np.arange(1, self.most + 1) <= self.stones).astype(np.int8)
        return {"observation": observation, "action_mask": mask}

    def reset(self, seed: int | None = None, options: dict | None = None) -> None:
        self.agents = list(self.possible_agents)
        self.stones = self.pile
        self.rewards = {a: 0.0 for a in self.agents}
        self._cumulative_rewards = {a: 0.0 for a in self.agents}
        self.terminations = {a: False for a in self.agents}
        self.truncations = {a: False for a in self.agents}
        self.infos = {a: {} for a in self.agents}
        self.agent_selection = self.agents[0]

    def step(self, action: int | None) -> None:
        player = self.agent_selection
        if self.terminations[player] or self.truncations[player]:
            self._was_dead_step(action)
            return
        take = int(action) + 1
        if not 1 <= take <= min(self.most, self.stones):
            raise ValueError(f"{player} cannot take {take} stones of {self.stones}")
        self._cumulative_rewards[player] = 0.0
        self._clear_rewards()
        players = self.in_game()
        following = players[(players.index(player) + 1) % len(players)]
        self.stones -= take
        if self.stones == 0:
            rest = [a for a in players if a != player]
            self.rewards[player] = -1.0
            self.terminations[player] = True
            for other in rest:
                self.rewards[other] = 1.0 / len(rest)
            if len(rest) == 1:
                self.terminations[rest[0]] = True
            self.stones = self.pile
        self.agent_selection = following
        self._accumulate_rewards()
        self._deads_step_first()

    def close(self) -> None:
        pass


def two_player_knockout() -> AECEnv:
    """Knock-out Nim for two, from a function (as ``distrl_aecgames:two_player_knockout``)."""
    from pettingzoo.utils.wrappers import OrderEnforcingWrapper

    return OrderEnforcingWrapper(Knockout(players=2))
