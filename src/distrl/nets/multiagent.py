"""Networks for multi-agent envs: which agents share a policy, and what each critic sees.

A multi-agent env reaches the agent as rows of one vector env, one row per agent of each game copy
(:mod:`distrl.envs.multiagent`); every row's observation is a Dict holding the agent's own observation, the
one-hot ``agent`` index, and with ``--critic centralised`` the game's global ``state``. The networks here
are ordinary modules under the module path's contract (``forward(obs) -> (head, value)``, or the recurrent
contract of :mod:`distrl.nets.recurrent` with a core), so sync, checkpoints, bf16 and every strategy treat
them as any other network:

- :class:`SplitActorCritic`: the actor encodes every part but the global state, the critic the global state
  and the agent's index (MAPPO's agent-specific global state, Yu et al. 2022, arXiv:2103.01955, section 4).
  With a core (:class:`RecurrentSplitActorCritic`) actor and critic each have their own, as in MAPPO's
  recurrent variant: the state of a row is the actor's state followed by the critic's.
- :class:`PolicyGroups`: independent networks, one per group of agents (``--agent-policies per-agent`` is
  a group per agent); each row goes to its agent's group, so a group's gradient comes from its agents'
  rows alone. With recurrent networks (:class:`RecurrentPolicyGroups`) a row's state belongs to its group's
  network: every group's network keeps a state of the same shape, so each runs on its own rows' states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from gymnasium import spaces
from torch import nn

from distrl.config import ConfigError, RunConfig
from distrl.envs.spaces import DictLayout
from distrl.nets.agent import State
from distrl.nets.encoders import DictEncoder, MLPHead, init_actor_critic
from distrl.nets.recurrent import RecurrentCore, is_recurrent, with_heads

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

    @property
    def one_network(self) -> bool:
        """One shared policy with a local critic: distrl's single network serves every agent."""
        return self.shared and not self.centralised


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


def agent_setup_for(run: RunConfig, names: tuple[str, ...]) -> AgentSetup | None:
    """:func:`agent_setup` of ``run``'s settings for an env with agents ``names``: what a trainer computes once
    (``TrainerBase.agent_setup``) and what processes without a trainer (rollout workers, decoupled's trainer ranks)
    compute from their own env."""
    return agent_setup(names, run.agent_policies, run.agent_groups, run.critic)


def actor_space(space: spaces.Dict) -> spaces.Dict:
    """The parts of a row an actor reads: every part but the global state."""
    return spaces.Dict({key: part for key, part in space.spaces.items() if key != STATE_KEY})


class ActorView(nn.Module):
    """A user's encoder fed the actor's part of each row: the row repacked as :func:`actor_space`'s rows (the
    space the user's factory was given), so the actor cannot read the global state."""

    def __init__(self, space: spaces.Dict, encoder: nn.Module):
        super().__init__()
        self.encoder = encoder
        self.features_dim = int(encoder.features_dim)  # type: ignore[arg-type]
        self.layout = DictLayout(actor_space(space))
        source = {part.key: part for part in DictLayout(space).parts}
        self.moves = [(source[part.key], part) for part in self.layout.parts]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        rows = obs.new_zeros((obs.shape[0], self.layout.nbytes))
        for source, part in self.moves:
            rows[:, part.start : part.end] = obs[:, source.start : source.end]
        return self.encoder(rows)


class SplitActorCritic(nn.Module):
    """An actor on the agent's own parts (everything but ``state``) and a critic on the global ``state`` and the
    agent's one-hot index: what MAPPO's centralised value function sees."""

    def __init__(
        self,
        space: spaces.Dict,
        actor_encoder: nn.Module,
        head_size: int,
        net_arch: tuple[int, ...],
        activation: str,
        encoder: str,
        features_dim: int | None = None,
    ):
        """``actor_encoder`` reads every part but the state (distrl's :class:`DictEncoder` of those keys, or a
        user's encoder in an :class:`ActorView`); the critic's is distrl's, of ``encoder``'s kind.
        ``features_dim``: the heads' input size when cores stand between the encoders and them."""
        super().__init__()
        self.actor_encoder = actor_encoder
        self.critic_encoder = DictEncoder(space, encoder, keys=(STATE_KEY, AGENT_KEY))  # type: ignore[arg-type]
        actor_features = int(actor_encoder.features_dim)  # type: ignore[arg-type]
        critic_features = self.critic_encoder.features_dim
        if features_dim is not None:
            actor_features = critic_features = features_dim
        self.policy = MLPHead((actor_features, *net_arch, head_size), activation)
        self.critic = MLPHead((critic_features, *net_arch, 1), activation)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(self.actor_encoder(obs)), self.critic(self.critic_encoder(obs)).squeeze(-1)

    def init_orthogonal(self, generator: torch.Generator) -> None:
        """As :meth:`ActorCriticModule.init_orthogonal`: 0.01 on the policy output, 1 on the value's."""
        init_actor_critic(self.policy, self.critic, [self.actor_encoder, self.critic_encoder], generator)


