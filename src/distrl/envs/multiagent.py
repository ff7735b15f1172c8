"""PettingZoo Parallel environments as one vector env of agents, trained by distrl's single-agent machinery.

``n_copies`` copies of a ParallelEnv with A agents become one vector env of ``n_copies * A`` rows, row
``copy * A + agent`` in the fixed order of ``possible_agents``: one policy call acts for every agent of
every copy, and every agent trains the one shared policy (parameter sharing, the approach of SuperSuit's
vector envs and PufferLib). Each row sees the agent's own observation plus a one-hot of the agent's index,
so that the shared network can still tell the roles apart, and optionally the game's global state for a
centralised critic (as in MAPPO).

The vector env follows Gymnasium's next-step autoreset, which :class:`distrl.envs.vector.VecEnv` handles. Two
things a single-agent env never does travel in ``info``: ``active`` is False for the rows of agents that sit
a step out (out of the game while it goes on, not in it yet, or their copy resetting), which VecEnv makes
``valid=False``; and ``game_over``/``game_return``/``game_length`` count one episode per game with the
team's return (the sum of the agents' returns), the whole-game statistics VecEnv already reads for Atari.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

from distrl.config import ConfigError
from distrl.envs.masks import MASK_KEY
from distrl.envs.pettingzoo import factory_name, is_parallel_env, make_parallel_env

OBSERVATION_KEY = "observation"
"""The part holding the agent's own observation when its space is not a Dict."""
AGENT_KEY = "agent"
"""The one-hot of the agent's index, added when there are several agents."""
STATE_KEY = "state"
"""The global state, with ``global_state=True``."""


@dataclass(frozen=True)
class _Part:
    """How one key of the agents' observations becomes one part of every row's Dict.

    ``same``: Boxes of one shape, copied. ``padded``: Boxes of different shapes, flattened and zero-padded
    to the largest. ``discrete``: Discrete spaces as Discrete(largest n), each choice less its space's start.
    ``mask``: the action mask over Discrete(largest n) actions, 0 for the actions an agent lacks.
    """

    kind: Literal["same", "padded", "discrete", "mask"]
    space: spaces.Space
    starts: tuple[int, ...] = ()
    """``discrete``: each agent's start."""


def _agent_parts(space: spaces.Space) -> dict[str, spaces.Space]:
    return dict(space.spaces) if isinstance(space, spaces.Dict) else {OBSERVATION_KEY: space}


def _without_mask(space: spaces.Space) -> spaces.Space:
    """An agent's observation space less its action mask: what a global state built from observations holds."""
    if isinstance(space, spaces.Dict) and MASK_KEY in space.spaces:
        return spaces.Dict({k: v for k, v in space.spaces.items() if k != MASK_KEY})
    return space


def _spaces_text(agents: tuple[str, ...], subs: list[spaces.Space]) -> str:
    return ", ".join(f"{agent}: {sub}" for agent, sub in zip(agents, subs))


def _merge_actions(agents: tuple[str, ...], subs: list[spaces.Space]) -> spaces.Space:
    """The one action space of every row: Discrete(largest n) over Discrete spaces, else their common space."""
    if all(isinstance(sub, spaces.Discrete) for sub in subs):
        return spaces.Discrete(max(int(sub.n) for sub in subs))  # type: ignore[attr-defined]
    if any(sub != subs[0] for sub in subs):
        raise ConfigError(
            f"agents with action spaces {_spaces_text(agents, subs)} are not allowed: one policy acts for "
            "every agent, so their action spaces must be equal (or all Discrete)"
        )
    return subs[0]


