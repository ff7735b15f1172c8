"""The acting policy of a run as one ``torch.nn.Module``: what ``distrl export`` traces into ONNX or TorchScript.

The graph does, with fixed weights and statistics, what acting does in distrl (``Model.predict``):

    observations → normalisation (the run's final statistics) → network → head outputs → action

Every input and output carries the batch on its axis 0 (axis 1 for a recurrent state, as torch's LSTM and GRU
keep theirs). Inputs, in order:

- the observation in distrl's stored form: float32 vectors, uint8 images (unscaled: the encoder scales them),
  int64 for a Discrete observation; a Dict observation is one input per key in key order, each in its own dtype
  and shape (packed rows would need a reinterpretation of bytes that neither ONNX nor TorchScript has);
- for a recurrent policy its state (one tensor for a GRU, two for an LSTM), then ``episode_start`` [B] float32,
  1.0 where the observation begins an episode (the state restarts there first);
- with ``stochastic``, ``noise``: uniforms [B] for a Discrete action, [B, parts] for MultiDiscrete, standard
  normals [B, A] for a Box; the sample is a function of it (inverse-CDF choices, mean + std * noise), as in
  distrl's own acting, so a caller owns the randomness.

Outputs: the env action [B, *action_shape] (int64 choices, offset by the space's start; float32 actions clipped,
or for SAC tanh-squashed and scaled, into the bounds), then the recurrent policy's next state.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

from distrl.config import ConfigError
from distrl.data.normalize import ObsNormalizer
from distrl.envs.masks import MASK_KEY, MaskReader, mask_logits
from distrl.envs.spaces import ActionSpec, DictLayout, action_spec, stored_layout
from distrl.nets.actor_critic import ActorCritic
from distrl.nets.agent import Agent
from distrl.nets.core import ParamBuffer
from distrl.nets.encoders import ActorCriticModule, DictEncoder, MLPHead
from distrl.nets.module import LOG_STD, ModuleAgent
from distrl.nets.recurrent import RecurrentActorCritic, RecurrentAgent
from distrl.nets.sac import LOG_STD_MAX, LOG_STD_MIN, SquashedGaussianActor
from distrl.nets.sac_module import ModuleSquashedActor, SACActorModule

BATCH = "batch"


@dataclass(frozen=True)
class Port:
    """One input or output of the graph: its name, shape (``"batch"`` where the batch goes) and dtype."""

    name: str
    shape: tuple[int | str, ...]
    dtype: str

    def example(self, batch: int) -> torch.Tensor:
        shape = [batch if d == BATCH else d for d in self.shape]
        if self.dtype == "uint8":
            return torch.randint(0, 256, shape, dtype=torch.uint8)
        if self.dtype.startswith("int"):
            return torch.zeros(shape, dtype=getattr(torch, self.dtype))
        return torch.rand(shape, dtype=getattr(torch, self.dtype))

    def as_json(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype}


def observation_ports(space: spaces.Space) -> list[Port]:
    """The graph's observation inputs: ``obs``, or ``obs.KEY`` for each key of a Dict (in key order)."""
    if isinstance(space, spaces.Dict):
        return [Port(f"obs.{p.key}", (BATCH, *p.shape), p.dtype.name) for p in DictLayout(space).parts]
    shape, dtype = stored_layout(space)
    return [Port("obs", (BATCH, *shape), dtype.name)]


def graph_observations(space: spaces.Space, stored: np.ndarray) -> list[np.ndarray]:
    """Stored observations [B, ...] (packed rows for a Dict) as the graph's observation inputs."""
    if isinstance(space, spaces.Dict):
        return list(DictLayout(space).unpack_numpy(stored).values())
    return [np.ascontiguousarray(stored, dtype=stored_layout(space)[1])]  # a float64 Box's vectors as float32


class Normalise(nn.Module):
    """``clip((x - mean) / std)`` with the run's final statistics, on the inputs acting normalises (the vector,
    or a Dict's float vector parts), each kept in its dtype."""

    def __init__(self, normalizer: ObsNormalizer, ports: list[Port]):
        super().__init__()
        mean, inv_std = (torch.from_numpy(np.array(a, dtype=np.float32)) for a in normalizer.affine())
        self.clip = float(normalizer.clip)
        self.targets: list[int] = []
        if normalizer.layout is None:
            self.targets.append(0)
            shape = [int(d) for d in ports[0].shape[1:]]
            self.register_buffer("mean_0", mean.reshape(shape))
            self.register_buffer("inv_std_0", inv_std.reshape(shape))
            return
        keys = [p.key for p in normalizer.layout.parts]
        offset = 0
        for part in normalizer.parts:
            size = math.prod(part.shape)
            i = keys.index(part.key)
            self.targets.append(i)
            self.register_buffer(f"mean_{i}", mean[offset : offset + size].reshape(part.shape))
            self.register_buffer(f"inv_std_{i}", inv_std[offset : offset + size].reshape(part.shape))
            offset += size

    def forward(self, obs: list[torch.Tensor]) -> list[torch.Tensor]:
        out = list(obs)
        for i in self.targets:
            x = obs[i]
            scaled = (x - getattr(self, f"mean_{i}")) * getattr(self, f"inv_std_{i}")
            out[i] = torch.clamp(scaled, -self.clip, self.clip).to(x.dtype)
        return out


