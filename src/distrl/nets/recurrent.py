"""Recurrent policies: an LSTM or GRU core between the encoder and the heads, and the agent that carries its
state through collection, training on whole sequences, evaluation and prediction.

The recurrent module contract (the built-in :class:`RecurrentActorCritic`, or a user's module):

- ``forward(obs, state, episode_starts) -> ((head, value), new_state)``: ``obs`` [T, B, *obs_shape] in
  the stored dtype; ``state`` a tuple of tensors with the batch on axis 1 (as torch's LSTM and GRU keep
  theirs, [layers, B, hidden]); ``episode_starts`` [T, B], 1.0 where the observation begins an episode,
  where the module must restart from its initial state before the step; ``head`` [T, B, head_size],
  ``value`` [T, B].
- ``initial_state(batch_size) -> tuple[Tensor, ...]``: the state an episode begins from (zeros).

Collection records each rollout fragment's initial state per environment and every step's episode
starts; training replays each environment's fragment from that state (truncated backpropagation
through the whole fragment), so the values and log-probs of GAE and of the ratio come from the same
kind of sequence pass as acting did.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from distrl.config import ConfigError
from distrl.envs.masks import mask_logits
from distrl.nets.agent import ActStep, State
from distrl.nets.distributions import sample_actions
from distrl.nets.encoders import ActorCriticModule
from distrl.nets.module import LOG_STD, ModuleAgent, ModuleForward


def _cpu_has_bf16() -> bool:
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


CPU_BF16 = _cpu_has_bf16()
"""Whether oneDNN runs bfloat16 on this CPU (AVX-512 BF16 or AMX): without it, --precision bf16 runs the
recurrent core in float32 (a bfloat16 LSTM cannot be built; an AMD EPYC without them raised)."""


class RecurrentCore(nn.Module):
    """An LSTM or GRU over [T, B, features] that restarts from zeros where an episode starts.

    A sequence is run in segments between the steps where any environment starts an episode: one
    call of torch's LSTM/GRU per segment, with the starting environments' state zeroed in between.
    That is the arithmetic of a step-by-step loop with far fewer calls when episodes are long.
    """

    def __init__(self, kind: str, input_dim: int, hidden: int):
        super().__init__()
        self.kind = kind
        self.hidden = hidden
        self.features_dim = hidden
        self.rnn = nn.LSTM(input_dim, hidden) if kind == "lstm" else nn.GRU(input_dim, hidden)

    def initial_state(self, batch_size: int) -> State:
        zeros = torch.zeros(1, batch_size, self.hidden)
        return (zeros, zeros.clone()) if self.kind == "lstm" else (zeros,)

    def forward(self, x: torch.Tensor, state: State, starts: torch.Tensor) -> tuple[torch.Tensor, State]:
        if x.device.type == "cpu" and torch.is_autocast_enabled("cpu") and not CPU_BF16:
            # oneDNN builds no bfloat16 LSTM or GRU on a CPU without bfloat16 instructions: float32 here
            with torch.autocast("cpu", enabled=False):
                return self.forward(x.float(), tuple(s.float() for s in state), starts)
        T = x.shape[0]
        keep = 1.0 - starts.to(x.dtype)
        cuts = [0, *(int(t) + 1 for t in torch.nonzero(starts[1:].any(1)).flatten()), T]
        outputs = []
        for a, b in zip(cuts[:-1], cuts[1:]):
            mask = keep[a].view(1, -1, 1)
            state = tuple(s * mask for s in state)
            if self.kind == "lstm":
                out, (h, c) = self.rnn(x[a:b], (state[0], state[1]))
                state = (h, c)
            else:
                out, h = self.rnn(x[a:b], state[0])
                state = (h,)
            outputs.append(out)
        return torch.cat(outputs) if len(outputs) > 1 else outputs[0], state

    def init_orthogonal(self, generator: torch.Generator) -> None:
        """Orthogonal input and recurrent weights (gain 1), zero biases."""
        with torch.no_grad():
            for name, p in self.rnn.named_parameters():
                if name.startswith("weight"):
                    weight = torch.empty(p.shape)
                    nn.init.orthogonal_(weight, gain=1.0, generator=generator)
                    p.copy_(weight)
                else:
                    p.zero_()


class RecurrentActorCritic(ActorCriticModule):
    """encoder → recurrent core → policy and value heads, under the recurrent module contract."""

    def __init__(
        self, encoder: nn.Module, core: RecurrentCore, head_size: int, net_arch: tuple[int, ...], activation: str
    ):
        super().__init__(encoder, head_size, net_arch, activation, features_dim=core.features_dim)
        self.core = core

    def initial_state(self, batch_size: int) -> State:
        return self.core.initial_state(batch_size)

    def forward(
        self,
        obs: torch.Tensor,
        state: State,
        episode_starts: torch.Tensor,  # type: ignore[override]
    ) -> tuple[tuple[torch.Tensor, torch.Tensor], State]:
        T, B = obs.shape[:2]
        features = self.encoder(obs.reshape(T * B, *obs.shape[2:])).reshape(T, B, -1)
        out, state = self.core(features, state, episode_starts)
        flat = out.reshape(T * B, -1)
        return (self.policy(flat).reshape(T, B, -1), self.critic(flat).reshape(T, B)), state

    def init_orthogonal(self, generator: torch.Generator) -> None:
        super().init_orthogonal(generator)
        self.core.init_orthogonal(generator)


def with_heads(
    encoder: nn.Module,
    head_size: int,
    net_arch: tuple[int, ...],
    activation: str,
    core: str = "none",
    core_size: int = 128,
) -> ActorCriticModule:
    """distrl's policy and value heads on ``encoder`` (which has an integer ``features_dim``), with a recurrent
    core between them unless ``core`` is "none" (an lstm or gru of ``core_size`` units)."""
    if core == "none":
        return ActorCriticModule(encoder, head_size, net_arch, activation)
    rnn = RecurrentCore(core, int(encoder.features_dim), core_size)  # type: ignore[arg-type]
    return RecurrentActorCritic(encoder, rnn, head_size, net_arch, activation)


def is_recurrent(module: nn.Module) -> bool:
    return callable(getattr(module, "initial_state", None))


class RecurrentAgent(ModuleAgent):
    """A :class:`ModuleAgent` over a recurrent module: acting takes and returns the state, training runs
    whole sequences, and the vector-Jacobian product reaches every step of them (backpropagation through
    time over each fragment)."""

    recurrent = True

    def initial_state(self, batch_size: int) -> State:
        with torch.no_grad():
            return tuple(s.to(self.device) for s in self.module.initial_state(batch_size))

    def _call_seq(
        self, views: dict[str, torch.Tensor], obs: torch.Tensor, state: State, starts: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """head [T, B, H] and values [T, B] (float32) and the state after the last step."""
        T, B = obs.shape[:2]
        with torch.autocast(self.device.type, dtype=self.autocast or torch.bfloat16, enabled=self.autocast is not None):
            (head, values), state = torch.func.functional_call(
                self.module, {n: views[n] for n in self.names}, (obs, state, starts)
            )
        head, values = head.float(), values.reshape(T, B).float()
        if self.masks is not None:
            head = mask_logits(head, self.masks(obs))
        if not self._checked:
            if tuple(head.shape) != (T, B, self.spec.head_size):
                raise ConfigError(
                    f"the recurrent policy module returned head {tuple(head.shape)}; this action space "
                    f"needs ({T}, {B}, {self.spec.head_size}) for observations [{T}, {B}, ...]"
                )
            self._checked = True
        return head, values, tuple(s.float() for s in state)  # float32 whatever autocast ran in (rollouts keep it)

    def _starts(self, starts: np.ndarray | torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
        return torch.as_tensor(starts, dtype=torch.float32).to(self.device).reshape(shape)

    @torch.no_grad()
    def act_state(
        self, obs: np.ndarray, noise: np.ndarray | None, state: State, starts: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, State]:
        """One step for a batch of environments: actions, their log-probs, the values, and the next state.
        ``starts`` [B] marks observations that begin an episode (their state restarts first)."""
        views = self._views(self.params.data)
        obs_t = self._obs(obs)
        head, values, state = self._call_seq(views, obs_t[None], state, self._starts(starts, (1, len(obs))))
        head, values = head[0], values[0]
        std = None if self.discrete else views[LOG_STD].exp().cpu().numpy()
        actions = sample_actions(self.spec.kind, head.cpu().numpy(), std, noise, self.spec.nvec)
        terms = self.dist_terms(
            ModuleForward(head, values, views.get(LOG_STD)), torch.from_numpy(actions).to(self.device)
        )
        return actions, terms.log_prob.cpu().numpy(), values.cpu().numpy(), state

    @torch.no_grad()
    def value_state(self, obs: np.ndarray, state: State, starts: np.ndarray) -> np.ndarray:
        """Values of one step's observations from ``state``, without advancing it (bootstrapping)."""
        views = self._views(self.params.data)
        _, values, _ = self._call_seq(views, self._obs(obs)[None], state, self._starts(starts, (1, len(obs))))
        return values[0].cpu().numpy()

    @torch.no_grad()
    def sequence_values(self, obs: torch.Tensor, state: State, starts: torch.Tensor) -> torch.Tensor:
        """Values [T, B] of sequences ``obs`` [T, B, ...] from ``state`` (``starts`` [T, B])."""
        views = self._views(self.params.data)
        return self._call_seq(views, self._obs(obs), state, starts.float())[1]

    def forward_sequences(self, obs: torch.Tensor, state: State, starts: torch.Tensor) -> ModuleForward:
        """A training pass over sequences: ``obs`` [T * B, ...] time-major (row t * B + b), ``state`` the
        initial state of the B sequences, ``starts`` [T, B]; outputs [T * B] in the same order."""
        T, B = starts.shape
        views = self._views(self.params.param)
        head, values, _ = self._call_seq(views, self._obs(obs).reshape(T, B, *obs.shape[1:]), state, starts.float())
        return ModuleForward(head.reshape(T * B, -1), values.reshape(T * B), views.get(LOG_STD))

    def forward_episodes(self, obs: torch.Tensor, offsets: np.ndarray) -> ModuleForward:
        """A training pass over whole episodes concatenated in ``obs`` [M, ...] (episode k is rows
        ``offsets[k]:offsets[k + 1]``), each run as one sequence from the initial state; outputs [M] in
        the same order. The sequences are padded to the longest, and the padding is never read back."""
        lengths = np.diff(offsets)
        count, longest = len(lengths), int(lengths.max())
        step = np.concatenate([np.arange(n) for n in lengths])
        episode = np.repeat(np.arange(count), lengths)
        padded = torch.zeros(longest, count, *obs.shape[1:], dtype=obs.dtype, device=obs.device)
        padded[torch.from_numpy(step), torch.from_numpy(episode)] = obs
        starts = torch.zeros(longest, count, device=self.device)
        starts[0] = 1.0
        fwd = self.forward_sequences(padded.reshape(longest * count, *obs.shape[1:]), self.initial_state(count), starts)
        rows = torch.from_numpy(step * count + episode).to(self.device)
        return ModuleForward(fwd.head[rows], fwd.values[rows], fwd.log_std)

    def act_step(
        self, obs: np.ndarray, noise: np.ndarray | None, state: State | None = None, starts: np.ndarray | None = None
    ) -> ActStep:
        assert state is not None and starts is not None, "a recurrent agent acts with its state and the episode starts"
        return ActStep(*self.act_state(obs, noise, state, starts))

    # The feed-forward entry points see single observations, without a state: a recurrent agent has none.
    def act(self, obs: np.ndarray, noise: np.ndarray | None) -> np.ndarray:
        raise TypeError("a recurrent agent acts with act_state(obs, noise, state, starts)")

    def act_recording(self, obs: np.ndarray, noise: np.ndarray | None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        raise TypeError("a recurrent agent acts with act_state(obs, noise, state, starts)")

    def values(self, obs: torch.Tensor) -> torch.Tensor:
        raise TypeError("a recurrent agent values sequences with sequence_values(obs, state, starts)")

    def log_prob(self, obs: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        raise TypeError("a recurrent agent records its behaviour log-probs while acting (act_state)")

    def forward_train(self, obs: torch.Tensor) -> ModuleForward:
        raise TypeError("a recurrent agent trains with forward_sequences(obs, state, starts)")


class StatefulPolicy:
    """Acting with a recurrent agent outside training (evaluation, videos, the API's ``predict``): keeps
    each environment's state and restarts it where an episode starts."""

    def __init__(self, agent: RecurrentAgent, n_envs: int):
        self.agent = agent
        self.n_envs = n_envs
        self.state = agent.initial_state(n_envs)

    def __call__(self, obs: np.ndarray, starts: np.ndarray, noise: np.ndarray | None = None) -> np.ndarray:
        actions, _, _, self.state = self.agent.act_state(obs, noise, self.state, starts)
        return actions


def sequence_minibatch_rows(T: int, N: int, envs: torch.Tensor) -> torch.Tensor:
    """Row indices (time-major, row t * N + n of a flattened [T, N] batch) of environments ``envs``'
    whole sequences, in the order ``forward_sequences`` reads them (t * len(envs) + j)."""
    return (torch.arange(T, device=envs.device)[:, None] * N + envs[None, :]).reshape(-1)


def state_to_numpy(state: State) -> dict[str, np.ndarray]:
    """A state as arrays keyed "0", "1", ... (how rollouts store it and messages carry it)."""
    return {str(i): s.detach().cpu().numpy() for i, s in enumerate(state)}


def state_from_numpy(state: dict[str, Any], device: torch.device) -> State:
    return tuple(torch.as_tensor(np.asarray(state[str(i)])).to(device) for i in range(len(state)))
