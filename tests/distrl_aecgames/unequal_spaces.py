"""Knock-out Nim where the last player may take one stone more than the others: its action space differs."""

from gymnasium import spaces
from pettingzoo.utils.wrappers import OrderEnforcingWrapper

from distrl_aecgames import Knockout


class UnequalKnockout(Knockout):
    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(self.most + 1) if agent == self.possible_agents[-1] else self._action_space


def env(**kwargs):
    return OrderEnforcingWrapper(UnequalKnockout(**kwargs))