def _merge_part(key: str, agents: tuple[str, ...], subs: list[spaces.Space]) -> _Part:
    """The :class:`_Part` that holds ``key`` of every agent's observation."""
    if all(isinstance(sub, spaces.Discrete) for sub in subs):
        starts = tuple(int(sub.start) for sub in subs)  # type: ignore[attr-defined]
        return _Part("discrete", spaces.Discrete(max(int(sub.n) for sub in subs)), starts)  # type: ignore[attr-defined]
    if not all(isinstance(sub, spaces.Box) for sub in subs):
        raise ConfigError(
            f"observation part {key!r} with spaces {_spaces_text(agents, subs)} is not allowed: it must be a "
            "Box for every agent or a Discrete for every agent"
        )
    dtype = np.result_type(*(sub.dtype for sub in subs))
    if len({sub.shape for sub in subs}) == 1:
        low = np.min([sub.low for sub in subs], 0)  # type: ignore[attr-defined]
        high = np.max([sub.high for sub in subs], 0)  # type: ignore[attr-defined]
        return _Part("same", spaces.Box(low.astype(dtype), high.astype(dtype), dtype=dtype))
    size = max(math.prod(sub.shape) for sub in subs)
    lows, highs = np.zeros((len(subs), size)), np.zeros((len(subs), size))
    for i, sub in enumerate(subs):  # the padding is 0, which the bounds include
        lows[i, : sub.low.size] = sub.low.ravel()  # type: ignore[attr-defined]
        highs[i, : sub.high.size] = sub.high.ravel()  # type: ignore[attr-defined]
    return _Part("padded", spaces.Box(lows.min(0).astype(dtype), highs.max(0).astype(dtype), dtype=dtype))


