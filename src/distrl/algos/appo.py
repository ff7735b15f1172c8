"""Asynchronous PPO (APPO): PPO's clipped surrogate on V-trace targets (Espeholt et al. 2018, arXiv:1802.01561).

Actors collect with whatever policy version they hold; the learner trains on their fragments with the
surrogate's ratio taken against the behaviour policy (``pi / mu``, the fragment's recorded log-probs) and
the advantages and value targets V-trace gives for the learner's current policy, as Sample Factory's APPO
(Petrenko et al. 2020, arXiv:2006.11751) does with ``--with_vtrace``: no target network, no KL term. The
correction for lag is part of the loss's inputs; the transport only carries each fragment's version.
"""

from __future__ import annotations

import torch

from distrl.algos.estimators import vtrace
from distrl.algos.ppo import PPOAlgo, Targets, rollout_starts
from distrl.config import APPOConfig, IMPALAConfig
from distrl.data.rollout import Rollout, Sequences


def vtrace_targets(
    algo: PPOAlgo,
    cfg: APPOConfig | IMPALAConfig,
    rollout: Rollout,
    obs: torch.Tensor,
    actions: torch.Tensor,
    sequences: Sequences | None,
) -> Targets:
    """V-trace's advantages and value targets of ``rollout`` for the learner's current network.

    One pass without gradients gives the current policy's log-probs of the actions taken (``pi``) and the
    critic's values of all T + 1 observations; the behaviour log-probs (``mu``) are the fragment's, recorded
    by the actor that collected it. A rollout without them was collected by this very network (``single``),
    so ``pi = mu``: the value targets are then GAE(lambda)'s returns, and the advantages GAE(1)'s at lambda 1
    (below 1 they are a TD error plus gamma times the next step's GAE advantage, as the paper defines them).
    With ``normalize_value`` V-trace runs on the critic's denormalised values (see ``PPOAlgo.denormalized``);
    the targets' ``values`` are the critic's outputs as they are.
    """
    agent = algo.agent
    T, N = rollout.rewards.shape
    flat_obs = obs[:T].reshape(T * N, *obs.shape[2:])
    with torch.no_grad():
        if sequences is None:  # one pass for pi and V over the T steps, the critic alone for the last observation
            fwd = agent.forward_train(flat_obs)
            target_log_probs = agent.dist_terms(fwd, actions).log_prob
            values = torch.cat([fwd.values.reshape(T, N), agent.values(obs[T])[None]]).float().cpu().numpy()
        else:  # recurrent: replayed from each sequence's recorded initial state, as the update will
            starts = rollout_starts(rollout, obs)
            values = agent.sequence_values(obs, sequences.initial_state, starts).float().cpu().numpy()
            fwd = agent.forward_sequences(flat_obs, sequences.initial_state, sequences.starts)
            target_log_probs = agent.dist_terms(fwd, actions).log_prob
    if rollout.log_probs is None:
        behaviour = target_log_probs
    else:
        behaviour = torch.from_numpy(rollout.log_probs.reshape(-1)).to(agent.device)
    log_rhos = (target_log_probs - behaviour).reshape(T, N).cpu().numpy()
    targets = vtrace(
        log_rhos,
        rollout.rewards,
        algo.denormalized(values),
        rollout.terminated,
        rollout.truncated,
        rollout.valid,
        cfg.gamma,
        cfg.gae_lambda,
        cfg.vtrace_rho_bar,
        cfg.vtrace_c_bar,
        algo.final_values(rollout),
    )
    return Targets(behaviour, values, targets.pg_advantages, targets.vs)


class APPOAlgo(PPOAlgo):
    """PPO's update on V-trace targets (see the module's docstring); everything else is :class:`PPOAlgo`."""

    cfg: APPOConfig

    def targets(
        self, rollout: Rollout, obs: torch.Tensor, actions: torch.Tensor, sequences: Sequences | None
    ) -> Targets:
        return vtrace_targets(self, self.cfg, rollout, obs, actions, sequences)
