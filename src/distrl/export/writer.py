"""Writing an export: trace the acting graph (:mod:`distrl.export.graph`) to ONNX or TorchScript, run the written
file on the run's observations, compare it with distrl's policy, and keep it only when they agree."""

from __future__ import annotations

import contextlib
import io
import os
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from gymnasium import spaces

from distrl._version import __version__
from distrl.config import ConfigError
from distrl.envs.vector import VecEnv
from distrl.export import ExportFailed
from distrl.export.graph import ActingGraph, graph_observations
from distrl.export.offline_graph import StandardisedBody
from distrl.run.logs import write_json_atomic

Format = Literal["onnx", "torchscript"]
SUFFIX: dict[str, str] = {"onnx": ".onnx", "torchscript": ".pt"}
TOLERANCE = 1e-5
"""The largest difference allowed between a continuous action of the graph and of distrl's policy."""
ONNX_OPSET = 17

Reference = Callable[[np.ndarray, np.ndarray | None, Any, np.ndarray], tuple[np.ndarray, Any]]
"""distrl's acting: (stored observations [B, ...], noise or None, state or None, episode starts [B]) ->
(env actions, next state)."""


@dataclass(frozen=True)
class Check:
    """How the written graph compared with distrl's policy."""

    observations: int
    """Observations both acted on."""
    mismatched: int
    """Observations whose actions differed (beyond :data:`TOLERANCE` for continuous actions)."""
    max_abs_diff: float
    """The largest difference between the two actions (0 for identical choices)."""
    discrete: bool
    seconds: float

    def line(self) -> str:
        agree = (
            f"identical actions on {self.observations - self.mismatched} of {self.observations} observations"
            if self.discrete
            else f"{self.observations - self.mismatched} of {self.observations} actions within {TOLERANCE:g} "
            f"(largest difference {self.max_abs_diff:.2e})"
        )
        return f"check: {agree}, against distrl's policy on the run's environment ({self.seconds:.1f}s)"


@dataclass(frozen=True)
class Export:
    """A written export: the graph's file, its metadata file and its check."""

    path: Path
    metadata: Path
    check: Check


def default_path(run_dir: Path, fmt: Format, stochastic: bool) -> Path:
    """``RUN/export/policy.onnx`` (``policy.pt`` for TorchScript; ``policy-stochastic.*`` with noise)."""
    return run_dir / "export" / f"policy{'-stochastic' if stochastic else ''}{SUFFIX[fmt]}"


def write(
    graph: ActingGraph,
    path: Path,
    fmt: Format,
    env: VecEnv,
    reference: Reference,
    noise: Callable[[np.random.Generator, int], np.ndarray],
    observations: int,
    seed: int,
    about: dict[str, Any],
) -> Export:
    """Trace ``graph`` into ``path``, check it against ``reference`` on ``observations`` observations of ``env``
    (reset with ``seed``), and write its metadata; ``about`` (algo, env, run, steps) goes into the metadata.

    Raises ExportFailed, leaving nothing behind, when the graph's actions differ from the reference's.
    """
    if fmt not in SUFFIX:
        raise ConfigError(f"format={fmt!r} is not allowed: must be onnx or torchscript")
    if fmt == "onnx":
        _require_onnx()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        try:
            _trace(graph, tmp, fmt)
        except Exception as exc:  # noqa: BLE001 - the exporters raise many kinds, on the user's module's operations
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            other = "torchscript" if fmt == "onnx" else "onnx"
            raise ExportFailed(
                f"the policy could not be traced to {fmt} ({type(exc).__name__}: {reason}); nothing was written to "
                f"{path}; --format {other} may take it, --debug shows the traceback"
            ) from exc
        check = _check(_runner(tmp, fmt, graph), graph, env, reference, noise, observations, seed)
        if check.mismatched:
            raise ExportFailed(
                f"the exported graph differs from the policy on {check.mismatched} of {check.observations} "
                f"observations (largest difference {check.max_abs_diff:.3g}); nothing was written to {path}"
            )
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    metadata = path.with_name(path.name + ".json")
    write_json_atomic(metadata, _metadata(graph, fmt, env, check, about))
    return Export(path, metadata, check)


