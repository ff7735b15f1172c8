"""The one place agents are built: closed-form MLPs where they apply, a module otherwise.

The closed-form :class:`ActorCritic` serves flat vector observations with Discrete or Box
actions and no user network: it is what makes small-network PPO fast. Everything else —
images, Dict or Discrete observations, MultiDiscrete and MultiBinary actions, a chosen CNN,
a user's module — goes through :class:`ModuleAgent`, over the same flat parameter buffer, and a
recurrent module (``--core lstm|gru``, or a user's module under the recurrent contract) through
:class:`~distrl.nets.recurrent.RecurrentAgent`.
"""

from __future__ import annotations

import copy
import importlib
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any, NamedTuple

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from distrl.config import ActorCriticNet, ConfigError, call_as
from distrl.envs.masks import encoded_keys, reader_for
from distrl.envs.names import MEMORY, remembered, shown_name
from distrl.envs.spaces import action_spec, check_observation_space, is_image, is_vector
from distrl.nets.actor_critic import ActorCritic
from distrl.nets.agent import Agent
from distrl.nets.encoders import DictEncoder, EncoderName, make_encoder
from distrl.nets.module import ModuleAgent
from distrl.nets.multiagent import AgentSetup, multiagent_module
from distrl.nets.q import QMLP, ModuleQ, QHeadModule
from distrl.nets.recurrent import RecurrentAgent, is_recurrent, with_heads
from distrl.nets.sac import SquashedGaussianActor, TwinQ
from distrl.nets.sac_module import ModuleSquashedActor, ModuleTwinQ, SACActorModule, TwinQModule

PolicySource = str | nn.Module | Callable[..., nn.Module] | None
"""What a user passes as the network: 'package.module:function', a module, a module class or a factory."""


