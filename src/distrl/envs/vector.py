"""Environments: building them, vector envs, and Gymnasium's autoreset in one place.

Names and entry points are resolved in :mod:`distrl.envs.names`.

Gymnasium >= 1.0 vector envs reset an environment on the step *after* it ends
(next-step autoreset): the step that ends an episode returns the true final
observation, and the following step ignores its action, returns the first
observation of the new episode and a reward of 0. :class:`VecEnv` marks that reset
step ``valid=False`` so it is never trained on, and the final observation stays
available to bootstrap truncated episodes. A caller that has what it needs of the final
observation can begin the new episodes at once instead (:meth:`VecEnv.restart`), so that
no step is spent on the reset: every step is then a transition, as in environments that
reset within the step that ends. Nothing else in distrl handles autoreset.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AutoresetMode

from distrl.config import ConfigError, VecMode, parse_env_kwargs, user_code_failed
from distrl.envs import masks
from distrl.envs.masks import has_mask_key
from distrl.envs.multiagent import ParallelAgents, agent_returns, parallel_vector_env
from distrl.envs.names import (
    EnvInstance,
    apply_wrappers,
    dependency_error,
    is_atari,
    is_user_code,
    portable_env_name,
    remembered,
    resolve_env_id,
    shown_name,
)
from distrl.envs.one_env import OneEnv
from distrl.envs.pettingzoo import is_multiagent, make_parallel_env
from distrl.envs.selfplay import TurnBasedGame, aec_factory, is_turn_based_game
from distrl.envs.spaces import DictLayout

if TYPE_CHECKING:
    from distrl.config import RunConfig


def make_single_env(
    name: str,
    env_kwargs: dict[str, Any] | None = None,
    wrappers: tuple[str, ...] = (),
    render_mode: str | None = None,
    atari_wrappers: bool = True,
    evaluation: bool = False,
    action_mask: str = "off",
) -> gym.Env:
    """One environment: ``name`` built with ``env_kwargs``, then ``wrappers`` applied in order.

    Atari games get distrl's Atari preprocessing first (unless ``atari_wrappers`` is False); with
    ``evaluation`` it leaves out episodic life and reward clipping. ``action_mask`` (auto, off or a
    source, see :mod:`distrl.envs.masks`) moves masks from ``info`` or ``action_masks()`` into the observation.
    Module-level so that async vector envs can run it in their worker processes.
    """
    env_id = resolve_env_id(name)
    kwargs = dict(env_kwargs or {})
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    try:
        if atari_wrappers and is_atari(env_id):
            from distrl.envs.atari import make_atari

            env = make_atari(env_id, dict(env_kwargs or {}), training=not evaluation, render_mode=render_mode)
        elif remembered(env_id) is not None:
            env = remembered(env_id)(**kwargs)
        elif is_turn_based_game(env_id):  # one seat of a turn-based game; the others move inside step
            env = TurnBasedGame(aec_factory(env_id, dict(env_kwargs or {})))
        else:
            env = gym.make(env_id, **kwargs)
    except (ConfigError, gym.error.DependencyNotInstalled, ImportError):
        raise  # told already, or a missing package: make_vector_env names the extra that provides it
    except Exception as exc:
        if isinstance(exc, TypeError) and env_kwargs:
            raise ConfigError(f"env_kwargs={_kwargs_text(env_kwargs)} is not accepted by {name}: {exc}") from None
        if not is_user_code(env_id):
            raise
        raise user_code_failed("env", repr(shown_name(env_id)), exc, "while making the env") from exc
    env = apply_wrappers(env, wrappers)
    return env if action_mask == "off" else masks.with_masks(env, action_mask)


def _kwargs_text(kwargs: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in kwargs.items())


def _native_accepts(spec: gym.envs.registration.EnvSpec, env_kwargs: dict[str, Any]) -> bool:
    """Whether the env's vector entry point takes every one of ``env_kwargs``."""
    creator = spec.vector_entry_point
    creator = creator if callable(creator) else load_env_creator(creator)  # type: ignore[arg-type]
    params = inspect.signature(creator).parameters
    return all(k in params for k in env_kwargs) or any(p.kind is p.VAR_KEYWORD for p in params.values())


