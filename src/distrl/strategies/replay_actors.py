"""What runs in Ray actors under ``actor-learner`` for dqn and sac: distributed prioritised replay (Ape-X, Horgan
et al. 2018, arXiv:1803.00933). The learner's side is :mod:`distrl.strategies.apex`.

N actors (Ray actors) step their own environments with their own exploration (DQN's actor ``i`` of ``N``
explores with ``eps^(1 + alpha i / (N - 1))``, the paper's eps 0.4 and alpha 7; SAC's samples its policy with noise
streams of its own), compute initial priorities with their copy of the Q network, and push what they collected
into the replay a :class:`ReplayHolder` actor holds: the same replay class a single process trains from. The
learner (this process, :func:`~distrl.training.replay_learner.learn_from_actors`) samples it, trains, sends the
new priorities back and publishes its weights; an actor picks up the newest version between pushes. Every
transition keeps the policy version that collected it, so the lag of what the learner trains on is measured.

Each actor has two requests queued (one collecting, the next waiting), so it never waits for the learner;
a request is :data:`PUSH_STEPS` vector steps. An actor that dies or raises is replaced (``max_worker_restarts``);
the replay holder's loss ends the run with a line naming it: its learner's last checkpoint (and, with
``--save-replay``, the replay saved in it) is where ``--resume`` goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from distrl.config import RunConfig
from distrl.data.wire import pack, unpack
from distrl.envs.masks import random_actions
from distrl.strategies.actor_learner import WorkerError
from distrl.strategies.actors import as_array, placement

PUSH_STEPS = 64
"""Vector steps an actor collects between pushes: one push, and one round trip to the holder, per 64 steps."""

APEX_EPS, APEX_ALPHA = 0.4, 7.0
"""Ape-X's per-actor exploration: actor i of N acts epsilon-greedily with eps^(1 + alpha i / (N - 1))."""


def actor_epsilon(i: int, n: int, eps: float = APEX_EPS, alpha: float = APEX_ALPHA) -> float:
    """Actor ``i``'s epsilon of ``n`` actors (a lone actor takes ``eps``)."""
    return eps ** (1.0 + alpha * i / (n - 1)) if n > 1 else eps


class ReplayHolderLost(WorkerError):
    """The Ray actor holding the shared replay died or failed; the message names it and says how to go on."""


@dataclass(frozen=True)
class ActorSpec:
    """What a replay actor builds its environments and policy copy from."""

    algo: str
    run: RunConfig
    cfg: Any
    actor_id: int
    n_actors: int
    timeout_s: float
    """Longest wait for the replay holder to take a push."""


class ReplayHolder:
    """Runs in a Ray actor: the replay a single process would keep (DQN's ``make_replay``, SAC's buffers), filled
    by every actor, sampled by the learner, with the policy version of every row beside it."""

    def __init__(self, recipe: Callable[[], Any], seed: int):
        """``recipe`` makes the replay (the trainer's ``replay_recipe``: DQN's ``make_replay`` or SAC's with their
        arguments bound)."""
        import torch

        from distrl.data.prioritized import PrioritizedReplay

        torch.set_num_threads(1)
        self.replay = recipe()
        self.prioritized = isinstance(self.replay, PrioritizedReplay)
        self.versions = np.zeros(self.replay.capacity, dtype=np.int64)
        self.rng = np.random.default_rng([seed, 0xA9E])

    def where(self) -> dict[str, Any]:
        return placement()

    def insert(self, message: bytes) -> int:
        """Add an actor's push (see :meth:`ReplayActor.collect`); returns the transitions added."""
        data = unpack(message)
        priorities = data.get("priorities")
        extra = {"discounts": data["discounts"]} if "discounts" in data else {}
        columns = [data[k] for k in ("obs", "actions", "rewards", "next_obs", "terminated", "valid")]
        added = 0
        # one vector step at a time: the compact buffer reuses each env's last observation row
        for t in range(len(data["valid"])):
            step = [c[t] for c in columns]
            n = int(step[-1].sum())
            more = {k: v[t] for k, v in extra.items()}
            if self.prioritized and priorities is not None:
                more["priorities"] = priorities[added : added + n]
            rows = self.replay.add(*step, env_ids=data["env_ids"], **more)
            self.versions[rows[:n]] = int(data["version"])
            added += n
        return added

    def sample(self, n: int, batch_size: int, beta: float) -> bytes:
        """``n`` batches, stacked [n, batch_size, ...], with their rows, importance weights and versions."""
        batches = [self.replay.sample(batch_size, self.rng, "cpu", beta) for _ in range(n)]
        fields: dict[str, Any] = {}
        for f in ("obs", "actions", "rewards", "next_obs", "terminated", "discounts", "weights"):
            if getattr(batches[0], f) is not None:
                fields[f] = np.stack([getattr(b, f).numpy() for b in batches])
        rows = np.stack([b.rows for b in batches])
        return pack({**fields, "rows": rows, "versions": self.versions[rows]})

    def update_priorities(self, message: bytes) -> None:
        data = unpack(message)
        self.replay.update_priorities(data["rows"], data["errors"])

    def save(self, path: str) -> None:
        self.replay.save(Path(path))

    def load(self, path: str) -> int:
        """Restore the replay a checkpoint kept; returns how many transitions it holds."""
        self.replay.load(Path(path))
        return int(self.replay.size)


