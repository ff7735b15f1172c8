"""GRPO on a tiny causal LM: distrl (single, pipeline) against TRL's GRPOTrainer, side by side.

    python benchmarks/grpo_vs_trl.py                    # --task reversal; writes its section of docs/benchmarks.md
    python benchmarks/grpo_vs_trl.py --task lora        # the same task with a LoRA adapter on both sides
    python benchmarks/grpo_vs_trl.py --task multiturn   # a multi-turn text game
    python benchmarks/grpo_vs_trl.py --task lora --repeats 1 --max-steps 3 --no-write

Both libraries train the same thing: a random-initialised 2-layer Llama (hidden 64, 83k parameters) with a
character tokenizer, built in code and saved to a directory both load with ``from_pretrained``; prompts
"123=" whose answer reverses the digits; the reward is the fraction of positions right over the longer of
answer and completion (partial credit, so the model must also stop). The settings are the same: group size
16, 16 prompts per step (256 completions, one optimizer step), at most 5 new tokens, temperature 1, no
top-k or top-p, learning rate 1e-3 constant, Adam eps 1e-8 and no weight decay, the dapo loss, clip 0.2,
no KL term, gradient norm clipped at 1, float32, one thread per process. TRL generates with
``model.generate`` in the training process (vLLM is not available on CPU); its side is ``trl_grpo.py``. distrl
scores with its default reward workers (2 processes; ``reward_workers.py`` weighs them against scoring in the
learner's process), TRL in its training process.

``--task lora``: the same prompts and reward on a 4-layer Llama of hidden 256 (2.6M parameters), of which only a
LoRA adapter of rank 8 and alpha 16 trains (139k parameters), on every linear layer but the output: the q, k,
v, o, gate, up and down projections (distrl's default target modules; TRL's ``target_modules="all-linear"``).
Learning rate 5e-3. The pipeline sends its generator the adapter alone.

``--task multiturn``: ``textgame.py``'s game. The model guesses a hidden digit, one token per turn; the game
answers higher, lower or correct; after 4 guesses (or a turn that is not a digit) it ends, with reward 1 if
some guess was right. distrl plays it as a text environment (``textgame:make``); TRL through GRPOTrainer's
``environment_factory``, the guess being a tool call (see ``trl_grpo.py``). A rollout's tokens are the same
on both sides; the game's own tokens carry no loss. Other settings as above, with at most 4 new tokens.

Each run stops once the mean reward of its last 10 steps reaches 0.9 (distrl's ``--target-return``, a
callback for TRL), or after ``--max-steps``. Reported: completions (episodes, in the game) per second over the
training loop, training seconds to the target, where the time goes, and the peak memory of the run's whole
process tree (PSS: the pipeline's Ray actors included, shared pages counted once). Each run has its own
subprocess; configurations alternate; round k runs seed k in each (sampling, prompt order; the model is the
same); medians.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from harness import alternating, markdown_table, median, write_section
from textgame import CHARS as GAME_CHARS
from textgame import TURNS, write_games

HERE = Path(__file__).parent
TESTS = HERE.parent / "tests"
sys.path.insert(0, str(TESTS))  # the tests' tiny-model builder and reward: both libraries get the same ones

TRL = "TRL GRPOTrainer"
SINGLE = {"distrl single": ["--strategy", "single"]}
PIPELINE_1 = {"distrl pipeline, 1 generator": ["--strategy", "pipeline", "--workers", "1"]}


@dataclass(frozen=True)
class Task:
    """One comparison: its section of docs/benchmarks.md, the model and what both libraries are given."""

    title: str
    """The section's heading."""
    distrl: dict[str, list[str]]
    """distrl's configurations: name -> the flags that make it, besides the shared ones."""
    env: str = ""
    """A text environment's factory (the reward is its return); empty: the reversal prompts and reward."""
    hidden: int = 64
    layers: int = 2
    learning_rate: float = 1e-3
    new_tokens: int = 5
    """Model tokens per completion, over all its turns."""
    lora: bool = False
    group: int = 16
    prompts: int = 16
    reward: str = "distrl_lm:reversal"
    """distrl's reward function, for the prompt tasks."""
    target: float | None = 0.9
    """Stop at this mean reward over the last 10 steps (None: run every step)."""
    max_steps: int = 1500
    columns: tuple[str, ...] = ()
    """Result keys shown in more columns of the section (see COLUMNS)."""


