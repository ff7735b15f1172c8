"""Run and algorithm configuration: frozen dataclasses validated at construction.

Every field has a docstring; the command line turns them into ``--help``. A value out
of range raises :class:`ConfigError` whose message names the field, the value and what
is allowed, so the command line can print it as one line and exit with status 2. ``argv`` is the command
line's pre-pass before its parser.

Imports: nothing of distrl's; every other layer imports it.
"""

from distrl.config.algos import (
    ALGO_CONFIGS,
    ActorCriticNet,
    PPOConfig,
    REINFORCEConfig,
    SACConfig,
    unknown_algo,
)
from distrl.config.base import (
    Activation,
    ConfigError,
    Core,
    Device,
    Encoder,
    Engine,
    Launcher,
    OnWorkerError,
    Precision,
    ReplaySampling,
    Scaling,
    Schedule,
    Strategy,
    Tracker,
    VecMode,
    call_as,
    check_types,
    from_dict,
    require,
    require_callable_as,
    split_by_config,
    to_dict,
    user_code_failed,
)
from distrl.config.dqn import DQNConfig
from distrl.config.grpo import GRPOConfig
from distrl.config.offline import (
    OFFLINE_CONFIGS,
    ONLINE_ONLY,
    BCConfig,
    CQLConfig,
    IQLConfig,
    OfflineConfig,
    TD3BCConfig,
    TD3Config,
)
from distrl.config.run import RunConfig, parse_env_kwargs
from distrl.config.strategy import DECOUPLED_ALGOS, StrategyConfig, check_decoupled, scaled
from distrl.config.vtrace import APPOConfig, IMPALAConfig

ALGO_CONFIGS.update({"appo": APPOConfig, "impala": IMPALAConfig, **OFFLINE_CONFIGS})

__all__ = [
    "DECOUPLED_ALGOS",
    "check_decoupled",
    "ALGO_CONFIGS",
    "APPOConfig",
    "IMPALAConfig",
    "unknown_algo",
    "Activation",
    "ActorCriticNet",
    "BCConfig",
    "ConfigError",
    "CQLConfig",
    "Core",
    "Device",
    "DQNConfig",
    "Encoder",
    "Engine",
    "GRPOConfig",
    "IQLConfig",
    "Launcher",
    "OFFLINE_CONFIGS",
    "OfflineConfig",
    "ONLINE_ONLY",
    "OnWorkerError",
    "PPOConfig",
    "Precision",
    "REINFORCEConfig",
    "ReplaySampling",
    "RunConfig",
    "SACConfig",
    "Scaling",
    "Schedule",
    "Strategy",
    "StrategyConfig",
    "TD3BCConfig",
    "TD3Config",
    "Tracker",
    "VecMode",
    "call_as",
    "check_types",
    "from_dict",
    "parse_env_kwargs",
    "require",
    "require_callable_as",
    "scaled",
    "split_by_config",
    "to_dict",
    "user_code_failed",
]