class ParallelAgents:
    """``n_copies`` copies of a PettingZoo ParallelEnv as one next-step-autoreset vector env of agents.

    Rows are ``copy * A + agent``, agents in the order of ``possible_agents``. Every row's observation is a
    Dict of the same layout: the agent's own observation (``observation``, or the agent's own keys when its
    space is a Dict), ``agent``, a one-hot of its index (when A > 1), and with ``global_state`` ``state``:
    ``env.state()`` when the env declares a ``state_space`` (PettingZoo's convention), else every agent's
    flattened observation side by side, zeros for the agents that reported none on the step.

    Agents may differ. Box observations of different shapes are flattened and zero-padded to the largest,
    as MAPPO's implementations pad them; Discrete actions of different sizes become Discrete(largest), and
    an ``action_mask`` part marks the actions an agent lacks illegal (merged with the env's own mask, if it
    has one). Other action spaces must be equal.

    A step sends each agent in ``env.agents`` its row's action and returns its reward and flags in that row.
    An agent whose flags end it while its game goes on sits out the following steps: ``info["active"]`` is
    False on its row, which keeps its last observation and gets reward 0 and no flags. So do the agents that
    have not joined yet (zeros for an observation). A copy's game ends when every agent left in ``env.agents``
    ended on the step, as when it is empty (an acting agent that was not flagged is then truncated); the next
    step resets that copy, ignores its actions and returns the new game's first observations with every row
    of the copy inactive. Rows that sit out always show a mask with a legal action (distrl refuses to act on
    one with none; a finished board may have none), and their action is not sent.

    ``info`` on every step, arrays [num_envs]: ``active`` (bool), ``game_over`` (bool: True on one row per
    game that ended on the step, the first of its rows that ended), ``game_return`` (float64: there, the
    sum of every agent's undiscounted rewards in the game) and ``game_length`` (int64: there, the game's
    number of steps), and ``agent_game_returns``: a list of (copy, {agent: return}) for the games that
    ended on the step.
    """

    metadata = {"autoreset_mode": AutoresetMode.NEXT_STEP}

    def __init__(self, make_env: Callable[[], Any], n_copies: int, global_state: bool = False, flat: bool = False):
        """``flat``: where every part is a float Box (no mask, no Discrete), rows are one float32 vector, the parts
        side by side in key order, which distrl's closed-form networks take (one shared policy's fast path)."""
        if n_copies < 1:
            raise ConfigError(f"n_copies={n_copies} is not allowed: must be at least 1")
        self.envs: list[Any] = []
        for _ in range(n_copies):
            env = make_env()
            if not is_parallel_env(env):
                self.close()
                raise ConfigError(
                    f"{factory_name(make_env)} built a {type(env).__name__}, which is not allowed: it must be a "
                    "PettingZoo ParallelEnv (an AEC env converts with pettingzoo.utils.aec_to_parallel)"
                )
            self.envs.append(env)
        env = self.envs[0]
        self.agents: tuple[str, ...] = tuple(env.possible_agents)
        if not self.agents:
            self.close()
            raise ConfigError(f"{factory_name(make_env)} built an env with no agents (possible_agents is empty)")
        self.n_copies, self.n_agents = n_copies, len(self.agents)
        self.num_envs = n_copies * self.n_agents
        self._index = {agent: i for i, agent in enumerate(self.agents)}
        self._action_spaces = [env.action_space(agent) for agent in self.agents]
        self.single_action_space = _merge_actions(self.agents, self._action_spaces)
        self._observation_spaces = [env.observation_space(agent) for agent in self.agents]
        self._own_spaces = [_without_mask(space) for space in self._observation_spaces]
        self._state_offsets = np.cumsum([0, *(spaces.flatdim(space) for space in self._own_spaces)])
        self._parts = self._merge_observations(self._mask_size())
        layout = {key: part.space for key, part in self._parts.items()}
        if self.n_agents > 1:
            layout[AGENT_KEY] = spaces.Box(0, 1, (self.n_agents,), np.float32)
        # PettingZoo's base class has state() raise and no state_space; envs with a state declare both
        self._env_state = isinstance(getattr(env, "state_space", None), spaces.Box)
        if global_state:
            layout[STATE_KEY] = self._state_space(env)
        self.single_observation_space = spaces.Dict(layout)
        self._buffers = {
            key: np.zeros((self.num_envs, *sub.shape), np.int64 if isinstance(sub, spaces.Discrete) else sub.dtype)
            for key, sub in self.single_observation_space.spaces.items()
        }
        if AGENT_KEY in self._buffers:
            self._buffers[AGENT_KEY][:] = np.tile(np.eye(self.n_agents, dtype=np.float32), (n_copies, 1))
        self._legal = self._legal_masks()
        self._flat: list[str] = []
        parts = self.single_observation_space.spaces
        if flat and all(isinstance(s, spaces.Box) and np.dtype(s.dtype).kind == "f" for s in parts.values()):
            self._flat = list(parts)
            low = np.concatenate([parts[k].low.ravel() for k in self._flat]).astype(np.float32)  # type: ignore[attr-defined]
            high = np.concatenate([parts[k].high.ravel() for k in self._flat]).astype(np.float32)  # type: ignore[attr-defined]
            self.single_observation_space = spaces.Box(low, high, dtype=np.float32)  # type: ignore[assignment]
        self._needs_reset = np.zeros(n_copies, dtype=bool)
        self._agent_returns = np.zeros((n_copies, self.n_agents), dtype=np.float64)
        self._game_lengths = np.zeros(n_copies, dtype=np.int64)

    def _mask_size(self) -> int | None:
        """Actions the ``mask`` part covers: Discrete actions of different sizes, or any agent's own mask
        over them, are masked; None otherwise (an env's mask over other actions stays an ordinary part)."""
        space = self.single_action_space
        if not isinstance(space, spaces.Discrete):
            return None
        sizes = {int(sub.n) for sub in self._action_spaces}  # type: ignore[attr-defined]
        own = any(MASK_KEY in _agent_parts(sub) for sub in self._observation_spaces)
        return int(space.n) if own or len(sizes) > 1 else None

    def _merge_observations(self, mask_size: int | None) -> dict[str, _Part]:
        per_agent = [_agent_parts(space) for space in self._observation_spaces]
        if mask_size is not None:
            per_agent = [{k: v for k, v in parts.items() if k != MASK_KEY} for parts in per_agent]
        keys = sorted(per_agent[0])
        for agent, parts in zip(self.agents, per_agent):
            if sorted(parts) != keys:
                raise ConfigError(
                    f"agent {agent!r} with observation keys {sorted(parts)} is not allowed: every agent's "
                    f"observation must have the keys of {self.agents[0]!r}'s, {keys}"
                )
        if AGENT_KEY in keys or STATE_KEY in keys:
            raise ConfigError(f"observation keys {keys} are not allowed: {AGENT_KEY!r} and {STATE_KEY!r} are distrl's")
        merged = {key: _merge_part(key, self.agents, [parts[key] for parts in per_agent]) for key in keys}
        if mask_size is not None:
            merged[MASK_KEY] = _Part("mask", spaces.Box(0, 1, (mask_size,), np.int8))
        return merged

    def _state_space(self, env: Any) -> spaces.Box:
        if self._env_state:
            return spaces.flatten_space(env.state_space)  # type: ignore[return-value]
        flat = [spaces.flatten_space(space) for space in self._own_spaces]
        low = np.concatenate([box.low for box in flat]).astype(np.float32)  # type: ignore[attr-defined]
        high = np.concatenate([box.high for box in flat]).astype(np.float32)  # type: ignore[attr-defined]
        return spaces.Box(low, high, dtype=np.float32)

    def _legal_masks(self) -> np.ndarray | None:
        """[A, mask size] int8: each agent's mask with every one of its own actions legal, or None without masks."""
        if MASK_KEY not in self._buffers:
            return None
        legal = np.ones((self.n_agents, self._buffers[MASK_KEY].shape[1]), dtype=np.int8)
        if self._parts[MASK_KEY].kind == "mask":
            for i, space in enumerate(self._action_spaces):
                legal[i, int(space.n) :] = 0  # type: ignore[attr-defined]
        return legal

    def reset(self, seed: int | None = None) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """Start a game in every copy; copy c is seeded ``seed + c * A``, the index of its first row: a vector env
        reset with ``seed + offset`` (a worker's first row) seeds each game as one env of all the rows would."""
        for c in range(self.n_copies):
            self._reset_copy(c, None if seed is None else seed + c * self.n_agents)
        return self._observations(), {}

    def step(
        self, actions: np.ndarray
    ) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray, np.ndarray, dict[str, Any]]:
        """Step every copy with ``actions`` [num_envs, *action_shape]; see the class docstring for what comes back."""
        n, A = self.num_envs, self.n_agents
        reward = np.zeros(n, dtype=np.float64)
        terminated, truncated, active = np.zeros(n, bool), np.zeros(n, bool), np.zeros(n, bool)
        game_over = np.zeros(n, dtype=bool)
        game_return, game_length = np.zeros(n, dtype=np.float64), np.zeros(n, dtype=np.int64)
        agent_game_returns = []
        for c, env in enumerate(self.envs):
            if self._needs_reset[c]:  # the step after a game's end resets its copy
                self._reset_copy(c, None)
                continue
            rows = slice(c * A, (c + 1) * A)
            acting = [self._index[agent] for agent in env.agents]
            obs, rewards, terms, truncs, _ = env.step(
                {self.agents[i]: self._env_action(i, actions[c * A + i]) for i in acting}
            )
            for i in acting:
                agent, row = self.agents[i], c * A + i
                active[row] = True
                reward[row] = float(rewards.get(agent, 0.0))
                terminated[row] = bool(terms.get(agent, False))
                truncated[row] = bool(truncs.get(agent, False))
            self._agent_returns[c] += reward[rows]
            self._game_lengths[c] += 1
            ended = terminated[rows] | truncated[rows]
            if all(terms.get(agent, False) or truncs.get(agent, False) for agent in env.agents):
                truncated[rows] |= active[rows] & ~ended  # left the game without a flag: cut short
                first = c * A + int(np.flatnonzero(terminated[rows] | truncated[rows])[0])
                game_over[first] = True
                game_return[first] = self._agent_returns[c].sum()
                game_length[first] = self._game_lengths[c]
                agent_game_returns.append((c, dict(zip(self.agents, self._agent_returns[c].tolist()))))
                self._needs_reset[c] = True
            self._write(c, obs)
        info = {
            "active": active,
            "game_over": game_over,
            "game_return": game_return,
            "game_length": game_length,
            "agent_game_returns": agent_game_returns,
        }
        return self._observations(), reward, terminated, truncated, info

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def _env_action(self, i: int, action: np.ndarray) -> Any:
        """Row ``action`` of agent ``i`` as its own action space takes it."""
        space = self._action_spaces[i]
        if isinstance(space, spaces.Discrete):
            if action >= space.n:  # only where sizes differ: the mask makes it illegal, not impossible
                raise ValueError(
                    f"action {int(action)} is not allowed for agent {self.agents[i]!r}, whose actions are {space}: "
                    "its observation's action_mask marks it illegal, so act with masks (--action-mask auto)"
                )
            return int(action) + int(space.start)
        return np.asarray(action, dtype=space.dtype).reshape(space.shape)

    def _reset_copy(self, c: int, seed: int | None) -> None:
        obs, _ = self.envs[c].reset(seed=seed)
        if not self.envs[c].agents:
            raise ConfigError(f"env {self.envs[c]} has no agents after reset, which is not allowed")
        rows = slice(c * self.n_agents, (c + 1) * self.n_agents)
        for key in self._parts:
            self._buffers[key][rows] = 0
        self._needs_reset[c] = False
        self._agent_returns[c] = 0.0
        self._game_lengths[c] = 0
        self._write(c, obs)

    def _write(self, c: int, obs: dict[str, Any]) -> None:
        """Copy ``c``'s observations into its rows; agents missing from ``obs`` keep their last one."""
        A = self.n_agents
        for agent, value in obs.items():
            i = self._index[agent]
            row, parts = c * A + i, (value if isinstance(value, dict) else {OBSERVATION_KEY: value})
            for key, part in self._parts.items():
                buffer = self._buffers[key]
                if part.kind == "same":
                    buffer[row] = np.reshape(parts[key], buffer.shape[1:])
                elif part.kind == "padded":
                    flat = np.ravel(parts[key])
                    buffer[row] = 0
                    buffer[row, : flat.size] = flat
                elif part.kind == "discrete":
                    buffer[row] = int(parts[key]) - part.starts[i]
                elif MASK_KEY in parts:  # the env's own mask over this agent's actions; the rest are not its
                    buffer[row] = 0
                    buffer[row, : np.size(parts[MASK_KEY])] = np.ravel(parts[MASK_KEY])
                else:
                    buffer[row] = self._legal[i]  # type: ignore[index]
        if self._legal is not None:
            acting = set() if self._needs_reset[c] else set(self.envs[c].agents)
            for i, agent in enumerate(self.agents):
                mask = self._buffers[MASK_KEY][c * A + i]
                if agent not in acting and not mask.any():
                    mask[:] = self._legal[i]
        if STATE_KEY in self._buffers:
            self._buffers[STATE_KEY][c * A : (c + 1) * A] = self._state(c, obs)

    def _state(self, c: int, obs: dict[str, Any]) -> np.ndarray:
        if self._env_state:
            return np.ravel(self.envs[c].state())
        state = np.zeros(self._state_offsets[-1], dtype=np.float32)
        for agent, value in obs.items():
            i = self._index[agent]
            state[self._state_offsets[i] : self._state_offsets[i + 1]] = spaces.flatten(self._own_spaces[i], value)
        return state

    def _observations(self) -> Any:
        if self._flat:
            return np.concatenate(
                [self._buffers[k].reshape(self.num_envs, -1) for k in self._flat], 1, dtype=np.float32
            )
        return {key: buffer.copy() for key, buffer in self._buffers.items()}


def parallel_vector_env(
    env_id: str,
    n_envs: int,
    mode: str,
    env_kwargs: dict[str, Any],
    wrappers: tuple[str, ...],
    global_state: bool,
    flat: bool,
) -> ParallelAgents:
    """``make_vector_env`` for a PettingZoo env: ``n_envs`` copies of its game as one vector env of agents."""
    if wrappers or mode not in ("auto", "sync"):
        why = f"wrappers={list(wrappers)}: they wrap single Gymnasium envs" if wrappers else f"vec={mode!r}: use auto"
        raise ConfigError(f"env={env_id!r} is a multi-agent env, which is not allowed with {why}")
    return ParallelAgents(make_parallel_env(env_id, env_kwargs), n_envs, global_state, flat)


def agent_returns(agents: tuple[str, ...], rows: np.ndarray, info: dict[str, Any]) -> np.ndarray:
    """Each agent's return [len(rows), A] of the games that ended on ``rows`` (their ``game_over`` rows)."""
    games = dict(info.get("agent_game_returns", []))
    return np.array([[games[row // len(agents)][a] for a in agents] for row in rows], np.float64)
