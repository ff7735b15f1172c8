"""Going on from another run (``--init-from RUN``): which runs each algorithm goes on from, and SAC's start from
a CQL run.

The offline algorithms go on online from a run of their own (TD3 from a TD3+BC run) in the same networks
(:class:`~distrl.training.offline.OfflineTrainer`). SAC goes on from a CQL run: CQL for Box actions is SAC whose
critics also carry a conservative penalty, so its policy, twin critics, target critics and entropy coefficient
are SAC's own. They are copied here into SAC's networks, which keep their weights in another layout, with the CQL
run's observation standardisation (where it had one) taken into their first layers, so that SAC, which sees the
env's observations as they come, acts and values them as the CQL run did. SAC's Adam starts afresh: its moments
belong to one layout of the parameters and one objective.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from distrl.config import ConfigError
from distrl.run import checkpoint
from distrl.training.state import section

GOES_ON_FROM = {"td3bc": ("td3bc",), "td3": ("td3bc", "td3"), "iql": ("iql",), "cql": ("cql",), "sac": ("cql",)}
"""The runs each algorithm goes on from online (--init-from), by their algorithm."""


def read_run(init_from: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """The tensors and JSON state of the newest intact checkpoint of ``init_from`` (a run or a checkpoint)."""
    return checkpoint.load(checkpoint.newest_intact(Path(init_from)))


def check_goes_on_from(algo: str, init_from: str, state: dict[str, Any]) -> None:
    """Refuse, in one line, an --init-from run that ``algo`` does not go on from (``state``: its checkpoint's)."""
    if algo not in GOES_ON_FROM:
        raise ConfigError(f"init_from={init_from!r} is not available for {algo}: {', '.join(GOES_ON_FROM)} go online")
    if state.get("algo") not in GOES_ON_FROM[algo]:
        raise ConfigError(
            f"init_from={init_from!r} holds a run of {state.get('algo')}; {algo} goes on from a run of "
            f"{' or '.join(GOES_ON_FROM[algo])}"
        )


def check_strategy(init_from: str, strategy: str) -> None:
    """Refuse, in one line, a strategy that SAC does not go on from a CQL run under (its actors would start at
    random)."""
    if init_from and strategy not in ("single", "ddp"):
        raise ConfigError(
            f"init_from={init_from!r} is not available under --strategy {strategy}: sac goes on from a CQL run "
            "under single or ddp"
        )


def run_config(state: dict[str, Any]) -> dict[str, Any]:
    """The configuration the run of ``state`` trained with (its algorithm's, after the preset)."""
    return dict(state.get("config", {}).get(f"{state.get('algo')}_effective", {}))


def check_sac_fits(cfg: Any, init_from: str, state: dict[str, Any]) -> None:
    """Refuse, in one line, a CQL run whose networks are not of the sizes of this SAC run's."""
    ran = run_config(state)
    theirs = (tuple(ran.get("net_arch", ())), ran.get("activation"))
    if theirs != (tuple(cfg.net_arch), cfg.activation):
        raise ConfigError(
            f"init_from={init_from!r} has networks {theirs[0]} ({theirs[1]}); this run's are net_arch={cfg.net_arch} "
            f"({cfg.activation}): give --net-arch {' '.join(map(str, theirs[0]))} --activation {theirs[1]}"
        )


def sac_from_cql(algo: Any, tensors: dict[str, torch.Tensor], state: dict[str, Any], init_from: str) -> None:
    """Write a CQL run's policy, critics, target critics and (where SAC learns it) entropy coefficient into
    ``algo`` (a :class:`~distrl.algos.sac.SACAlgo` over distrl's MLPs)."""
    from distrl.algos.cql import CQLAlgo
    from distrl.config import CQLConfig
    from distrl.nets.sac import SquashedGaussianActor, TwinQ

    if not isinstance(algo.actor, SquashedGaussianActor) or not isinstance(algo.critic, TwinQ):
        raise ConfigError(f"init_from={init_from!r}: SAC goes on from CQL in distrl's own MLPs (no --policy)")
    check_sac_fits(algo.cfg, init_from, state)
    ran = run_config(state)
    cfg = CQLConfig(
        net_arch=tuple(ran["net_arch"]), activation=ran["activation"], target_action_gap=ran.get("target_action_gap")
    )
    cql = CQLAlgo(cfg, algo.actor.obs_dim, algo.action_dim, torch.device("cpu"), 0)
    try:
        cql.load_state_tensors(section(tensors, "algo"))
    except (KeyError, RuntimeError, ValueError) as exc:
        raise ConfigError(f"init_from={init_from!r} does not hold CQL's networks for this env: {exc}") from None
    stats = section(tensors, "obs_norm")
    mean, std = (stats["mean"], stats["std"]) if ran.get("normalize_obs") else (None, None)
    with torch.no_grad():
        algo.actor.net.copy_linears(_linears(cql.actor.module.net), mean, std)
        for twin, source in ((algo.critic, cql.critic.module), (algo.critic_target, cql.critic_target.module)):
            twin.q1.copy_linears(_linears(source.q1), mean, std)
            twin.q2.copy_linears(_linears(source.q2), mean, std)
        if algo.learn_alpha:  # a fixed --ent-coef stays what the user gave
            algo.critic.params.view("log_alpha").copy_(cql.log_alpha.module.log_value)
        algo.critic_target.params.view("log_alpha").copy_(algo.critic.params.view("log_alpha"))
    algo.actor.refresh_acting_copy()


def _linears(module: nn.Module) -> list[nn.Linear]:
    return [m for m in module.modules() if isinstance(m, nn.Linear)]


def dataset_of(state: dict[str, Any], init_from: str, rank: int, world_size: int) -> Any:
    """This worker's shard of the dataset the run of ``state`` trained on (``--keep-dataset``), read from local
    storage as the run read it."""
    from distrl.data.minari_store import open_dataset
    from distrl.data.offline import OfflineData

    ran = run_config(state)
    if not ran.get("dataset"):
        raise ConfigError(f"keep_dataset=True: init_from={init_from!r} names no dataset")
    return OfflineData.load(open_dataset(ran["dataset"], ran.get("datasets_dir") or None), rank, world_size)