class RecurrentSplitActorCritic(SplitActorCritic):
    """:class:`SplitActorCritic` under the recurrent module contract, with a core for the actor and another for
    the critic, as MAPPO's recurrent networks have (Yu et al. 2022):
    the actor remembers only what it saw, the critic what the global state showed. A row's state is the actor
    core's tensors followed by the critic core's."""

    def __init__(
        self,
        space: spaces.Dict,
        actor_encoder: nn.Module,
        head_size: int,
        net_arch: tuple[int, ...],
        activation: str,
        encoder: str,
        core: str,
        core_size: int,
    ):
        super().__init__(space, actor_encoder, head_size, net_arch, activation, encoder, features_dim=core_size)
        self.actor_core = RecurrentCore(core, int(actor_encoder.features_dim), core_size)  # type: ignore[arg-type]
        self.critic_core = RecurrentCore(core, self.critic_encoder.features_dim, core_size)
        self.actor_state_size = len(self.actor_core.initial_state(1))

    def initial_state(self, batch_size: int) -> State:
        return self.actor_core.initial_state(batch_size) + self.critic_core.initial_state(batch_size)

    def forward(
        self,
        obs: torch.Tensor,
        state: State,
        episode_starts: torch.Tensor,  # type: ignore[override]
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], State]:
        T, B = obs.shape[:2]
        rows = obs.reshape(T * B, *obs.shape[2:])
        n = self.actor_state_size
        actor, actor_state = self.actor_core(self.actor_encoder(rows).reshape(T, B, -1), state[:n], episode_starts)
        critic, critic_state = self.critic_core(self.critic_encoder(rows).reshape(T, B, -1), state[n:], episode_starts)
        head = self.policy(actor.reshape(T * B, -1)).reshape(T, B, -1)
        value = self.critic(critic.reshape(T * B, -1)).reshape(T, B)
        return (head, value), actor_state + critic_state

    def init_orthogonal(self, generator: torch.Generator) -> None:
        super().init_orthogonal(generator)
        self.actor_core.init_orthogonal(generator)
        self.critic_core.init_orthogonal(generator)


class PolicyGroups(nn.Module):
    """One network per group of agents; row ``i`` goes to the group of the agent its one-hot ``agent`` part names."""

    def __init__(self, space: spaces.Dict, members: list[nn.Module], group_of_agent: list[int], head_size: int):
        super().__init__()
        (self.agent,) = [p for p in DictLayout(space).parts if p.key == AGENT_KEY]
        self.members = nn.ModuleList(members)
        self.register_buffer("group_of_agent", torch.tensor(group_of_agent, dtype=torch.int64))
        self.head_size = head_size

    def groups_of(self, obs: torch.Tensor) -> torch.Tensor:
        """The group index [B] of each of the packed rows ``obs`` [B, nbytes]."""
        one_hot = obs[:, self.agent.start : self.agent.end].contiguous().view(torch.float32)
        return self.group_of_agent[one_hot.argmax(-1)]

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        groups = self.groups_of(obs)
        head = obs.new_zeros((obs.shape[0], self.head_size), dtype=torch.float32)
        value = obs.new_zeros((obs.shape[0],), dtype=torch.float32)
        for g, member in enumerate(self.members):
            rows = (groups == g).nonzero().squeeze(-1)
            if len(rows):
                h, v = member(obs.index_select(0, rows))
                head = head.index_copy(0, rows, h.float())
                value = value.index_copy(0, rows, v.reshape(-1).float())
        return head, value

    def init_orthogonal(self, generator: torch.Generator) -> None:
        for member in self.members:
            member.init_orthogonal(generator)  # type: ignore[operator]