def resolve_policy(policy: PolicySource) -> nn.Module | Callable[..., nn.Module] | None:
    """Import a 'package.module:function' policy factory; other sources are returned as they are."""
    if not isinstance(policy, str):
        return policy
    if not policy:
        return None
    if policy.startswith(MEMORY):
        found = remembered(policy)
        if found is None:
            raise ConfigError(
                f"policy={policy!r} names a network given to the Python API in another process: "
                "pass it again, e.g. PPO.load(path, policy=MyNet)"
            )
        return found
    module_name, _, attr = policy.partition(":")
    if not module_name or not attr:
        raise ConfigError(f"policy={policy!r} is not allowed: must be 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"policy={policy!r}: cannot import module {module_name!r} ({exc})") from None
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise ConfigError(
            f"policy={policy!r}: module {module_name!r} has no callable {attr!r}; a policy factory is "
            "called with (observation_space, action_space, config) and returns a torch.nn.Module"
        )
    return factory


def uses_closed_form(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    encoder: str,
    policy: PolicySource = None,
    core: str = "none",
) -> bool:
    """Whether the closed-form MLPs serve this run: flat float vectors, Discrete or Box actions,
    the built-in network, no encoder and no recurrent core asked for."""
    return (
        policy in (None, "")
        and isinstance(observation_space, spaces.Box)
        and not is_image(observation_space)
        and isinstance(action_space, (spaces.Discrete, spaces.Box))
        and encoder in ("auto", "mlp")
        and core == "none"
    )


@contextmanager
def seeded_layers(seed: int):
    """Layers made inside take their default initialisation from torch's global generator seeded with ``seed``,
    which is restored after: a network depends on the run's seed alone (the same on every worker and rerun,
    whatever ran before in this process)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def builtin_encoder(observation_space: spaces.Space, encoder: EncoderName, action_mask: str) -> nn.Module:
    """distrl's encoder for a run's observations; a mask distrl moved into them from ``info`` or ``action_masks()``
    masks the logits and is no input (see :func:`distrl.envs.masks.encoded_keys`)."""
    keys = encoded_keys(observation_space, action_mask)
    if keys is None:
        return make_encoder(observation_space, encoder)
    return DictEncoder(observation_space, encoder, keys)  # type: ignore[arg-type]


def build_module(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ActorCriticNet,
    policy: PolicySource,
    seed: int,
    agents: AgentSetup | None = None,
    action_mask: str = "off",
) -> nn.Module:
    """The network of the module path: the user's (seeded with ``seed``), or the built-in encoder and heads.

    A user's module either returns ``(head, value)`` itself, or has an integer ``features_dim``
    attribute and is used as the encoder in front of distrl's heads. ``agents``: a multi-agent run's
    policies and critic (see :func:`_multiagent_network`). ``action_mask``: the run's, for what the built-in
    encoder reads (:func:`builtin_encoder`).
    """
    source = resolve_policy(policy)
    with seeded_layers(seed):  # the user's layers and distrl's heads alike
        if agents is not None and not agents.one_network:
            net = _multiagent_network(observation_space, action_space, cfg, policy, agents)
        elif source is None:
            encoder = builtin_encoder(observation_space, cfg.encoder, action_mask)
            net = _with_heads(encoder, action_spec(action_space).head_size, cfg)
        else:
            return _user_network(observation_space, action_space, cfg, policy, source)
    if source is None and cfg.ortho_init:
        net.init_orthogonal(torch.Generator().manual_seed(seed))  # type: ignore[operator]
    return net


def _multiagent_network(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ActorCriticNet,
    policy: PolicySource,
    agents: AgentSetup,
) -> nn.Module:
    """Networks per group of agents and/or the centralised critic (see :mod:`distrl.nets.multiagent`), built
    inside :func:`seeded_layers`: each group's is what one shared network would be, distrl's or the user's.

    A user's factory or class is called once per group, in the groups' order, so the groups start from
    different weights that depend on the seed alone; a module instance is copied into each group. Under the
    centralised critic the user's module must be an encoder: it becomes the actor's, fed every part of the row
    but the global state, and the critic stays distrl's network of the state and the agent's index. As for a
    single network, ``ortho_init`` applies to distrl's networks alone: with a user's module every layer keeps
    torch's initialisation.
    """
    source = resolve_policy(policy)

    def own_source() -> nn.Module | Callable[..., nn.Module]:
        assert source is not None
        return copy.deepcopy(source) if isinstance(source, nn.Module) else source

    def network() -> nn.Module:
        return _user_network(observation_space, action_space, cfg, policy, own_source())

    def actor_encoder(actor_space: spaces.Dict) -> nn.Module:
        module = _user_module(actor_space, action_space, cfg, policy, own_source())
        if not _is_encoder(module):
            raise ConfigError(
                f"critic=centralised is not allowed with policy={_name(policy)}: it returns (head, value) itself; "
                "give it an integer features_dim (it then encodes each agent's own observation for the actor, "
                "and distrl's critic reads the global state)"
            )
        return module

    user = source is not None
    built = multiagent_module(
        observation_space,
        action_spec(action_space).head_size,
        tuple(cfg.net_arch),
        cfg.activation,
        cfg.encoder,
        agents,
        cfg.core,
        cfg.core_size,
        network=network if user else None,
        actor_encoder=actor_encoder if user else None,
    )
    assert built is not None, "one shared policy with a local critic is distrl's single network"
    return built


def _user_module(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ActorCriticNet,
    policy: PolicySource,
    source: nn.Module | Callable[..., nn.Module],
) -> nn.Module:
    """The module ``source`` is or makes for these spaces (a one-line error for a factory of the wrong shape or
    one that returns something else than a ``torch.nn.Module``)."""
    if isinstance(source, nn.Module):
        return source
    module = call_as("policy", _name(policy), source, (observation_space, action_space, cfg), FACTORY_SHAPE, CALLED)
    if not isinstance(module, nn.Module):
        raise ConfigError(f"policy={_name(policy)} returned {type(module).__name__}, not a torch.nn.Module")
    return module


def _is_encoder(module: nn.Module) -> bool:
    """Whether a user's module is an encoder that distrl puts its heads on (an integer ``features_dim``, not
    recurrent), rather than a network that returns ``(head, value)`` itself."""
    return isinstance(getattr(module, "features_dim", None), (int, np.integer)) and not is_recurrent(module)


def _user_network(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ActorCriticNet,
    policy: PolicySource,
    source: nn.Module | Callable[..., nn.Module],
) -> nn.Module:
    """The user's module with distrl's heads (and ``cfg.core``) on it when it is an encoder, else as it is."""
    module = _user_module(observation_space, action_space, cfg, policy, source)
    if _is_encoder(module):
        return _with_heads(module, action_spec(action_space).head_size, cfg)
    if cfg.core != "none" and not is_recurrent(module):
        raise ConfigError(
            f"core={cfg.core!r} is not allowed with policy={_name(policy)}: it returns (head, value) itself; "
            "give it an integer features_dim (distrl adds the core and heads), or make it recurrent "
            "(forward(obs, state, episode_starts) and initial_state(batch_size), see distrl.nets.recurrent)"
        )
    return module


def _with_heads(encoder: nn.Module, head_size: int, cfg: ActorCriticNet) -> nn.Module:
    """distrl's heads on ``encoder``, with the recurrent core ``cfg.core`` between them if any."""
    return with_heads(encoder, head_size, tuple(cfg.net_arch), cfg.activation, cfg.core, cfg.core_size)