TASKS = {
    "reversal": Task("GRPO on a tiny language model: distrl against TRL", {**SINGLE, **PIPELINE_1}),
    "lora": Task(
        "GRPO with LoRA on a tiny language model: distrl against TRL",
        {name: [*flags, "--lora-rank", "8", "--lora-alpha", "16"] for name, flags in {**SINGLE, **PIPELINE_1}.items()},
        hidden=256,
        layers=4,
        learning_rate=5e-3,
        lora=True,
        columns=("reward_last",),
    ),
    "multiturn": Task(
        "GRPO on a multi-turn text game: distrl against TRL",
        {**SINGLE, "distrl pipeline, 2 generators": ["--strategy", "pipeline", "--workers", "2"]},
        env="textgame:make",
        new_tokens=TURNS,
        max_steps=500,
        columns=("model_tokens", "reward_last"),
    ),
}


def distrl_command(task: Task, model: str, data: str, max_steps: int, out: str, seed: int, flags: list[str]) -> list:
    """``distrl train grpo`` on ``task`` with the shared settings and ``flags``, writing ``out``."""
    if task.env:  # the environment's return is the reward
        source, episodes = [task.env], ["--max-turns", str(TURNS), "--max-turn-tokens", "1"]
    else:
        source, episodes = [], ["--reward", task.reward]
    return [
        sys.executable,
        "-m",
        "distrl",
        "train",
        "grpo",
        *source,
        "--model",
        model,
        "--dataset",
        data,
        *episodes,
        "--group-size",
        str(task.group),
        "--prompts-per-slice",
        "4",
        "--slices-per-step",
        str(task.prompts // 4),
        "--slices-per-call",
        str(task.prompts // 4),
        "--max-new-tokens",
        str(task.new_tokens),
        "--learning-rate",
        str(task.learning_rate),
        "--learner-steps",
        str(max_steps),
        *([] if task.target is None else ["--target-return", str(task.target)]),
        "--seed",
        str(seed),
        "--threads",
        "1",
        "--quiet",
        "--run-dir",
        out,
        *flags,
    ]


def peak_pss_mb(pid: int, stop: threading.Event, out: list[float]) -> None:
    """Sample the process tree's proportional set size (shared pages split among sharers) until ``stop``."""
    import psutil

    peak = 0.0
    while not stop.is_set():
        try:
            root = psutil.Process(pid)
            total = 0
            for proc in [root, *root.children(recursive=True)]:
                try:
                    total += proc.memory_full_info().pss
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    pass
            peak = max(peak, total / 2**20)
        except psutil.NoSuchProcess:
            break
        stop.wait(0.5)
    out.append(peak)


SUMMARY_KEYS = (
    "completions",
    "train_s",
    "completions_per_s",
    "generate_s",
    "score_s",
    "learn_s",
    "weight_sync_s",
    "weight_sync_bytes",
    "learner_busy_fraction",
    "reward_last",
)


def run_measured(name: str, cmd: list[str]) -> tuple[str, float | None]:
    """Run ``cmd`` with the tests' and the benchmarks' modules importable, sampling its process tree's memory:
    its stdout and peak PSS in MiB."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), str(HERE)])}  # distrl_lm, textgame, ...
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    stop, peak = threading.Event(), []
    sampler = threading.Thread(target=peak_pss_mb, args=(proc.pid, stop, peak))
    sampler.start()
    stdout, stderr = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{stderr[-3000:]}")
    return stdout, peak[0] if peak else None


def distrl_result(run_dir: Path) -> dict:
    """A distrl run's figures, from its summary.json, under the names TRL's side reports them by."""
    s = json.loads((run_dir / "summary.json").read_text())
    return {
        **{k: s.get(k) for k in SUMMARY_KEYS},
        "target_train_s": s.get("target_reached_train_s"),
        "target_step": s.get("target_reached_step"),
        "steps": s["learner_steps"],
        "model_tokens": s["tokens"] / max(s["completions"], 1),
    }


def measure(task_name: str, name: str, model: str, data: str, max_steps: int, seed: int) -> dict:
    task = TASKS[task_name]
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        if name == TRL:
            trl = [sys.executable, str(HERE / "trl_grpo.py"), task_name, model, data, str(max_steps), str(run_dir)]
            stdout, peak = run_measured(name, [*trl, str(seed)])
            result = json.loads(stdout.strip().splitlines()[-1])
        else:
            _, peak = run_measured(
                name, distrl_command(task, model, data, max_steps, str(run_dir), seed, task.distrl[name])
            )
            result = distrl_result(run_dir)
    result["peak_pss_mb"] = peak
    return result


COLUMNS = {"model_tokens": "model turns per game (a token each)", "reward_last": "reward, last 10 steps"}
"""The optional columns a task's section shows, by result key."""


def model_bytes(model: str) -> int:
    """Bytes of the saved model's weights (tied ones once): what a full weight sync would send."""
    from safetensors.torch import load_file

    return sum(t.numel() * t.element_size() for t in load_file(str(Path(model) / "model.safetensors")).values())


def section(task_name: str, results: dict[str, list[dict]], repeats: int, max_steps: int, full_bytes: int) -> str:
    task = TASKS[task_name]

    def m(name: str, key: str) -> float | None:
        return median([r[key] for r in results[name]])

    ref_rate, ref_time = m(TRL, "completions_per_s"), m(TRL, "target_train_s")
    rows = []
    for name in results:
        rate, to_target = m(name, "completions_per_s"), m(name, "target_train_s")
        reached = sum(r["target_train_s"] is not None for r in results[name])
        train = m(name, "train_s") or 1.0
        split = " / ".join(
            f"{100 * (m(name, k) or 0.0) / train:.0f}%" for k in ("generate_s", "score_s", "learn_s", "weight_sync_s")
        )
        busy = m(name, "learner_busy_fraction")
        extra = [m(name, key) for key in task.columns]
        rows.append(
            [
                name,
                f"{rate:,.0f}",
                f"{rate / ref_rate:.2f}×",
                "not reached" if to_target is None else f"{to_target:.1f}",
                "n/a" if to_target is None or ref_time is None else f"{ref_time / to_target:.2f}×",
                f"{reached}/{len(results[name])}",
                f"{m(name, 'target_step') or 0:.0f}",
                "n/a" if busy is None else f"{busy:.0%}",
                split,
                f"{m(name, 'peak_pss_mb') or 0:,.0f}",
                *("n/a" if v is None else f"{v:.2f}" for v in extra),
            ]
        )
    notes = [
        "Generation, scoring and learning are shares of the training time; in the pipeline generation and scoring "
        "run in other processes at the same time as learning, so its shares can add up to more than 100%."
    ]
    if task.lora:
        pipeline = next(name for name in results if "pipeline" in name)
        sent = m(pipeline, "weight_sync_bytes")
        notes.append(
            f"Weight sync: distrl's pipeline sent {'n/a' if sent is None else f'{sent / 2**20:,.2f} MiB'} per "
            f"update of its generator (the adapter), where the whole model is {full_bytes / 2**20:,.2f} MiB."
        )
    if task.env:
        notes.append(
            "A completion is a whole game. TRL ends a rollout only when the model stops calling the tool or the "
            "completion budget runs out, never when the environment says so; hence a game of a fixed 4 guesses on "
            "both sides. TRL's generation share includes its tool-call loop, the game's moves with it."
        )
    command = "python benchmarks/grpo_vs_trl.py" + ("" if task_name == "reversal" else f" --task {task_name}")
    return "\n".join(
        [
            f"`{command}` — {time.strftime('%Y-%m-%d')}, 2-core machine, nothing else running; "
            f"{repeats} runs each (seeds 0-{repeats - 1}), alternating, medians; each run stops at a mean reward of "
            f"{task.target} over 10 steps or after {max_steps} steps. Model, data, reward and settings: the "
            "script's docstring (the same for both).",
            "",
            *markdown_table(
                [
                    "configuration",
                    "completions/s",
                    "vs TRL",
                    f"training s to reward ≥ {task.target}",
                    "faster than TRL",
                    "runs reaching it",
                    "steps to it",
                    "learner busy",
                    "generate / score / learn / weight sync",
                    "peak PSS MB (all processes)",
                    *(COLUMNS[key] for key in task.columns),
                ],
                rows,
            ),
            "",
            *notes,
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--task", choices=list(TASKS), default="reversal")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=None, help="default: the task's (1500; multiturn 500)")
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    task = TASKS[args.task]
    max_steps = args.max_steps or task.max_steps
    from distrl_lm import DIGITS, make_model, write_reversal

    with tempfile.TemporaryDirectory() as tmp:
        chars = GAME_CHARS if task.env else DIGITS
        model = make_model(Path(tmp) / "model", chars=chars, hidden=task.hidden, layers=task.layers)
        data = write_games(Path(tmp) / "games.jsonl") if task.env else write_reversal(Path(tmp) / "reverse.jsonl")
        full_bytes = model_bytes(model)
        names = [*task.distrl, TRL]
        results: dict[str, list[dict]] = {name: [] for name in names}
        for name in alternating(names, args.repeats):
            r = measure(args.task, name, model, data, max_steps, seed=len(results[name]))  # round k: seed k, both
            results[name].append(r)
            print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    body = section(args.task, results, args.repeats, max_steps, full_bytes)
    if args.no_write:
        print(body)
    else:
        write_section(task.title, body)


if __name__ == "__main__":
    main()