class RecurrentPolicyGroups(PolicyGroups):
    """:class:`PolicyGroups` of recurrent networks, under the recurrent module contract. A sequence (column ``b``
    of ``obs`` [T, B, ...]) is one row of the vector env, the same agent at every step, so it goes whole to
    that agent's group together with its state: each group runs its own core on its own rows' states."""

    def initial_state(self, batch_size: int) -> State:
        return self.members[0].initial_state(batch_size)  # type: ignore[operator]

    def forward(
        self,
        obs: torch.Tensor,
        state: State,
        episode_starts: torch.Tensor,  # type: ignore[override]
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], State]:
        T, B = obs.shape[:2]
        groups = self.groups_of(obs[0])  # the first step is never padding (see RecurrentAgent.forward_episodes)
        head = obs.new_zeros((T, B, self.head_size), dtype=torch.float32)
        value = obs.new_zeros((T, B), dtype=torch.float32)
        next_state = [torch.zeros_like(s, dtype=torch.float32) for s in state]
        for g, member in enumerate(self.members):
            columns = (groups == g).nonzero().squeeze(-1)
            if len(columns):
                own_state = tuple(s.index_select(1, columns) for s in state)
                (h, v), own_next = member(
                    obs.index_select(1, columns), own_state, episode_starts.index_select(1, columns)
                )
                head = head.index_copy(1, columns, h.float())
                value = value.index_copy(1, columns, v.reshape(T, len(columns)).float())
                next_state = [s.index_copy(1, columns, own.float()) for s, own in zip(next_state, own_next)]
        return (head, value), tuple(next_state)


def policy_groups(
    space: spaces.Dict, setup: AgentSetup, network: Callable[[], nn.Module], head_size: int
) -> PolicyGroups:
    """A network from ``network()`` for each group of ``setup``, in the groups' order; recurrent networks (which
    must keep states of one shape) make :class:`RecurrentPolicyGroups`."""
    members = [network() for _ in setup.groups]
    group_of = {agent: g for g, (_, agents) in enumerate(setup.groups) for agent in agents}
    group_of_agent = [group_of[agent] for agent in setup.names]
    if not is_recurrent(members[0]):
        return PolicyGroups(space, members, group_of_agent, head_size)
    shapes = {tuple(tuple(s.shape) for s in m.initial_state(1)) for m in members}  # type: ignore[operator]
    if len(shapes) > 1:
        raise ConfigError(
            f"the groups' recurrent networks keep states of different shapes {sorted(shapes)}, which is not "
            "allowed: every row of the vector env carries one state, so every group's must have the same shape"
        )
    return RecurrentPolicyGroups(space, members, group_of_agent, head_size)


def multiagent_module(
    space: spaces.Space,
    head_size: int,
    net_arch: tuple[int, ...],
    activation: str,
    encoder: str,
    setup: AgentSetup,
    core: str = "none",
    core_size: int = 128,
    network: Callable[[], nn.Module] | None = None,
    actor_encoder: Callable[[spaces.Dict], nn.Module] | None = None,
) -> nn.Module | None:
    """The networks for ``setup``, or None where distrl's single network already serves (one shared policy
    with a local critic).

    Each group's network is what one shared network would be: by default distrl's encoders and heads, with an
    lstm or gru ``core`` of ``core_size`` units between them unless ``core`` is "none". A user's module enters as
    ``network``, which builds one group's whole network where the critic is local, or as ``actor_encoder``, which
    builds the actor's encoder for :func:`actor_space` under the centralised critic (the critic stays distrl's).
    """
    if setup.one_network:
        return None
    if not isinstance(space, spaces.Dict) or AGENT_KEY not in space.spaces:
        raise ConfigError("agent_policies, agent_groups and critic=centralised need a multi-agent (PettingZoo) env")

    def member() -> nn.Module:
        if setup.centralised:
            actor_parts = actor_space(space)
            if actor_encoder is None:
                actor: nn.Module = DictEncoder(space, encoder, keys=tuple(actor_parts.spaces))  # type: ignore[arg-type]
            else:
                actor = ActorView(space, actor_encoder(actor_parts))
            if core == "none":
                return SplitActorCritic(space, actor, head_size, net_arch, activation, encoder)
            return RecurrentSplitActorCritic(space, actor, head_size, net_arch, activation, encoder, core, core_size)
        if network is not None:
            return network()
        return with_heads(DictEncoder(space, encoder), head_size, net_arch, activation, core, core_size)  # type: ignore[arg-type]

    return member() if setup.shared else policy_groups(space, setup, member, head_size)