def make_agent(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ActorCriticNet,
    device: torch.device | str,
    seed: int,
    policy: PolicySource = None,
    precision: str = "fp32",
    action_mask: str = "auto",
    agents: AgentSetup | None = None,
) -> Agent:
    """The agent for a PPO or REINFORCE run (``cfg`` is its config); see the module docstring.

    ``precision='bf16'`` runs a module's forward and backward under bfloat16 autocast; the closed-form
    MLPs compute in float32 whatever it says. The run's ``action_mask`` (anything but "off") masks the
    logits with the observation's ``action_mask`` part where it has one (see :mod:`distrl.envs.masks`). ``agents``:
    a multi-agent env's policies and critic (see :mod:`distrl.nets.multiagent`)."""
    check_observation_space(observation_space)
    action_spec(action_space)  # a one-line error for an action space no head fits
    if uses_closed_form(observation_space, action_space, cfg.encoder, policy, cfg.core):
        obs_dim = int(np.prod(observation_space.shape))
        return ActorCritic(
            obs_dim, action_space, tuple(cfg.net_arch), cfg.activation, cfg.log_std_init, cfg.ortho_init, device, seed
        )
    module = build_module(observation_space, action_space, cfg, policy, seed, agents, action_mask)
    agent_cls = RecurrentAgent if is_recurrent(module) else ModuleAgent
    return agent_cls(
        module,
        observation_space,
        action_space,
        cfg.log_std_init,
        device,
        autocast=torch.bfloat16 if precision == "bf16" else None,
        masked=reader_for(observation_space, action_space, action_mask) is not None,
    )


FACTORY_SHAPE = "a torch.nn.Module class or function taking (observation_space, action_space, config)"
CALLED = "when called with (observation_space, action_space, config)"


def _name(policy: PolicySource) -> str:
    return repr(policy) if isinstance(policy, str) else getattr(policy, "__qualname__", type(policy).__name__)


def check_agent_spaces(
    env_id: str,
    algo: str,
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: ActorCriticNet,
    normalize_obs: bool = False,
) -> None:
    """Fail before any process starts when a PPO or REINFORCE agent cannot be built for these spaces."""
    try:
        check_observation_space(observation_space)
        action_spec(action_space, algo)
    except ConfigError as exc:
        raise ConfigError(f"env={shown_name(env_id)!r}: {exc}") from None
    if normalize_obs and not (is_vector(observation_space) or isinstance(observation_space, spaces.Dict)):
        raise ConfigError(
            f"normalize_obs=True is not allowed for env={shown_name(env_id)!r}: its {type(observation_space).__name__} "
            "observations are not a vector or a Dict (images are scaled to [0, 1] by the encoder); "
            "use --no-normalize-obs"
        )
    if cfg.encoder not in ("auto", "mlp") and not uses_closed_form(observation_space, action_space, cfg.encoder):
        make_encoder(observation_space, cfg.encoder)  # e.g. the Nature CNN on an image too small for it


class SACNetworks(NamedTuple):
    """SAC's actor, critic (with log alpha in its buffer) and target critic."""

    actor: SquashedGaussianActor | ModuleSquashedActor
    critic: TwinQ | ModuleTwinQ
    critic_target: TwinQ | ModuleTwinQ


