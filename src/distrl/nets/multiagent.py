"""Networks for multi-agent envs: which agents share a policy, and what each critic sees.

A multi-agent env reaches the agent as rows of one vector env, one row per agent of each game copy
(:mod:`distrl.multiagent`); every row's observation is a Dict holding the agent's own observation, the
one-hot ``agent`` index, and with ``--critic centralised`` the game's global ``state``. The networks here
are ordinary modules under the module path's contract (``forward(obs) -> (head, value)``), so sync,
checkpoints, bf16 and every strategy treat them as any other network:

- :class:`SplitActorCritic`: the actor encodes every part but the global state, the critic the global state
  and the agent's index (MAPPO's agent-specific global state, Yu et al. 2022, arXiv:2103.01955, section 4);
- :class:`PolicyGroups`: independent networks, one per group of agents (``--agent-policies per-agent`` is
  a group per agent); each row goes to its agent's group, so a group's gradient comes from its agents'
  rows alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from gymnasium import spaces
from torch import nn

from distrl.config import ConfigError
from distrl.nets.encoders import ActorCriticModule, DictEncoder, MLPHead, init_actor_critic
from distrl.spaces import DictLayout

AGENT_KEY = "agent"
STATE_KEY = "state"


@dataclass(frozen=True)
class AgentSetup:
    """How a multi-agent run maps agents to networks (``RunConfig.agent_policies``, ``agent_groups``, ``critic``)."""

    names: tuple[str, ...]
    """The env's agents, in the order of the ``agent`` one-hot."""
    groups: tuple[tuple[str, tuple[str, ...]], ...]
    """(policy name, its agents); one group of every agent for a shared policy."""
    centralised: bool

    @property
    def shared(self) -> bool:
        return len(self.groups) == 1


def agent_setup(names: tuple[str, ...], policies: str, groups: tuple[str, ...], critic: str) -> AgentSetup | None:
    """The setup of ``--agent-policies``/``--agent-groups``/``--critic`` for an env with agents ``names`` (None
    for a single-agent env); a one-line error for an unknown agent, an agent in two groups or one left out."""
    if not names:
        asked = {"agent_policies": policies != "shared", "agent_groups": bool(groups), "critic": critic != "local"}
        for field, given in asked.items():
            if given:
                raise ConfigError(
                    f"{field} is not allowed for a single-agent env: it needs a multi-agent (PettingZoo) env"
                )
        return None
    if groups:
        named: list[tuple[str, tuple[str, ...]]] = []
        for item in groups:
            name, _, members = item.partition("=")
            agents = tuple(a for a in members.split(",") if a)
            if not name or not agents:
                raise ConfigError(f"agent_groups={item!r} is not allowed: must be NAME=AGENT,AGENT,...")
            unknown = [a for a in agents if a not in names]
            if unknown:
                raise ConfigError(
                    f"agent_groups={item!r} names unknown agent {unknown[0]!r}: the env's agents are {', '.join(names)}"
                )
            named.append((name, agents))
        placed = [a for _, agents in named for a in agents]
        twice = sorted({a for a in placed if placed.count(a) > 1})
        if twice:
            raise ConfigError(f"agent_groups puts agent {twice[0]!r} in two groups, which is not allowed")
        missing = [a for a in names if a not in placed]
        if missing:
            raise ConfigError(
                f"agent_groups leaves out agent {missing[0]!r}, which is not allowed: every agent of "
                f"{', '.join(names)} needs a group"
            )
        return AgentSetup(names, tuple(named), critic == "centralised")
    if policies == "per-agent":
        return AgentSetup(names, tuple((a, (a,)) for a in names), critic == "centralised")
    return AgentSetup(names, (("shared", names),), critic == "centralised")


class SplitActorCritic(nn.Module):
    """An actor on the agent's own parts (everything but ``state``) and a critic on the global ``state`` and the
    agent's one-hot index: what MAPPO's centralised value function sees."""

    def __init__(self, space: spaces.Dict, head_size: int, net_arch: tuple[int, ...], activation: str, encoder: str):
        super().__init__()
        keys = tuple(k for k in space.spaces if k != STATE_KEY)
        self.actor_encoder = DictEncoder(space, encoder, keys=keys)  # type: ignore[arg-type]
        self.critic_encoder = DictEncoder(space, encoder, keys=(STATE_KEY, AGENT_KEY))  # type: ignore[arg-type]
        self.policy = MLPHead((self.actor_encoder.features_dim, *net_arch, head_size), activation)
        self.critic = MLPHead((self.critic_encoder.features_dim, *net_arch, 1), activation)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(self.actor_encoder(obs)), self.critic(self.critic_encoder(obs)).squeeze(-1)

    def init_orthogonal(self, generator: torch.Generator) -> None:
        """As :meth:`ActorCriticModule.init_orthogonal`: 0.01 on the policy output, 1 on the value's."""
        init_actor_critic(self.policy, self.critic, [self.actor_encoder, self.critic_encoder], generator)


class PolicyGroups(nn.Module):
    """One network per group of agents; row ``i`` goes to the group of the agent its one-hot ``agent`` part names."""

    def __init__(self, space: spaces.Dict, members: list[nn.Module], group_of_agent: list[int], head_size: int):
        super().__init__()
        (self.agent,) = [p for p in DictLayout(space).parts if p.key == AGENT_KEY]
        self.members = nn.ModuleList(members)
        self.register_buffer("group_of_agent", torch.tensor(group_of_agent, dtype=torch.int64))
        self.head_size = head_size

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        one_hot = obs[:, self.agent.start : self.agent.end].contiguous().view(torch.float32)
        groups = self.group_of_agent[one_hot.argmax(-1)]
        head = obs.new_zeros((obs.shape[0], self.head_size), dtype=torch.float32)
        value = obs.new_zeros((obs.shape[0],), dtype=torch.float32)
        for g, member in enumerate(self.members):
            rows = (groups == g).nonzero().squeeze(-1)
            if len(rows):
                h, v = member(obs.index_select(0, rows))
                head = head.index_copy(0, rows, h.float())
                value = value.index_copy(0, rows, v.float())
        return head, value

    def init_orthogonal(self, generator: torch.Generator) -> None:
        for member in self.members:
            member.init_orthogonal(generator)  # type: ignore[operator]


def multiagent_module(
    space: spaces.Space, head_size: int, net_arch: tuple[int, ...], activation: str, encoder: str, setup: AgentSetup
) -> nn.Module | None:
    """The built-in network for ``setup``, or None where distrl's single network already serves (one shared
    policy with a local critic)."""
    if setup.shared and not setup.centralised:
        return None
    if not isinstance(space, spaces.Dict) or AGENT_KEY not in space.spaces:
        raise ConfigError("agent_policies, agent_groups and critic=centralised need a multi-agent (PettingZoo) env")

    def member() -> nn.Module:
        if setup.centralised:
            return SplitActorCritic(space, head_size, net_arch, activation, encoder)
        return ActorCriticModule(DictEncoder(space, encoder), head_size, net_arch, activation)  # type: ignore[arg-type]

    if setup.shared:
        return member()
    group_of = {a: g for g, (_, agents) in enumerate(setup.groups) for a in agents}
    return PolicyGroups(space, [member() for _ in setup.groups], [group_of[a] for a in setup.names], head_size)
