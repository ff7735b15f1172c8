"""The model every algorithm's Python API shares: build, learn, predict, evaluate, record, export, save and load.

:data:`MODELS` maps each algorithm to its class; the modules that define them (``algorithms``, ``offline``) add
theirs, and ``distrl.api`` imports them all before anything is loaded.
"""

from __future__ import annotations

import contextlib
import inspect
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from gymnasium import spaces

from distrl.config import ConfigError, RunConfig, split_by_config
from distrl.data.minari_store import write_dataset
from distrl.data.recorder import behaviour, record_episodes
from distrl.envs.evaluation import evaluate
from distrl.envs.masks import with_mask
from distrl.envs.names import env_kwargs_items, env_source, policy_name, refuse_named_code, wrapper_names
from distrl.envs.spaces import check_observation, start_flags
from distrl.envs.vector import make_run_env
from distrl.export import graph, writer
from distrl.export.writer import Export, Format
from distrl.run import checkpoint, trust
from distrl.run.logs import Console
from distrl.training import (
    EVAL_SEED_OFFSET,
    TrainerBase,
    configs_from_checkpoint,
    make_trainer,
)
from distrl.training.policy_names import (
    check_fits,
    encoder_for,
    policy_name_and_env,
    refuse_close_misses,
)
from distrl.training.precision import bf16_slow_note
from distrl.training.presets import algo_configs