def weighted_copy(module: nn.Module, params: ParamBuffer, names: list[str] | None = None) -> nn.Module:
    """A float32 CPU copy of ``module`` holding the weights of ``params`` (a module agent keeps its weights in
    the flat buffer, not in the module's own parameters), for inference only."""
    made = copy.deepcopy(module).to("cpu").float()
    with torch.no_grad():
        for name, p in made.named_parameters():
            p.copy_(params.view(name).detach().to("cpu"))
            p.requires_grad_(False)
    return made.eval()


def mlp_copy(params: ParamBuffer, prefix: str, sizes: tuple[int, ...], activation: str) -> MLPHead:
    """A closed-form MLP's weights (``x @ W + b``, W [in, out]) as ``nn.Linear`` layers."""
    net = MLPHead(sizes, activation)
    with torch.no_grad():
        for i, layer in enumerate(net.layers):
            layer.weight.copy_(params.view(f"{prefix}.{i}.weight").detach().cpu().t())
            layer.bias.copy_(params.view(f"{prefix}.{i}.bias").detach().cpu())
    return net.eval().requires_grad_(False)


class FlatBody(nn.Module):
    """A network on one observation input flattened to float32: the closed-form MLPs."""

    def __init__(self, net: nn.Module):
        super().__init__()
        self.net = net

    def forward(self, obs: list[torch.Tensor]) -> torch.Tensor:
        x = obs[0]
        return self.net(x.reshape(x.shape[0], -1).float())


class ModuleBody(nn.Module):
    """A module's policy output: the head of ``(head, value)``, or the whole output of a SAC actor module; a Dict
    observation goes to distrl's Dict encoder as its parts."""

    def __init__(self, module: nn.Module, keys: list[str] | None, sac: bool):
        super().__init__()
        self.module, self.keys, self.sac = module, keys, sac

    def forward(self, obs: list[torch.Tensor]) -> torch.Tensor:
        if self.keys is not None:
            features = self.module.encoder.encode(dict(zip(self.keys, obs)))
            return self.module.head(features) if self.sac else self.module.policy(features)
        out = self.module(obs[0])
        return out if self.sac else out[0]


