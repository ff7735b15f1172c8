"""Every algorithm x strategy x scaling, from the command line: it trains and its batches are the sizes the
scaling documents, or it is a one-line error naming the field (exit 2) before anything starts."""

import json

import pytest

from distrl.cli import main

pytestmark = pytest.mark.multiprocess

ALGOS = {  # the smallest budgets that make each algorithm update more than once
    "ppo": [
        "CartPole-v1",
        "--total-steps",
        "256",
        "--n-envs",
        "2",
        "--n-steps",
        "32",
        "--batch-size",
        "16",
        "--n-epochs",
        "1",
    ],
    "sac": [
        "Pendulum-v1",
        "--total-steps",
        "96",
        "--learning-starts",
        "64",
        "--batch-size",
        "16",
        "--buffer-size",
        "1000",
        "--net-arch",
        "16",
        "16",
        "--learning-rate",
        "0.001",
    ],
    "dqn": [
        "CartPole-v1",
        "--preset",
        "none",
        "--total-steps",
        "160",
        "--learning-starts",
        "64",
        "--batch-size",
        "16",
        "--buffer-size",
        "1000",
        "--net-arch",
        "16",
        "--learning-rate",
        "0.001",
    ],
    "reinforce": ["CartPole-v1", "--total-steps", "150", "--episodes-per-iter", "4", "--n-envs", "2"],
    "grpo": ["toy", "--learner-steps", "2"],
}
STRATEGIES = ["single", "ddp", "actor-learner", "decoupled", "pipeline"]

# Worked out by hand for two workers: what one update trains on (ppo: env steps, reinforce: episodes,
# grpo: completions; sac and dqn: the effective learning rate, the one thing their scaling shows in a short run;
# under actor-learner their learner samples a shared replay, unscaled).
TRAINS = {
    ("ppo", "single"): (64, 64),
    ("ppo", "ddp"): (128, 64),
    ("ppo", "actor-learner"): (128, 64),
    ("ppo", "decoupled"): (64, None),
    ("ppo", "pipeline"): (64, None),
    ("sac", "single"): (1e-3, 1e-3),
    ("sac", "ddp"): (1e-3, 2e-3),
    ("sac", "actor-learner"): (1e-3, 1e-3),
    ("dqn", "single"): (1e-3, 1e-3),
    ("dqn", "ddp"): (1e-3, 2e-3),
    ("dqn", "actor-learner"): (1e-3, 1e-3),
    ("reinforce", "single"): (4, 4),
    ("reinforce", "ddp"): (8, 4),
    ("reinforce", "actor-learner"): (4, 4),
    ("grpo", "single"): (512, 512),
    ("grpo", "ddp"): (1024, 512),
    ("grpo", "pipeline"): (512, None),
}
UNAVAILABLE = {  # (algo, strategy): the field the error names
    ("sac", "decoupled"): "algo='sac'",
    ("dqn", "decoupled"): "algo='dqn'",
    ("dqn", "pipeline"): "strategy='pipeline'",
    ("sac", "pipeline"): "strategy='pipeline'",
    ("reinforce", "decoupled"): "algo='reinforce'",
    ("reinforce", "pipeline"): "strategy='pipeline'",
    ("grpo", "actor-learner"): "strategy='actor-learner'",
    ("grpo", "decoupled"): "strategy='decoupled'",
}


def per_update(algo: str, run_dir) -> float:
    summary = json.loads((run_dir / "summary.json").read_text())
    if algo == "ppo" and "fragments_generated" in summary:  # pipeline: each learner step trains one fragment
        # total_steps counts the fragments harvested by the last step, which may run ahead of the steps taken
        return (summary["total_steps"] + summary["drained_steps"]) / summary["fragments_generated"]
    if algo == "ppo":
        return summary["total_steps"] / summary["iterations"]
    if algo == "reinforce":
        return summary["episodes"] / summary["iterations"]
    if algo == "grpo":
        return summary["completions"] / summary["learner_steps"]
    return json.loads((run_dir / "config.json").read_text())[f"{algo}_effective"]["learning_rate"]


def combinations() -> list:
    """Every (algo, strategy, scaling). A combination that trains on several workers trains in the default run under
    the default scaling (per-worker), and under ``equivalent`` in the heavy run: the second start of the same ranks,
    whose batch arithmetic ``scaled`` is tested without starting anything (tests/strategies/test_ddp.py)."""
    cases = []
    for algo in ALGOS:
        for strategy in STRATEGIES:
            for scaling in ("per-worker", "equivalent"):
                trains = TRAINS.get((algo, strategy), (None, None))[scaling == "equivalent"] is not None
                again = trains and strategy != "single" and scaling == "equivalent"
                marks = [pytest.mark.heavy] if again else []
                cases.append(pytest.param(algo, strategy, scaling, marks=marks, id=f"{algo}-{strategy}-{scaling}"))
    return cases


@pytest.mark.parametrize("algo, strategy, scaling", combinations())
def test_every_combination_trains_as_documented_or_is_a_one_line_error(
    algo, strategy, scaling, tmp_path, capsys, ray_local
):
    workers = "1" if strategy == "single" else "2"
    run_dir = tmp_path / "run"
    code = main(
        [
            "train",
            algo,
            *ALGOS[algo],
            "--strategy",
            strategy,
            "--workers",
            workers,
            "--scaling",
            scaling,
            "--quiet",
            "--run-dir",
            str(run_dir),
        ]
    )
    err = capsys.readouterr().err.strip()
    expected = TRAINS.get((algo, strategy), (None, None))[scaling == "equivalent"]
    if expected is None:
        fields = [UNAVAILABLE.get((algo, strategy), "scaling='equivalent'")]
        if scaling == "equivalent" and strategy in ("decoupled", "pipeline"):
            fields.append("scaling='equivalent'")  # either may be checked first
        assert code == 2 and len(err.splitlines()) == 1, err
        assert any(err.startswith(f"distrl: error: {field} is not ") for field in fields), err
        assert not run_dir.exists()  # refused before anything was written
    else:
        assert code == 0, err
        assert per_update(algo, run_dir) == pytest.approx(expected)
        if algo != "grpo":  # every worker's episodes reach the monitor, once
            summary = json.loads((run_dir / "summary.json").read_text())
            assert len((run_dir / "monitor.csv").read_text().splitlines()) - 2 == summary["episodes"]