def _trace(graph: ActingGraph, path: Path, fmt: Format) -> None:
    examples = graph.examples()
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")  # tracing's notes on Python values made constants: the check runs other batches
        if fmt == "torchscript":
            traced = torch.jit.trace(graph, examples, check_trace=False)
            torch.jit.save(traced, str(path))
            return
        dynamic = {
            port.name: {axis: "batch" for axis, d in enumerate(port.shape) if d == "batch"}
            for port in (*graph.inputs, *graph.outputs)
        }
        torch.onnx.export(
            graph,
            examples,
            str(path),
            input_names=[p.name for p in graph.inputs],
            output_names=[p.name for p in graph.outputs],
            dynamic_axes=dynamic,
            opset_version=ONNX_OPSET,
            dynamo=False,  # the TorchScript-based exporter: one step, a fraction of a second for these graphs
        )


def _require_onnx() -> None:
    """One line naming the extra, before anything is traced, when the ONNX exporter or runtime is missing."""
    import importlib.util

    missing = [name for name in ("onnx", "onnxruntime") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"format='onnx' needs {' and '.join(missing)}, which is not installed: pip install 'distrl[export]'"
        )


def _runner(path: Path, fmt: Format, graph: ActingGraph) -> Callable[[list[np.ndarray]], list[np.ndarray]]:
    """The written file, loaded as a deployment would load it: onnxruntime, or ``torch.jit.load``."""
    if fmt == "onnx":
        import onnxruntime

        session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        names = [p.name for p in graph.inputs]
        return lambda inputs: session.run(None, dict(zip(names, inputs)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # torch 2.10+ says torch.export; TorchScript still loads
        module = torch.jit.load(str(path))

    def run(inputs: list[np.ndarray]) -> list[np.ndarray]:
        with torch.no_grad():
            out = module(*(torch.from_numpy(x) for x in inputs))
        return [t.numpy() for t in (out if isinstance(out, tuple) else (out,))]

    return run


def _check(
    run: Callable[[list[np.ndarray]], list[np.ndarray]],
    graph: ActingGraph,
    env: VecEnv,
    reference: Reference,
    noise: Callable[[np.random.Generator, int], np.ndarray],
    observations: int,
    seed: int,
) -> Check:
    """Step ``env`` with the reference policy; at every step both act on the same observations (with the same
    noise, and each carrying its own recurrent state)."""
    start = time.perf_counter()
    space = env.single_observation_space
    rng = np.random.default_rng(seed)
    obs, starts = env.reset(seed=seed), np.ones(env.n_envs, dtype=bool)
    state: Any = None
    graph_state = [np.zeros([env.n_envs if d == "batch" else d for d in p.shape], np.float32) for p in _states(graph)]
    seen = mismatched = 0
    worst = 0.0
    discrete = graph.outputs[0].dtype == "int64"
    while seen < observations:
        drawn = noise(rng, env.n_envs) if graph.stochastic else None
        actions, state = reference(obs, drawn, state, starts)
        inputs = graph_observations(space, obs)
        if graph_state:
            inputs += [*graph_state, starts.astype(np.float32)]
        if drawn is not None:
            inputs.append(np.ascontiguousarray(drawn, dtype=np.float32))
        out = _run_batch(run, graph, inputs)
        if not seen:  # one row alone too: a third batch size, beside the tracing's and the environments'
            alone = _run_batch(run, graph, [_first_row(x, port.shape) for x, port in zip(inputs, graph.inputs)])
            if not np.array_equal(alone[0], out[0][:1]) and not np.allclose(
                alone[0], out[0][:1], rtol=0, atol=TOLERANCE
            ):
                mismatched += 1
        exported, graph_state = out[0], list(out[1:])
        expected = np.asarray(actions).reshape(exported.shape)
        diff = np.abs(exported.astype(np.float64) - expected.astype(np.float64)).reshape(len(exported), -1).max(1)
        worst = max(worst, float(diff.max()))
        mismatched += int((diff > (0 if discrete else TOLERANCE)).sum())
        seen += env.n_envs
        step = env.step(actions)
        obs, starts = step.obs, ~step.valid
    return Check(seen, mismatched, worst, discrete, time.perf_counter() - start)


def _run_batch(
    run: Callable[[list[np.ndarray]], list[np.ndarray]], graph: ActingGraph, inputs: list[np.ndarray]
) -> list[np.ndarray]:
    """The graph's outputs; a graph that fails on a batch of another size than it was traced with is a failed
    check, with what usually causes it."""
    try:
        return run(inputs)
    except Exception as exc:  # noqa: BLE001 - onnxruntime and TorchScript raise their own kinds
        rows = len(inputs[0])
        reason = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise ExportFailed(
            f"the exported graph fails on a batch of {rows} after being traced with a batch of "
            f"{len(graph.examples()[0])} ({reason}): a module that takes the batch size as a Python number "
            "(len(obs), int(obs.shape[0])) is traced with it as a constant; use obs.shape[0] or reshape(-1, ...) "
            "in the module's forward"
        ) from None


def _first_row(x: np.ndarray, shape: tuple[int | str, ...]) -> np.ndarray:
    """The first row of an input, along its batch axis."""
    axis = shape.index("batch")
    return np.ascontiguousarray(np.take(x, [0], axis=axis))


def _states(graph: ActingGraph) -> list[Any]:
    return [p for p in graph.inputs if p.name.startswith("state.")]


def describe_space(space: spaces.Space) -> dict[str, Any]:
    """A space as JSON: its type, shape and dtype, and its bounds (their range, where they are many)."""
    if isinstance(space, spaces.Dict):
        return {"type": "Dict", "spaces": {str(k): describe_space(s) for k, s in space.spaces.items()}}
    if isinstance(space, spaces.Discrete):
        return {"type": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"type": "MultiDiscrete", "nvec": np.asarray(space.nvec).tolist(), "start": space.start.tolist()}
    if isinstance(space, spaces.MultiBinary):
        return {"type": "MultiBinary", "n": np.asarray(space.n).tolist()}
    assert isinstance(space, spaces.Box)
    described: dict[str, Any] = {"type": "Box", "shape": list(space.shape), "dtype": np.dtype(space.dtype).name}
    if space.low.size <= 64:
        described.update(low=_bounds(space.low), high=_bounds(space.high))
    else:
        described.update(low_min=_bounds(space.low.min()), high_max=_bounds(space.high.max()))
    return described


def _bounds(values: np.ndarray) -> Any:
    """Bounds as strict JSON: infinite ones as the strings "inf" and "-inf"."""
    listed = np.asarray(values, dtype=np.float64).tolist()
    if isinstance(listed, list):
        return [_bounds(v) for v in listed]
    return listed if np.isfinite(listed) else ("inf" if listed > 0 else "-inf")


ACTIONS = {
    "categorical": (
        "the argmax of the logits",
        "the inverse-CDF choice of softmax(logits) at noise (uniform in [0, 1))",
    ),
    "multi_categorical": (
        "the argmax of each part's logits, plus the space's start",
        "each part's inverse-CDF choice at its noise (uniform in [0, 1)), plus the space's start",
    ),
    "gaussian": (
        "the Gaussian mean, clipped to the bounds",
        "mean + std * noise (standard normal), clipped to the bounds",
    ),
    "squashed": (
        "tanh(mean) scaled to the bounds",
        "tanh(mean + std * noise) (noise standard normal) scaled to the bounds",
    ),
    "greedy": ("the argmax of the Q values (ties to the lowest index), plus the space's start", ""),
    "bounded": ("the policy's action in [-1, 1] (its tanh output) scaled to the bounds", ""),
}
"""What the graph makes of its head outputs, for the metadata: (deterministic, with noise) by action kind."""


def _normalisation(graph: ActingGraph) -> str:
    if graph.normalise is not None:
        return "clip((obs - mean) / std) with the run's final statistics, inside the graph"
    if isinstance(graph.body, StandardisedBody) and graph.body.standardise:
        return "(obs - mean) / std with the dataset's statistics, inside the graph"
    return "none"


def _metadata(graph: ActingGraph, fmt: Format, env: VecEnv, check: Check, about: dict[str, Any]) -> dict[str, Any]:
    return {
        **about,
        "format": fmt,
        **({"onnx_opset": ONNX_OPSET} if fmt == "onnx" else {}),
        "distrl_version": __version__,
        "stochastic": graph.stochastic,
        "observation_space": describe_space(env.single_observation_space),
        "action_space": describe_space(env.single_action_space),
        "inputs": [p.as_json() for p in graph.inputs],
        "outputs": [p.as_json() for p in graph.outputs],
        "observations": (
            "as the run's environment gives them after its wrappers, in distrl's stored form: float32 vectors, "
            "uint8 images (unscaled), int64 Discrete values, a Dict as one input per key"
        ),
        "normalisation": _normalisation(graph),
        "actions": ACTIONS[graph.head.kind][graph.stochastic],
        "check": {
            "observations": check.observations,
            "mismatched": check.mismatched,
            "max_abs_diff": check.max_abs_diff,
            "tolerance": 0 if check.discrete else TOLERANCE,
            "against": "distrl's policy (Model.predict) on the run's evaluation environment",
        },
    }