class ReplayActor:
    """Runs in a Ray actor: environments, a copy of the acting network, its exploration, and pushes to the holder."""

    def __init__(self, spec: ActorSpec, holder: Any):
        import torch

        from distrl.envs.spaces import stored_layout
        from distrl.envs.vector import make_run_env
        from distrl.training.state import set_cpu_options

        set_cpu_options(spec.run)
        self.spec, self.holder = spec, holder
        run, cfg = spec.run, spec.cfg
        self.env = make_run_env(run, cfg.n_envs)
        self.obs_dtype = stored_layout(self.env.single_observation_space)[1]
        self.env_ids = spec.actor_id * cfg.n_envs + np.arange(cfg.n_envs)
        space = self.env.single_action_space
        cpu = torch.device("cpu")
        build = (self.env.single_observation_space, space, cfg, cpu, run.seed, run.policy, run.precision)
        self.nstep = None
        self.priorities = None
        if spec.algo == "dqn":
            from distrl.algos.dqn import DQNAlgo
            from distrl.algos.nstep import NStepAccumulator
            from distrl.nets.factory import make_q_network

            self.q = make_q_network(*build, run.network_mask)
            self.q_copy = make_q_network(
                *build, run.network_mask
            )  # the actor's target for initial priorities: its own Q network
            self.priorities = DQNAlgo(cfg, self.q, self.q_copy, cpu) if cfg.prioritized_replay else None
            self.params = [self.q.params, self.q_copy.params]
            self.epsilon = actor_epsilon(spec.actor_id, spec.n_actors)
            self.n_actions, self.start = int(space.n), int(space.start)
            if cfg.n_steps > 1:
                self.nstep = NStepAccumulator(cfg.n_envs, cfg.n_steps, cfg.gamma)
        else:
            from distrl.nets.factory import make_sac_networks

            self.actor = make_sac_networks(*build).actor
            self.params = [self.actor.params]
            self.low, self.high = space.low.astype(np.float32), space.high.astype(np.float32)
            self.action_dim = int(np.prod(space.shape))
        self.version = 0
        self.reset(run.seed, 0)

    def where(self) -> dict[str, Any]:
        return placement()

    def reset(self, seed: int, segment: int) -> None:
        """New episodes; exploration streams keyed by (seed, global env index, segment)."""
        self.obs = self.env.reset(seed=seed + 1_000 * segment + int(self.env_ids[0])).astype(self.obs_dtype)
        self.rngs = [np.random.default_rng([seed, int(i), segment, 0xA9E]) for i in self.env_ids]
        if self.nstep is not None:
            self.nstep = type(self.nstep)(len(self.env_ids), self.nstep.n, self.nstep.gamma)

    def _load(self, payload: dict[str, Any]) -> None:
        import torch

        self.version = int(payload["version"])
        if "params" in payload:
            flat = torch.from_numpy(as_array(payload["params"]))
            for params in self.params:
                params.data.copy_(flat)
            if self.spec.algo != "dqn":
                self.actor.refresh_acting_copy()

    def _act(self, uniform: bool) -> tuple[np.ndarray, np.ndarray]:
        """(what is stored, what the env gets) for this step."""
        if self.spec.algo == "dqn":
            coins = np.array([rng.random() for rng in self.rngs])
            randoms = random_actions(self.rngs, self.n_actions, self.q.legal(self.obs))
            explore = np.ones(len(coins), bool) if uniform else coins < self.epsilon
            actions = randoms if explore.all() else np.where(explore, randoms, self.q.act(self.obs))
            return actions, actions + self.start
        shape = (self.action_dim,)
        if uniform:
            actions = np.stack([rng.uniform(-1.0, 1.0, shape) for rng in self.rngs]).astype(np.float32)
        else:
            noise = np.stack([rng.standard_normal(shape, dtype=np.float32) for rng in self.rngs])
            actions = self.actor.act(self.obs, noise)
        return actions, self.low + 0.5 * (actions + 1.0) * (self.high - self.low)

    def collect(self, payload: dict[str, Any], steps: int) -> dict[str, Any]:
        """Load the weights in ``payload`` (if any), collect ``steps`` vector steps, push them to the holder and
        return a receipt: env steps, finished episodes, transitions added, the version that collected them."""
        self._load(payload)
        start = time.perf_counter()
        steps_out: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "actions", "rewards", "next_obs")}
        steps_out.update(terminated=[], valid=[])
        returns: list[float] = []
        lengths: list[int] = []
        chunks = []
        for _ in range(steps):
            stored, env_action = self._act(bool(payload["uniform"]))
            step = self.env.step(env_action)
            next_obs = step.obs.astype(self.obs_dtype)
            if self.nstep is None:
                for key, value in zip(
                    steps_out, (self.obs, stored, step.reward, next_obs, step.terminated, step.valid)
                ):
                    steps_out[key].append(np.asarray(value))
            else:
                chunks.append(
                    self.nstep.add(self.obs, stored, step.reward, next_obs, step.terminated, step.truncated, step.valid)
                )
            self.obs = next_obs
            returns += step.episode_returns.tolist()
            lengths += step.episode_lengths.tolist()
        message = self._message(steps_out, chunks)
        try:
            import ray

            added = ray.get(self.holder.insert.remote(pack(message)), timeout=self.spec.timeout_s)
        except Exception as exc:  # noqa: BLE001 - the holder's loss is reported by the learner, naming it
            return {"replay_lost": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc) else ''}"}
        return {
            "steps": steps * len(self.env_ids),
            "returns": returns,
            "lengths": lengths,
            "added": int(added),
            "version": self.version,
            "collect_s": time.perf_counter() - start,
            "replay_lost": "",
        }

    def _message(self, steps_out: dict[str, list[np.ndarray]], chunks: list[Any]) -> dict[str, Any]:
        """The push: one-step transitions as [T, n_envs, ...] vector steps; n-step ones as [1, m, ...]."""
        if self.nstep is None:
            message: dict[str, Any] = {k: np.stack(v) for k, v in steps_out.items()}
            message["terminated"] = message["terminated"].astype(np.float32)
            env_ids = self.env_ids
        else:
            names = ("obs", "actions", "returns", "next_obs", "terminated", "discounts")
            joined = {k: np.concatenate([getattr(c, k) for c in chunks]) for k in names}
            m = len(joined["returns"])
            message = {k if k != "returns" else "rewards": v[None] for k, v in joined.items()}
            message["valid"] = np.ones((1, m), dtype=bool)
            env_ids = np.arange(m)  # distinct rows of the full buffer (n-step runs never keep observations once)
        message.update(env_ids=env_ids, version=self.version)
        if self.priorities is not None:
            message["priorities"] = self._priorities(message)
        return message

    def _priorities(self, message: dict[str, Any]) -> np.ndarray:
        """|TD error| of every valid transition of the push, in order, under this actor's weights."""
        import torch

        from distrl.data.replay import Transitions

        valid = message["valid"]
        pick = {k: torch.from_numpy(np.ascontiguousarray(message[k][valid])) for k in ("obs", "actions", "rewards")}
        batch = Transitions(
            obs=pick["obs"],
            actions=pick["actions"],
            rewards=pick["rewards"],
            next_obs=torch.from_numpy(np.ascontiguousarray(message["next_obs"][valid])),
            terminated=torch.from_numpy(np.ascontiguousarray(message["terminated"][valid])),
            discounts=torch.from_numpy(message["discounts"][valid]) if "discounts" in message else None,
        )
        assert self.priorities is not None
        return self.priorities.td_errors(batch)