def make_sac_networks(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: Any,
    device: torch.device | str,
    seed: int,
    policy: PolicySource = None,
    precision: str = "fp32",
) -> SACNetworks:
    """SAC's networks: closed-form MLPs for flat vectors, modules otherwise (see ``nets/sac_module.py``).

    A user's ``policy`` factory returns either ``(actor, critic)`` modules with the contracts stated
    there, or an encoder with ``features_dim`` that distrl copies twice: the actor's, and one the two Q heads share.
    ``precision='bf16'`` multiplies the closed-form MLPs' matrices in bfloat16 and runs the modules under
    bfloat16 autocast (float32 weights, gradients, Adam and losses either way).
    """
    device = torch.device(device)
    action_dim = int(np.prod(action_space.shape))
    extra = {"log_alpha": (1,)}
    if uses_closed_form(observation_space, spaces.Box(-1, 1, (action_dim,)), cfg.encoder, policy):
        obs_dim = int(np.prod(observation_space.shape))
        low = torch.bfloat16 if precision == "bf16" else None
        return SACNetworks(
            SquashedGaussianActor(obs_dim, action_dim, cfg.net_arch, cfg.activation, device, seed, low),
            TwinQ(obs_dim, action_dim, cfg.net_arch, cfg.activation, device, seed, extra, low),
            TwinQ(obs_dim, action_dim, cfg.net_arch, cfg.activation, device, seed, extra, low),
        )
    source = resolve_policy(policy)
    with seeded_layers(seed):
        if source is None:
            made: Any = make_encoder(observation_space, cfg.encoder)
        else:
            args = (observation_space, action_space, cfg)
            given = isinstance(source, (nn.Module, tuple))
            made = source if given else call_as("policy", _name(policy), source, args, FACTORY_SHAPE, CALLED)
        if isinstance(made, tuple) and len(made) == 2 and all(isinstance(m, nn.Module) for m in made):
            actor_module, critic_module = made
        elif isinstance(made, nn.Module) and isinstance(getattr(made, "features_dim", None), (int, np.integer)):
            actor_module = SACActorModule(made, action_dim, tuple(cfg.net_arch), cfg.activation)
            critic_module = TwinQModule(copy.deepcopy(made), action_dim, tuple(cfg.net_arch), cfg.activation)
        else:
            raise ConfigError(
                f"policy={_name(policy)} returned {type(made).__name__}: for sac a policy factory returns "
                "(actor, critic) modules or an encoder module with an integer features_dim"
            )
    autocast = torch.bfloat16 if precision == "bf16" else None
    return SACNetworks(
        ModuleSquashedActor(actor_module, action_dim, device, autocast),
        ModuleTwinQ(critic_module, device, extra, autocast),
        ModuleTwinQ(critic_module, device, extra, autocast),
    )


def make_q_network(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    cfg: Any,
    device: torch.device | str,
    seed: int,
    policy: PolicySource = None,
    precision: str = "fp32",
    action_mask: str = "auto",
) -> QMLP | ModuleQ:
    """DQN's Q network (see ``nets/q.py``): a closed-form MLP for flat vectors, a module otherwise.

    ``cfg`` gives ``net_arch``, ``activation``, ``encoder`` and ``dueling``. A user's ``policy`` returns
    either an encoder with an integer ``features_dim`` (distrl adds the Q head) or the whole Q function,
    [B, ...] -> [B, n_actions]. The same ``seed`` gives the same weights, which is how the target network
    starts equal to the online one. Actions are indices 0..n-1 whatever the space's ``start``.
    ``precision='bf16'``: as for :func:`make_sac_networks`. ``action_mask``: as for :func:`make_agent`.
    """
    if not isinstance(action_space, spaces.Discrete):
        raise ConfigError(
            f"a {type(action_space).__name__} action space is not allowed: dqn needs Discrete actions (one Q-value each)"
        )
    check_observation_space(observation_space)
    device = torch.device(device)
    n_actions = int(action_space.n)
    net_arch = tuple(cfg.net_arch)
    if uses_closed_form(observation_space, action_space, cfg.encoder, policy):
        obs_dim = int(np.prod(observation_space.shape))
        low = torch.bfloat16 if precision == "bf16" else None
        return QMLP(obs_dim, n_actions, net_arch, cfg.activation, device, seed, cfg.dueling, low)
    source = resolve_policy(policy)
    with seeded_layers(seed):
        if source is None:
            made: Any = builtin_encoder(observation_space, cfg.encoder, action_mask)
        else:
            args = (observation_space, action_space, cfg)
            given = isinstance(source, nn.Module)
            made = source if given else call_as("policy", _name(policy), source, args, FACTORY_SHAPE, CALLED)
        if not isinstance(made, nn.Module):
            raise ConfigError(
                f"policy={_name(policy)} returned {type(made).__name__}: for dqn a policy factory returns a "
                "torch.nn.Module, either the Q function ([batch, ...] -> [batch, n_actions]) or an encoder "
                "with an integer features_dim"
            )
        if source is None or isinstance(getattr(made, "features_dim", None), (int, np.integer)):
            made = QHeadModule(made, n_actions, net_arch, cfg.activation, cfg.dueling)
    masks = reader_for(observation_space, action_space, action_mask)
    return ModuleQ(made, n_actions, device, torch.bfloat16 if precision == "bf16" else None, masks)