class Model:
    """An algorithm trained in this process (``--strategy single``). Use :class:`PPO`, :class:`SAC` or :class:`DQN`.

    ``PPO(env, ...)``, or ``PPO(name, env, ...)`` with ``name`` one of :data:`POLICY_NAMES`: MlpPolicy flattens
    every observation into the MLPs (encoder='mlp'), CnnPolicy takes images through a CNN (the Nature CNN, a
    smaller one under 36x36) and MultiInputPolicy Dict observations, one encoder per key. A name that does not
    fit the env's observations is refused.

    Args:
        policy_or_env: the env, or one of :data:`POLICY_NAMES` with the env after it.
        env: Gymnasium id, short name, 'package.module:ClassName' or 'package.module:function'; or a
            ``gymnasium.Env`` (with a spec, e.g. from ``gym.make``: copies are made from its id and kwargs;
            without one: used itself, n_envs must be 1), or a function or class returning one (called once
            per env). Objects that cannot be named by id or 'module:qualname' work in this process only:
            pass them again to :meth:`load`.
        seed: seed for networks, sampling and environments.
        env_kwargs: constructor arguments of the env, a dict or "key=value" strings.
        wrappers: functions ``fn(env) -> env`` (or their 'package.module:function' names) applied in order
            to each env.
        policy: the network, as ``--policy`` takes it ('package.module:function'), or a ``torch.nn.Module``,
            a module class or a factory, called with (observation_space, action_space, config). It either
            returns ``(head, value)`` itself or has an integer ``features_dim`` and gets distrl's heads
            (see ``distrl.nets.module``; for SAC, ``distrl.nets.sac_module``). Default: distrl's networks.
            One of :data:`POLICY_NAMES` works here as before the env.
        preset: 'none' (library defaults, as stable-baselines3), 'auto' or a preset name.
        run_dir: where to write logs (Monitor CSV, TensorBoard); None writes nothing.
        **hyperparameters: any field of the algorithm's config (n_envs, learning_rate, ...)
            or of :class:`~distrl.config.RunConfig` (device, vec, quiet, ...).
    """

    algo = ""

    def __init__(
        self,
        policy_or_env: Any = None,
        env: Any = None,
        *,
        seed: int = 0,
        preset: str = "none",
        run_dir: str | Path | None = None,
        env_kwargs: Any = None,
        wrappers: Any = (),
        policy: Any = None,
        **hyperparameters: Any,
    ):
        name_given, env, policy = policy_name_and_env(policy_or_env, env, policy)
        run, params = split_by_config(hyperparameters, RunConfig)
        refuse_close_misses(self.algo, params, _OWN_KEYWORDS)
        run.setdefault("quiet", True)
        if policy is not None:
            run["policy"] = policy_name(policy)
        if name_given is not None:
            encoder_for(name_given, params)
        name, spec_kwargs = env_source(env)
        run.update(env_kwargs=spec_kwargs + env_kwargs_items(env_kwargs), wrappers=wrapper_names(wrappers))
        run_cfg, cfg, _ = algo_configs(self.algo, name, preset, {"seed": seed, **run}, params)
        if (note := bf16_slow_note(run_cfg)) is not None:
            warnings.warn(note, stacklevel=2)
        where = Path(run_dir) if run_dir else None
        with checkpoint.removed_after_a_mistake(where) if where else contextlib.nullcontext():
            self._trainer: TrainerBase = make_trainer(self.algo, run_cfg, cfg, run_dir=where)
            if name_given is not None:
                try:
                    check_fits(name_given, self._trainer)
                except ConfigError:
                    self._trainer.close()
                    raise

    @property
    def num_steps(self) -> int:
        """Environment steps trained so far."""
        return self._trainer.steps

    def learn(
        self, total_steps: int | None = None, progress_bar: bool = False, *, total_timesteps: int | None = None
    ) -> Model:
        """Train for ``total_steps`` more environment steps; schedules anneal over the run's total.

        ``total_timesteps`` is another name for ``total_steps``: pass one of them. ``progress_bar`` shows
        progress on stderr: a bar on a terminal, a line every few seconds otherwise. Logs go to the
        constructor's ``run_dir`` (monitor.csv, TensorBoard events, config.json, ``checkpoints/`` with
        ``checkpoint_every``); without one nothing is written.
        """
        if total_steps is not None and total_timesteps is not None:
            raise ConfigError(
                f"total_steps={total_steps} is not allowed with total_timesteps={total_timesteps}: they name the "
                "same number, pass one"
            )
        total_steps = total_steps if total_steps is not None else total_timesteps
        if total_steps is None:
            raise ConfigError("total_steps is missing: learn(total_steps) trains that many more environment steps")
        trainer = self._trainer
        target = trainer.steps + total_steps
        lent = Console(*trainer.progress_bound(target), quiet=False) if progress_bar else None
        own, trainer.console = trainer.console, lent or trainer.console
        try:
            trainer.train(total_steps=target)
        finally:
            if lent is not None:
                lent.close(trainer.progress_done())
            trainer.console = own
        return self

    @property
    def recurrent(self) -> bool:
        """Whether the policy carries a state through each episode (``core='lstm'|'gru'``)."""
        return False

    def _act(
        self,
        obs: np.ndarray,
        deterministic: bool,
        rng: np.random.Generator,
        state: Any = None,
        starts: np.ndarray | None = None,
    ) -> tuple[np.ndarray, Any]:
        """Env actions for a batch, and the next state of a recurrent policy (None otherwise)."""
        noise = None if deterministic else self._noise(rng, len(obs))
        return self._actions(obs, noise, state, starts)

    def _noise(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Sampling noise for ``n`` observations: what :meth:`_actions` turns into sampled actions."""
        raise NotImplementedError

    def _actions(
        self, obs: np.ndarray, noise: np.ndarray | None, state: Any = None, starts: np.ndarray | None = None
    ) -> tuple[np.ndarray, Any]:
        """Env actions for a batch of stored observations with the caller's noise (None: deterministic), and the
        next state of a recurrent policy (None otherwise)."""
        raise NotImplementedError

    def predict(
        self,
        observation: Any,
        state: Any = None,
        episode_start: Any = None,
        deterministic: bool = True,
        *,
        rng: np.random.Generator | None = None,
        action_mask: Any = None,
        action_masks: Any = None,
    ) -> tuple[Any, Any]:
        """``(action, state)`` for one observation, ``(actions, state)`` for a batch, whatever the policy:
        ``action, _ = model.predict(obs)``.

        Args:
            observation: as the env gives it (a vector or an image in its own shape and dtype, a Dict
                observation as a dict of such arrays), or a batch of them ([B, ...] per array). It is a
                batch when its shape is the observation space's with one more leading dimension.
            state: the state the previous call returned, for a recurrent policy (``core='lstm'|'gru'``):
                a tuple of arrays [layers, B, hidden]. None begins every episode now. A feed-forward
                policy ignores it and returns None.
            episode_start: one bool per environment (or one for a single observation), True where the
                observation begins an episode: the state restarts there.
            deterministic: the policy's mode (mean or most likely action) rather than a sample; True by
                default, as :meth:`evaluate` acts.
            rng: the generator samples are drawn from when ``deterministic=False``.
            action_mask: the legal actions (1), [n] or [B, n], for masks from ``info`` or ``action_masks()``
                (None: every action is legal); an observation that holds its mask needs none.
            action_masks: another name for ``action_mask``: pass one of them.
        """
        if action_masks is not None:
            if action_mask is not None:
                raise ConfigError("action_masks= is not allowed with action_mask=: they name the same mask, pass one")
            action_mask = action_masks
        observation = with_mask(
            observation, action_mask, self._trainer.env.single_observation_space, self._trainer.run.action_mask
        )
        check_observation(observation, self._trainer.env.single_observation_space)
        batch, single = self._trainer.stored_batch(observation)
        starts = None if episode_start is None else start_flags(episode_start, len(batch))
        actions, state = self._act(
            batch, deterministic, rng if rng is not None else np.random.default_rng(), state, starts
        )
        return (actions[0] if single else actions), state

    def _acting(self, deterministic: bool, rng: np.random.Generator) -> Callable[[np.ndarray, np.ndarray], np.ndarray]:
        """``act(obs, starts)`` for a batch of environments, carrying a recurrent policy's state from call to call."""
        state = None

        def act(obs: np.ndarray, starts: np.ndarray) -> np.ndarray:
            nonlocal state
            actions, state = self._act(obs, deterministic, rng, state, starts)
            return actions

        return act

    def evaluate(
        self, n_episodes: int = 10, deterministic: bool = True, seed: int | None = None
    ) -> tuple[float, float]:
        """Mean and std of the return over ``n_episodes`` episodes."""
        trainer = self._trainer
        env = make_run_env(trainer.run, n_episodes, trainer.env_id, evaluation=True)
        act = self._acting(deterministic, np.random.default_rng(seed))
        try:
            seed = trainer.run.seed + EVAL_SEED_OFFSET if seed is None else seed
            returns = evaluate(act, env, seed)
        finally:
            env.close()
        return float(returns.mean()), float(returns.std())

    def export(
        self,
        path: str | Path,
        format: Format = "onnx",
        stochastic: bool = False,
        observations: int = 256,
        seed: int | None = None,
    ) -> Export:
        """Write the acting policy as one ONNX or TorchScript graph at ``path``, checked against this model.

        The graph takes observations as the env gives them (a Dict one input per key) and returns the env's action:
        the run's observation normalisation, the network and the action's post-processing are inside it (see
        :mod:`distrl.export.graph`). ``stochastic`` adds a ``noise`` input the action is sampled from. Before the
        file takes its name, the graph (run with onnxruntime or TorchScript) and this model act on ``observations``
        observations of the run's evaluation env: identical choices, continuous actions within 1e-5, or
        :class:`~distrl.export.ExportFailed` and nothing written. ``PATH.json`` beside it describes it.
        """
        trainer = self._trainer
        n_envs = max(1, min(8, observations))
        env = make_run_env(trainer.run, n_envs, trainer.env_id, evaluation=True)
        about = {"algo": self.algo, "env": trainer.env_id, "steps": self.num_steps}
        try:
            return writer.write(
                self._graph(stochastic),
                Path(path),
                format,
                env,
                self._actions,
                self._noise,
                observations,
                trainer.run.seed + EVAL_SEED_OFFSET if seed is None else seed,
                about,
            )
        finally:
            env.close()

    def _graph(self, stochastic: bool) -> graph.ActingGraph:
        """The acting policy as a module for tracing (see :mod:`distrl.export.graph`)."""
        raise NotImplementedError

    def record(
        self,
        steps: int,
        deterministic: bool = True,
        epsilon: float = 0.0,
        random: bool = False,
        n_envs: int = 1,
        seed: int | None = None,
        stream: int = 0,
    ) -> list[dict[str, Any]]:
        """Whole episodes of this policy in the run's env, at least ``steps`` transitions, as an offline dataset
        stores them (see :func:`distrl.data.recorder.record_episodes`): its mode (``deterministic``), samples, or
        either mixed with uniformly random actions (``epsilon``); ``random`` plays uniformly random actions. The
        episodes start from ``seed`` (default: the run's evaluation seed) plus 1000 ``stream``: recordings of
        different streams differ."""
        trainer = self._trainer
        if steps <= 0:
            raise ConfigError(f"steps={steps} is not allowed: must be > 0")
        if not 0.0 <= epsilon <= 1.0:
            raise ConfigError(f"epsilon={epsilon} is not allowed: must be in [0, 1]")
        if not isinstance(trainer.env.single_observation_space, (spaces.Box, spaces.Discrete)):
            raise ConfigError(
                f"env={trainer.env_id!r} has {type(trainer.env.single_observation_space).__name__} observations: "
                "datasets are recorded from Box and Discrete observations"
            )
        seed = (trainer.run.seed + EVAL_SEED_OFFSET if seed is None else seed) + 1000 * stream
        env = make_run_env(trainer.run, n_envs, trainer.env_id, evaluation=True)
        # the policy's samples; the env's streams are keyed (seed, i, ...)
        act = self._acting(deterministic, np.random.default_rng([seed, 3]))
        try:
            return record_episodes(env, act, steps, seed, epsilon, random)
        finally:
            env.close()

    def collect(self, steps: int, dataset_id: str, datasets_dir: str | Path | None = None, **record: Any) -> Path:
        """Record at least ``steps`` transitions of whole episodes (``record``: :meth:`record`'s options) and write
        them as the Minari dataset ``dataset_id`` (under ``datasets_dir``, else ``MINARI_DATASETS_PATH``, else
        Minari's default); the dataset's path."""
        episodes = self.record(steps, **record)
        trainer = self._trainer
        return Path(
            write_dataset(
                dataset_id,
                episodes,
                trainer.env_id,
                trainer.env.single_observation_space,
                trainer.env.single_action_space,
                f"distrl {self.algo}",
                None if datasets_dir is None else str(datasets_dir),
                f"{sum(len(e['actions']) for e in episodes):,} steps of a distrl {self.algo} policy "
                f"({behaviour(**{k: v for k, v in record.items() if k in BEHAVIOUR})}), {self.num_steps:,} training steps",
            )
        )

    def player(self, deterministic: bool = True) -> Player:
        """A policy for one environment, step by step, carrying a recurrent policy's state (``reset()``
        when an episode begins); e.g. for recording videos."""
        return Player(self, deterministic)

    def save(self, path: str | Path) -> Path:
        """Write the model (weights, optimizer state, statistics, config) as a checkpoint directory."""
        return self._trainer.write_checkpoint(Path(path))

    @classmethod
    def load(
        cls,
        path: str | Path,
        device: str = "auto",
        env: Any = None,
        wrappers: Any = None,
        policy: Any = None,
        trust_code: bool = False,
        env_kwargs: Any = None,
        precision: str | None = None,
    ) -> Model:
        """Load a model saved by :meth:`save`, a checkpoint directory, or a run directory's newest intact checkpoint
        (a damaged newer one is skipped, saying so on stderr).

        ``precision`` replaces the run's (fp32 or bf16): an export is checked against the float32 policy.

        ``env``, ``wrappers``, ``policy`` and ``env_kwargs`` replace the run's (as in the constructor): needed
        when the model was trained on Python objects that exist only in the process that trained it.

        Loading never unpickles, and it imports none of the code the run's config names (a custom env's
        'package.module:Name', wrappers, a policy factory) unless ``trust_code=True`` or you pass that
        part again yourself: a run from someone else could name anything. Runs this user wrote on this
        machine, with their config as written, need neither (see :mod:`distrl.run.trust`).
        """
        path = checkpoint.newest_intact(Path(path))
        run_cfg, _, cfg, state = configs_from_checkpoint(path)
        if state["algo"] == "grpo":
            home = checkpoint.run_dir_of(path)
            raise ConfigError(
                f"checkpoint={str(path)!r} holds a grpo run, which acts on prompts, not in an env: its "
                "greedy reward is in summary.json, and a language model's weights are a transformers "
                f"directory in {str(home / 'pretrained') if home else 'RUN/pretrained'} "
                "(from_pretrained loads it)"
            )
        own: list[str] = []
        if env is not None:
            name, spec_kwargs = env_source(env)
            run_cfg = run_cfg.replace(env=name, env_kwargs=spec_kwargs or run_cfg.env_kwargs)
            own.append(name)
        if wrappers is not None:
            run_cfg = run_cfg.replace(wrappers=wrapper_names(wrappers))
            own.extend(run_cfg.wrappers)
        if policy is not None:
            run_cfg = run_cfg.replace(policy=policy_name(policy))
            own.append(run_cfg.policy)
        if env_kwargs is not None:
            run_cfg = run_cfg.replace(env_kwargs=env_kwargs_items(env_kwargs))
        refuse_named_code(run_cfg, f"checkpoint={str(path)!r}", trust_code or trust.is_trusted(path, state), own)
        algo = state["algo"]
        if cls is not Model and algo != cls.algo:
            raise ConfigError(f"checkpoint={str(path)!r} holds a {algo!r} model; load it with {algo.upper()}.load")
        model_cls = cls if cls is not Model else MODELS[algo]
        model = model_cls.__new__(model_cls)
        run_cfg = run_cfg.replace(device=device, quiet=True, precision=precision or run_cfg.precision)
        model._trainer = make_trainer(algo, run_cfg, cfg, run_dir=None)
        model._trainer.load_checkpoint(path)
        return model

    def untrained(self, seed: int | None = None) -> Model:
        """A model with the same configuration and freshly initialised weights."""
        trainer = self._trainer
        run = trainer.run if seed is None else trainer.run.replace(seed=seed)
        model = type(self).__new__(type(self))
        model._trainer = make_trainer(self.algo, run, trainer.cfg, run_dir=None)
        return model

    def close(self) -> None:
        self._trainer.close()


MODELS: dict[str, type[Model]] = {}
"""Each algorithm's model class, by name (filled by the modules that define them)."""


BEHAVIOUR = ("deterministic", "epsilon", "random")
"""The options of :meth:`Model.record` that say how actions were chosen."""


class Player:
    """One environment's policy, step by step: ``player(obs) -> action``; ``reset()`` before an episode."""

    def __init__(self, model: Model, deterministic: bool = True):
        self.model, self.deterministic = model, deterministic
        self.rng = np.random.default_rng()
        self.state: Any = None

    def reset(self) -> None:
        self.state = None

    def __call__(self, obs: Any) -> Any:
        action, self.state = self.model.predict(obs, self.state, deterministic=self.deterministic, rng=self.rng)
        return action


_OWN_KEYWORDS = [p.name for p in inspect.signature(Model).parameters.values() if p.kind is not p.VAR_KEYWORD]
"""The keywords a model's constructor takes itself, beside the configs' fields (for the close-miss check)."""
