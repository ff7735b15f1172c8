"""GRPO on a tiny causal LM: distrl (single, pipeline) against TRL's GRPOTrainer, side by side.

    python benchmarks/grpo_vs_trl.py                 # writes its section of docs/benchmarks.md
    python benchmarks/grpo_vs_trl.py --repeats 1 --max-steps 200 --no-write

Both libraries train the same thing: a random-initialised 2-layer Llama (hidden 64, 83k parameters) with a
character tokenizer, built in code and saved to a directory both load with ``from_pretrained``; prompts
"123=" whose answer reverses the digits; the reward is the fraction of positions right over the longer of
answer and completion (partial credit, so the model must also stop). The settings are the same: group size
16, 16 prompts per step (256 completions, one optimizer step), at most 5 new tokens, temperature 1, no
top-k or top-p, learning rate 1e-3 constant, Adam eps 1e-8 and no weight decay, the dapo loss, clip 0.2,
no KL term, gradient norm clipped at 1, float32, one thread per process. TRL generates with
``model.generate`` in the training process (vLLM is not available on CPU).

Each run stops once the mean reward of its last 10 steps reaches 0.9 (distrl's ``--target-return``, a
callback for TRL), or after ``--max-steps``. Reported: completions per second over the training loop,
training seconds to the target, where the time goes, and the peak memory of the run's whole process tree
(PSS: the pipeline's Ray actors included, shared pages counted once). Each run has its own subprocess;
configurations alternate; round k runs seed k in each (sampling, prompt order; the model is the same); medians.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from harness import alternating, markdown_table, median, write_section

TESTS = Path(__file__).parents[1] / "tests"
sys.path.insert(0, str(TESTS))  # the tests' tiny-model builder and reward: both libraries get the same ones

GROUP, PROMPTS, NEW_TOKENS, LR, TARGET = 16, 16, 5, 1e-3, 0.9
DISTRL = {
    "distrl single": ["--strategy", "single"],
    "distrl pipeline, 1 generator": ["--strategy", "pipeline", "--workers", "1"],
}
TRL = "TRL GRPOTrainer"


def run_trl(model: str, data: str, max_steps: int, out: str, seed: int) -> dict:
    """TRL's GRPOTrainer on the same model, data and settings, in this process; times by stage."""
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from distrl_lm import reversal

    torch.set_num_threads(1)
    rows = [json.loads(line) for line in Path(data).read_text().splitlines() if line.strip()]
    args = GRPOConfig(
        output_dir=out,
        per_device_train_batch_size=GROUP * PROMPTS,
        gradient_accumulation_steps=1,
        num_generations=GROUP,
        max_completion_length=NEW_TOKENS,
        temperature=1.0,
        top_p=1.0,
        learning_rate=LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_epsilon=1e-8,
        beta=0.0,
        loss_type="dapo",
        scale_rewards="group",
        epsilon=0.2,
        max_grad_norm=1.0,
        max_steps=max_steps,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        bf16=False,
        seed=seed,
        data_seed=seed,
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    rewards: list[float] = []
    marks: dict[str, float] = {}

    class Target(TrainerCallback):
        def on_train_begin(self, *a, **k):  # noqa: ANN002, ANN003, ANN202
            marks["start"] = time.perf_counter()

        def on_log(self, a, state, control, logs=None, **k):  # noqa: ANN001, ANN003, ANN202
            if logs and "reward" in logs:
                rewards.append(float(logs["reward"]))
                if "target_s" not in marks and len(rewards) >= 10 and sum(rewards[-10:]) / 10 >= TARGET:
                    marks["target_s"], marks["target_step"] = time.perf_counter() - marks["start"], state.global_step
                    control.should_training_stop = True

    trainer = GRPOTrainer(
        model=model, reward_funcs=[reversal], args=args, train_dataset=Dataset.from_list(rows), callbacks=[Target()]
    )
    spent = {"generate": 0.0, "score": 0.0, "generate_and_score": 0.0}

    def timed(name, fn):  # noqa: ANN001, ANN202
        def wrapper(*a, **k):  # noqa: ANN002, ANN003, ANN202
            start = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                spent[name] += time.perf_counter() - start

        return wrapper

    trainer._generate = timed("generate", trainer._generate)
    trainer._calculate_rewards = timed("score", trainer._calculate_rewards)
    trainer._generate_and_score_completions = timed("generate_and_score", trainer._generate_and_score_completions)
    trainer.train()
    train_s = time.perf_counter() - marks["start"]
    steps = trainer.state.global_step
    return {
        "completions": steps * GROUP * PROMPTS,
        "train_s": train_s,
        "steps": steps,
        "completions_per_s": steps * GROUP * PROMPTS / train_s,
        "target_train_s": marks.get("target_s"),
        "target_step": marks.get("target_step"),
        "reward_last": sum(rewards[-10:]) / max(len(rewards[-10:]), 1),
        "generate_s": spent["generate"],
        "score_s": spent["score"],
        "learn_s": train_s - spent["generate_and_score"],
        "weight_sync_s": 0.0,
        "learner_busy_fraction": None,
    }


def run_distrl(model: str, data: str, max_steps: int, out: str, seed: int, flags: list[str]) -> list[str]:
    return [
        sys.executable,
        "-m",
        "distrl",
        "train",
        "grpo",
        "--model",
        model,
        "--dataset",
        data,
        "--reward",
        "distrl_lm:reversal",
        "--group-size",
        str(GROUP),
        "--prompts-per-slice",
        "4",
        "--slices-per-step",
        str(PROMPTS // 4),
        "--slices-per-call",
        str(PROMPTS // 4),
        "--max-new-tokens",
        str(NEW_TOKENS),
        "--learning-rate",
        str(LR),
        "--learner-steps",
        str(max_steps),
        "--target-return",
        str(TARGET),
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


def measure(name: str, model: str, data: str, max_steps: int, seed: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = str(Path(tmp) / "run")
        if name == TRL:
            cmd = [sys.executable, __file__, "--trl-child", model, data, str(max_steps), run_dir, str(seed)]
        else:
            cmd = run_distrl(model, data, max_steps, run_dir, seed, DISTRL[name])
        env = {**__import__("os").environ, "PYTHONPATH": str(TESTS)}
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        stop, peak = threading.Event(), []
        sampler = threading.Thread(target=peak_pss_mb, args=(proc.pid, stop, peak))
        sampler.start()
        stdout, stderr = proc.communicate()
        stop.set()
        sampler.join()
        if proc.returncode != 0:
            raise RuntimeError(f"{name} failed:\n{stderr[-3000:]}")
        if name == TRL:
            result = json.loads(stdout.strip().splitlines()[-1])
        else:
            s = json.loads((Path(run_dir) / "summary.json").read_text())
            result = {
                k: s.get(k)
                for k in (
                    "completions",
                    "train_s",
                    "completions_per_s",
                    "generate_s",
                    "score_s",
                    "learn_s",
                    "weight_sync_s",
                    "learner_busy_fraction",
                    "reward_last",
                )
            }
            result.update(
                target_train_s=s.get("target_reached_train_s"),
                target_step=s.get("target_reached_step"),
                steps=s["learner_steps"],
            )
        result["peak_pss_mb"] = peak[0] if peak else None
        return result


def section(results: dict[str, list[dict]], repeats: int, max_steps: int) -> str:
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
            ]
        )
    return "\n".join(
        [
            f"`python benchmarks/grpo_vs_trl.py` — {time.strftime('%Y-%m-%d')}, 2-core machine, nothing else running; "
            f"{repeats} runs each (seeds 0-{repeats - 1}), alternating, medians; each run stops at a mean reward of {TARGET} over 10 steps or "
            f"after {max_steps} steps. Model, data, reward and settings: the script's docstring (the same for both).",
            "",
            *markdown_table(
                [
                    "configuration",
                    "completions/s",
                    "vs TRL",
                    f"training s to reward ≥ {TARGET}",
                    "faster than TRL",
                    "runs reaching it",
                    "steps to it",
                    "learner busy",
                    "generate / score / learn / weight sync",
                    "peak PSS MB (all processes)",
                ],
                rows,
            ),
            "",
            "Generation, scoring and learning are shares of the training time; in the pipeline generation and scoring "
            "run in other processes at the same time as learning, so its shares can add up to more than 100%.",
        ]
    )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--trl-child":
        print(json.dumps(run_trl(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=1500)
    parser.add_argument("--no-write", action="store_true", help="print the section instead of writing it")
    args = parser.parse_args()
    from distrl_lm import DIGITS, make_model, write_reversal

    with tempfile.TemporaryDirectory() as tmp:
        model = make_model(Path(tmp) / "model", chars=DIGITS)
        data = write_reversal(Path(tmp) / "reverse.jsonl")
        names = [*DISTRL, TRL]
        results: dict[str, list[dict]] = {name: [] for name in names}
        for name in alternating(names, args.repeats):
            r = measure(name, model, data, args.max_steps, seed=len(results[name]))  # round k: seed k, both libraries
            results[name].append(r)
            print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in r.items()}, flush=True)
    body = section(results, args.repeats, args.max_steps)
    if args.no_write:
        print(body)
    else:
        write_section("GRPO on a tiny language model: distrl against TRL", body)


if __name__ == "__main__":
    main()