def make_vector_env(
    env_id: str,
    n_envs: int,
    mode: VecMode = "auto",
    env_kwargs: dict[str, Any] | None = None,
    wrappers: tuple[str, ...] = (),
    atari_wrappers: bool = True,
    evaluation: bool = False,
    action_mask: str = "off",
    global_state: bool = False,
    flat_agents: bool = False,
) -> gym.vector.VectorEnv | OneEnv | ParallelAgents:
    """A Gymnasium vector env with next-step autoreset.

    A PettingZoo env (:func:`~distrl.envs.pettingzoo.is_multiagent`) is ``n_envs`` copies of its game as one vector
    env of their agents (:class:`~distrl.envs.multiagent.ParallelAgents`, ``global_state`` for a centralised critic,
    ``flat_agents`` for one shared policy: flat vector rows where every part is one).

    ``native`` uses the env's own vector implementation (e.g. CartPole's, which steps
    all environments in one numpy call); ``auto`` uses it when the env has one that takes
    ``env_kwargs`` and there are no wrappers, and falls back to ``sync`` otherwise, or to
    :class:`OneEnv` for a single environment.
    """
    env_kwargs = dict(env_kwargs or {})
    if is_multiagent(env_id):
        return parallel_vector_env(env_id, n_envs, mode, env_kwargs, wrappers, global_state, flat_agents)
    if mode == "envpool":
        return _envpool_env(env_id, n_envs, env_kwargs, wrappers, atari_wrappers)
    spec = gym.spec(env_id) if env_id in gym.registry else None
    has_native = spec is not None and spec.vector_entry_point is not None
    atari = atari_wrappers and is_atari(env_id)
    native_ok = (
        has_native
        and not wrappers
        and not atari
        and action_mask in ("off", "observation")
        and _native_accepts(spec, env_kwargs)  # type: ignore[arg-type]
    )
    if mode == "native" and not native_ok:
        why = (
            "it has no vector entry point"
            if not has_native
            else "wrappers apply to single envs"
            if wrappers
            else "distrl's Atari preprocessing applies to single envs (--no-atari-wrappers turns it off)"
            if atari
            else "its masks are moved into the observation of each env (--action-mask off keeps them out)"
            if action_mask not in ("off", "observation")
            else f"its vector entry point does not take env_kwargs {_kwargs_text(env_kwargs)}"
        )
        raise ConfigError(f"vec='native' is not available for {env_id}: {why}; use sync or async")
    if mode == "auto":  # not ale-py's AtariVectorEnv: it preprocesses in its own way (ask for it with native)
        mode = "native" if native_ok and not is_atari(env_id) else "sync"
        if mode == "sync" and n_envs == 1:
            mode = "one"
    source = remembered(env_id)
    if isinstance(source, EnvInstance) and not source.handed_out and n_envs != 1:
        raise ConfigError(
            f"n_envs={n_envs} is not allowed with an env instance that has no spec "
            f"({type(source.env.unwrapped).__name__}): must be 1, or pass a function that makes the env"
        )
    make_one = partial(
        make_single_env,
        portable_env_name(env_id),
        env_kwargs,
        tuple(wrappers),
        atari_wrappers=atari_wrappers,
        evaluation=evaluation,
        action_mask=action_mask,
    )
    try:
        if mode == "one":
            return OneEnv(make_one())
        if mode == "native":
            env = gym.make_vec(env_id, num_envs=n_envs, vectorization_mode="vector_entry_point", **env_kwargs)
        elif mode == "sync":
            env = gym.vector.SyncVectorEnv([make_one] * n_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
        else:
            if wrappers or is_user_code(env_id):  # user code: fail here, not in a worker process
                make_one().close()
            env = gym.vector.AsyncVectorEnv([make_one] * n_envs, autoreset_mode=AutoresetMode.NEXT_STEP)
    except (gym.error.DependencyNotInstalled, ImportError, ModuleNotFoundError) as exc:
        raise dependency_error(env_id, exc) from None
    autoreset = env.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
    if autoreset != AutoresetMode.NEXT_STEP:
        env.close()
        raise ConfigError(f"env={shown_name(env_id)!r} uses autoreset mode {autoreset}; distrl needs NEXT_STEP")
    return env


def _envpool_env(
    env_id: str, n_envs: int, env_kwargs: dict[str, Any], wrappers: tuple[str, ...], atari_wrappers: bool
) -> gym.vector.VectorEnv | OneEnv:
    if wrappers:
        raise ConfigError(
            f"vec='envpool' cannot apply wrappers={list(wrappers)}: they wrap single Gymnasium envs; "
            "use vec=sync or async"
        )
    atari = is_atari(env_id)
    if atari and not atari_wrappers:
        raise ConfigError(
            "vec='envpool' preprocesses Atari games itself; it cannot run with atari_wrappers=False "
            "(--no-atari-wrappers): use vec=sync or async"
        )
    from distrl.envs.envpool import EnvPoolVector

    return EnvPoolVector(env_id, n_envs, env_kwargs, atari)  # type: ignore[return-value]


_NO_EPISODES = np.zeros(0, dtype=np.float64)
_NO_LENGTHS = np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Step:
    """One vector step as distrl sees it; arrays are [n_envs].

    ``obs`` after a step that ended an episode is that episode's true final
    observation; ``valid`` is False on the reset step that follows it.
    """

    obs: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    valid: np.ndarray
    episode_returns: np.ndarray
    """Undiscounted returns of the episodes that ended on this step (raw rewards)."""
    episode_lengths: np.ndarray
    episode_ends: np.ndarray | None = None
    """[n_envs] bool: where the episodes of episode_returns ended; None means wherever terminated | truncated.
    They differ for envs that count whole games while an episode is a life (distrl.envs.atari)."""
    agent_returns: np.ndarray | None = None
    """A multi-agent env: [episodes, agents] each agent's return of each game in episode_returns."""


class VecEnv:
    """A next-step-autoreset vector env with valid-step masks and episode statistics.

    Dict observations come out packed, one uint8 row per env (:class:`~distrl.envs.spaces.DictLayout`);
    ``single_observation_space`` stays the env's Dict space, which the encoder is built from.
    """

    def __init__(self, env: gym.vector.VectorEnv | OneEnv | ParallelAgents, env_id: str, check_masks: bool = False):
        """``check_masks``: refuse an observation's action mask that leaves no legal action where an action must
        follow (any observation but an episode's last)."""
        self.env = env
        self.env_id = env_id
        self.n_envs = env.num_envs
        self.agents: tuple[str, ...] = env.agents if isinstance(env, ParallelAgents) else ()
        """A multi-agent env's agents: its rows are ``copy * len(agents) + agent``."""
        self.single_observation_space = env.single_observation_space
        self.single_action_space = env.single_action_space
        space = self.single_observation_space
        self._layout = DictLayout(space) if isinstance(space, gym.spaces.Dict) else None
        self._masks = masks.MaskReader(space, self.single_action_space) if check_masks and has_mask_key(space) else None
        self._ended = np.zeros(self.n_envs, dtype=bool)
        self._returns = np.zeros(self.n_envs, dtype=np.float64)
        self._lengths = np.zeros(self.n_envs, dtype=np.int64)

    def reset(self, seed: int | None = None) -> np.ndarray:
        """Start fresh episodes everywhere; env i is seeded ``seed + i``."""
        obs, _ = self.env.reset(seed=seed)
        self._ended[:] = False
        self._returns[:] = 0.0
        self._lengths[:] = 0
        obs = obs if self._layout is None else self._layout.pack(obs)
        if self._masks is not None:
            self._masks.check(obs)
        return obs

    def step(self, actions: np.ndarray) -> Step:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if self._layout is not None:
            obs = self._layout.pack(obs)
        valid = ~self._ended
        if "active" in info:  # rows that sat this step out (distrl.envs.multiagent: an agent out of its game)
            valid &= np.where(info.get("_active", True), info["active"], True)
        if not valid.all():  # the reset step, or a row that sat out: its reward and flags belong to no episode
            reward = np.where(valid, reward, 0.0)
            terminated = terminated & valid
            truncated = truncated & valid
        reward = reward.astype(np.float32, copy=False)
        if self._masks is not None:  # an episode's last observation may leave nothing legal (a finished board)
            self._masks.check(obs[~(terminated | truncated)])
        self._returns += reward
        self._lengths += valid
        ended = terminated | truncated
        self._ended = ended
        if not ended.any():
            return Step(obs, reward, terminated, truncated, valid, _NO_EPISODES, _NO_LENGTHS)
        if "game_over" in info:  # the env counts whole games (unclipped) and an episode may be one life
            over = ended & info["game_over"] & info.get("_game_over", True)
            self._returns[ended] = 0.0
            self._lengths[ended] = 0
            if not over.any():
                return Step(obs, reward, terminated, truncated, valid, _NO_EPISODES, _NO_LENGTHS, over)
            return Step(
                obs,
                reward,
                terminated,
                truncated,
                valid,
                info["game_return"][over].astype(np.float64),
                info["game_length"][over].astype(np.int64),
                over,
                agent_returns(self.agents, np.flatnonzero(over), info) if self.agents else None,
            )
        episode_returns = self._returns[ended]
        episode_lengths = self._lengths[ended]
        self._returns[ended] = 0.0
        self._lengths[ended] = 0
        return Step(obs, reward, terminated, truncated, valid, episode_returns, episode_lengths)

    @property
    def can_restart(self) -> bool:
        """Whether :meth:`restart` can begin new episodes in some rows alone: Gymnasium's own vector envs and
        :class:`OneEnv` can; envpool and multi-agent games reset on the next step only."""
        return isinstance(self.env, (OneEnv, gym.vector.SyncVectorEnv, gym.vector.AsyncVectorEnv))

    def restart(self, ended: np.ndarray) -> np.ndarray:
        """Begin new episodes now in the rows ``ended`` (the episodes the last step ended), so that the next step
        is a step of each rather than a reset step; returns every row's observation: the new episodes' first
        where ``ended``, the others' as the last step left them. Needs :attr:`can_restart`."""
        if isinstance(self.env, OneEnv):
            obs = self.env.restart()
        else:  # Gymnasium's partial reset, which also cancels the pending next-step reset of those rows
            obs, _ = self.env.reset(options={"reset_mask": np.asarray(ended, dtype=bool)})
        self._ended &= ~ended
        if self._layout is not None:
            obs = self._layout.pack(obs)
        if self._masks is not None:
            self._masks.check(obs[ended])
        return obs

    def close(self) -> None:
        self.env.close()


def make_env(
    env_id: str,
    n_envs: int,
    vec: VecMode = "auto",
    env_kwargs: dict[str, Any] | None = None,
    wrappers: tuple[str, ...] = (),
    atari_wrappers: bool = True,
    evaluation: bool = False,
    action_mask: str = "off",
    global_state: bool = False,
    flat_agents: bool = False,
) -> VecEnv:
    """Resolve ``env_id`` and build a :class:`VecEnv` of ``n_envs`` environments, each built with
    ``env_kwargs`` and wrapped by ``wrappers`` ('package.module:function', applied in order); Atari
    games are preprocessed first (see :mod:`distrl.envs.atari`; ``evaluation``: no episodic life, no clipping);
    ``action_mask`` as for :func:`make_single_env`."""
    env_id = resolve_env_id(env_id)
    return VecEnv(
        make_vector_env(
            env_id,
            n_envs,
            vec,
            env_kwargs,
            tuple(wrappers),
            atari_wrappers,
            evaluation,
            action_mask,
            global_state,
            flat_agents,
        ),
        env_id,
        check_masks=action_mask != "off",
    )


def make_run_env(run: RunConfig, n_envs: int, env_id: str | None = None, evaluation: bool = False) -> VecEnv:
    """The run's environments (``run.env``, or ``env_id``) with the run's env_kwargs and wrappers:
    every trainer, evaluation, resume and remote worker builds its envs here.

    Evaluation runs on Gymnasium even when training runs on envpool, so that scores mean the same
    with either backend (see :mod:`distrl.envs.envpool`)."""
    vec = "auto" if evaluation and run.vec == "envpool" else run.vec
    return make_env(
        env_id or run.env,
        n_envs,
        vec,
        parse_env_kwargs(run.env_kwargs),
        run.wrappers,
        run.atari_wrappers,
        evaluation,
        run.action_mask,
        run.critic == "centralised",
        run.agent_policies == "shared" and not run.agent_groups and run.critic == "local",
    )


def resolve_action_mask(run: RunConfig) -> RunConfig:
    """``run`` with ``--action-mask auto`` replaced by where this env's masks are ("observation", "info",
    "method") or "off", and a named source checked, once: what config.json records, and what every worker and
    evaluation then builds without looking again."""
    mode = run.action_mask
    if mode == "off":
        return run
    if is_multiagent(resolve_env_id(run.env)):  # the agents' masks, where they have any, are in the observation
        agents = ParallelAgents(make_parallel_env(resolve_env_id(run.env), parse_env_kwargs(run.env_kwargs)), 1)
        agents.close()
        found = "observation" if has_mask_key(agents.single_observation_space) else "off"
        if mode not in ("auto", found):
            raise ConfigError(f"action_mask={mode!r} is not allowed for a multi-agent env: use auto, off or {found}")
        return run.replace(action_mask=found)
    instance = remembered(resolve_env_id(run.env))
    if isinstance(instance, EnvInstance) and not run.wrappers:  # the user's own env: looked at, not handed out
        return run.replace(action_mask=masks.resolve(mode, instance.env))
    env = make_single_env(run.env, parse_env_kwargs(run.env_kwargs), run.wrappers, atari_wrappers=run.atari_wrappers)
    try:
        return run.replace(action_mask=masks.resolve(mode, env))
    finally:
        env.close()