class RecurrentBody(nn.Module):
    """One step of a recurrent policy: head outputs and the next state, the state restarted where an episode
    starts. distrl's own network is unrolled here (its encoder, core and policy head), a user's module is called
    with sequences of length 1 under its contract."""

    def __init__(self, module: nn.Module, keys: list[str] | None):
        super().__init__()
        self.module, self.keys = module, keys
        self.builtin = isinstance(module, RecurrentActorCritic)

    def forward(
        self, obs: list[torch.Tensor], state: list[torch.Tensor], start: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        if not self.builtin:
            (head, _), next_state = self.module(obs[0].unsqueeze(0), tuple(state), start.unsqueeze(0))
            return head[0], [s.float() for s in next_state]
        m = self.module
        features = m.encoder(obs[0]) if self.keys is None else m.encoder.encode(dict(zip(self.keys, obs)))
        keep = (1.0 - start).reshape(1, -1, 1)
        state = [s * keep for s in state]
        if m.core.kind == "lstm":
            out, (h, c) = m.core.rnn(features.unsqueeze(0), (state[0], state[1]))
            next_state = [h, c]
        else:
            out, h = m.core.rnn(features.unsqueeze(0), state[0])
            next_state = [h]
        return m.policy(out[0]), next_state


class ActionHead(nn.Module):
    """Head outputs to the env action: argmax or inverse-CDF choices, a Gaussian mean (plus std × noise) clipped
    to the bounds, or SAC's tanh-squashed action scaled to them."""

    def __init__(self, spec: ActionSpec, kind: str, log_std: torch.Tensor | None = None):
        super().__init__()
        self.kind, self.nvec, self.shape = kind, list(spec.nvec), list(spec.shape)
        self.register_buffer("start", torch.tensor(spec.start, dtype=torch.int64))
        if spec.low is not None and spec.high is not None:
            self.register_buffer("low", torch.from_numpy(spec.low.astype(np.float32)))
            self.register_buffer("high", torch.from_numpy(spec.high.astype(np.float32)))
        if log_std is not None:
            self.register_buffer("std", log_std.detach().cpu().float().exp())

    def forward(self, out: torch.Tensor, noise: torch.Tensor | None) -> torch.Tensor:
        if self.kind == "categorical":
            return _choose(out, noise)
        if self.kind == "multi_categorical":
            parts = torch.split(out, self.nvec, dim=-1)
            chosen = [_choose(p, None if noise is None else noise[:, j]) for j, p in enumerate(parts)]
            return (torch.stack(chosen, 1) + self.start).reshape([-1, *self.shape])
        if self.kind == "gaussian":
            action = out if noise is None else out + self.std * noise
            return torch.maximum(torch.minimum(action, self.high), self.low).reshape([-1, *self.shape])
        if self.kind == "bounded":  # an action in [-1, 1] already (the offline algorithms' policies)
            if noise is not None:  # IQL's Gaussian: a draw clipped to [-1, 1]
                out = torch.clamp(out + self.std * noise, -1.0, 1.0)
            return (self.low + 0.5 * (out + 1.0) * (self.high - self.low)).reshape([-1, *self.shape])
        half = out.shape[1] // 2
        mean = out[:, :half]
        if noise is not None:
            mean = mean + torch.clamp(out[:, half:], LOG_STD_MIN, LOG_STD_MAX).exp() * noise
        squashed = torch.tanh(mean)
        return (self.low + 0.5 * (squashed + 1.0) * (self.high - self.low)).reshape([-1, *self.shape])


def _choose(logits: torch.Tensor, uniform: torch.Tensor | None) -> torch.Tensor:
    """The argmax, or the inverse-CDF choice of ``uniform`` [B] (``nets.inverse_cdf_sample``'s arithmetic)."""
    if uniform is None:
        return logits.argmax(-1)
    cdf = torch.exp(logits - logits.max(-1, keepdim=True).values).cumsum(-1)
    chosen = (uniform.unsqueeze(-1) * cdf[:, -1:] >= cdf).to(torch.int64).sum(-1)
    return torch.minimum(chosen, torch.tensor(logits.shape[-1] - 1, dtype=torch.int64))


class MaskedBody(nn.Module):
    """A body whose head outputs (logits, Q-values) are masked by the observation's ``action_mask`` input, as the
    agent masks them in training (:mod:`distrl.envs.masks`)."""

    def __init__(self, body: nn.Module, index: int):
        super().__init__()
        self.body, self.index = body, index

    def forward(self, obs: list[torch.Tensor], *rest: Any) -> Any:
        out = self.body(obs, *rest)
        if isinstance(out, tuple):
            return (mask_logits(out[0], obs[self.index]), *out[1:])
        return mask_logits(out, obs[self.index])


def masked(body: nn.Module, observation_space: spaces.Space, masks: MaskReader | None) -> nn.Module:
    """``body`` masked by its ``action_mask`` input where the network masks (``masks`` is not None)."""
    if masks is None:
        return body
    keys = [p.key for p in DictLayout(observation_space).parts]
    return MaskedBody(body, keys.index(MASK_KEY))


class ActingGraph(nn.Module):
    """observations (+ state, episode_start) (+ noise) → action (+ next state); see the module docstring."""

    def __init__(
        self,
        inputs: list[Port],
        outputs: list[Port],
        body: nn.Module,
        head: ActionHead,
        normalise: Normalise | None,
        n_obs: int,
        n_state: int,
        stochastic: bool,
    ):
        super().__init__()
        self.inputs, self.outputs = inputs, outputs
        self.body, self.head, self.normalise = body, head, normalise
        self.n_obs, self.n_state, self.stochastic = n_obs, n_state, stochastic

    def forward(self, *args: torch.Tensor) -> torch.Tensor | tuple[torch.Tensor, ...]:
        obs = list(args[: self.n_obs])
        if self.normalise is not None:
            obs = self.normalise(obs)
        noise = args[-1] if self.stochastic else None
        if not self.n_state:
            return self.head(self.body(obs), noise)
        state = list(args[self.n_obs : self.n_obs + self.n_state])
        out, next_state = self.body(obs, state, args[self.n_obs + self.n_state])
        return (self.head(out, noise), *next_state)

    def examples(self, batch: int = 2) -> tuple[torch.Tensor, ...]:
        """Inputs of ``batch`` rows to trace the graph with (values do not matter; shapes and dtypes do)."""
        return tuple(port.example(batch) for port in self.inputs)


def action_port(spec: ActionSpec) -> Port:
    dtype = "float32" if spec.kind == "gaussian" else "int64"
    return Port("action", (BATCH, *spec.shape) if spec.kind != "categorical" else (BATCH,), dtype)


def noise_port(spec: ActionSpec, sac: bool) -> Port:
    return Port("noise", (BATCH, *spec.noise_shape) if not sac else (BATCH, spec.action_dim), "float32")


def dict_keys(observation_space: spaces.Space, module: nn.Module, expected: type) -> list[str] | None:
    """The keys a Dict observation's inputs go to distrl's Dict encoder under; None for other observations."""
    if not isinstance(observation_space, spaces.Dict):
        return None
    if not (isinstance(module, expected) and isinstance(module.encoder, DictEncoder)):
        raise ConfigError(
            f"policy={type(module).__name__} cannot be exported for a Dict observation: it reads packed rows, "
            "whose bytes neither ONNX nor TorchScript can reinterpret; an exported graph takes one input per key, "
            "which distrl's Dict encoder reads (a policy factory with features_dim on distrl's encoder)"
        )
    return [p.key for p in DictLayout(observation_space).parts]


def policy_graph(
    agent: Agent, observation_space: spaces.Space, normalizer: ObsNormalizer | None, stochastic: bool
) -> ActingGraph:
    """The graph of a PPO or REINFORCE agent (closed-form, module or recurrent) and its normaliser."""
    spec = agent.spec
    obs_ports = observation_ports(observation_space)
    log_std: torch.Tensor | None = None
    state_ports: list[Port] = []
    body: nn.Module
    if isinstance(agent, ActorCritic):
        body = FlatBody(mlp_copy(agent.params, "policy", agent.policy.sizes, agent.policy.activation))
        log_std = None if agent.discrete else agent.params.view("policy.log_std")
    elif isinstance(agent, RecurrentAgent):
        module = weighted_copy(agent.module, agent.params)
        expected = RecurrentActorCritic
        keys = dict_keys(observation_space, module, expected)
        body = RecurrentBody(module, keys)
        state_ports = [
            Port(f"state.{i}", (s.shape[0], BATCH, *s.shape[2:]), "float32")
            for i, s in enumerate(agent.initial_state(1))
        ]
        log_std = None if agent.discrete else agent.params.view(LOG_STD)
    elif isinstance(agent, ModuleAgent):
        module = weighted_copy(agent.module, agent.params)
        body = ModuleBody(module, dict_keys(observation_space, module, ActorCriticModule), sac=False)
        log_std = None if agent.discrete else agent.params.view(LOG_STD)
    else:
        raise ConfigError(f"agent={type(agent).__name__} cannot be exported")
    if isinstance(agent, ModuleAgent):
        body = masked(body, observation_space, agent.masks)
    inputs = obs_ports + state_ports
    if state_ports:
        inputs.append(Port("episode_start", (BATCH,), "float32"))
    if stochastic:
        inputs.append(noise_port(spec, sac=False))
    outputs = [action_port(spec), *(Port(f"next_{p.name}", p.shape, p.dtype) for p in state_ports)]
    normalise = Normalise(normalizer, obs_ports) if normalizer is not None and normalizer.enabled else None
    head = ActionHead(spec, spec.kind, log_std)
    return ActingGraph(inputs, outputs, body, head, normalise, len(obs_ports), len(state_ports), stochastic)


def sac_graph(
    actor: SquashedGaussianActor | ModuleSquashedActor,
    observation_space: spaces.Space,
    action_space: spaces.Box,
    stochastic: bool,
) -> ActingGraph:
    """The graph of a SAC actor: tanh(mean), or tanh(mean + std × noise), scaled to the action bounds."""
    spec = action_spec(action_space)
    obs_ports = observation_ports(observation_space)
    body: nn.Module
    if isinstance(actor, SquashedGaussianActor):
        body = FlatBody(mlp_copy(actor.params, "actor", actor.net.sizes, actor.net.activation))
    else:
        module = weighted_copy(actor.module, actor.params)
        body = ModuleBody(module, dict_keys(observation_space, module, SACActorModule), sac=True)
    inputs = obs_ports + ([noise_port(spec, sac=True)] if stochastic else [])
    head = ActionHead(spec, "squashed")
    return ActingGraph(inputs, [action_port(spec)], body, head, None, len(obs_ports), 0, stochastic)
