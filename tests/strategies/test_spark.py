"""ddp through Spark's TorchDistributor: both modes, a failing rank, too many ranks, the command line."""

import json
import shutil
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from distrl.config import ConfigError, StrategyConfig
from distrl.strategies.launch import WorkerFailed
from distrl.strategies.spark_engine import RANK_ERROR, check_spark, describe_failure, task_slots

SMALL = {"n_envs": 2, "n_steps": 64, "batch_size": 64, "n_epochs": 2}


def report(rank, error):
    return RANK_ERROR + json.dumps({"rank": rank, "error": error})


def test_the_rank_that_failed_first_is_named_not_the_peer_it_broke():
    output = [
        "some log line",
        report(0, "RuntimeError: [gloo/pair.cc:553] Connection closed by peer [127.0.0.1]:1"),
        report(1, "ValueError: bad observation"),
    ]
    message = describe_failure(RuntimeError("TorchDistributor failed during training."), 2, output)
    assert message == "rank 1 of 2 failed under Spark: ValueError: bad observation (then failed too: rank 0)"


def test_reports_are_also_found_inside_the_exception_text_spark_raises():
    wrapped = RuntimeError(
        "Command [...] failed with return code 1. The task output is included below:\n"
        f"noise\n{report(3, 'KeyError: x')}\nmore noise"
    )
    outer = RuntimeError("An error occurred while calling o66.collectToPython.\n\tat org.apache.Foo(Foo.java:1)")
    outer.__cause__ = wrapped
    assert describe_failure(outer, 4) == "rank 3 of 4 failed under Spark: KeyError: x"


def test_without_a_report_the_last_error_line_is_quoted_not_a_java_frame():
    exc = RuntimeError("Py4JJavaError: job aborted\nPythonException: OSError: no space\n\tat py4j.Gateway(G.java:1)")
    message = describe_failure(exc, 2)
    assert (
        message
        == "the Spark run of 2 ranks failed and no rank reported an exception: PythonException: OSError: no space"
    )


def fake_spark(master, busy=(), default_parallelism=8, cpus_per_task="1", python=sys.executable):
    stages = {i: SimpleNamespace(numActiveTasks=n) for i, n in enumerate(busy)}
    tracker = SimpleNamespace(getActiveStageIds=lambda: list(stages), getStageInfo=stages.get)
    conf = SimpleNamespace(get=lambda key, default: cpus_per_task if key == "spark.task.cpus" else default)
    sc = SimpleNamespace(
        master=master,
        defaultParallelism=default_parallelism,
        statusTracker=lambda: tracker,
        getConf=lambda: conf,
        pythonExec=python,
    )
    return SimpleNamespace(sparkContext=sc)


def test_task_slots_of_local_and_cluster_masters():
    assert task_slots(fake_spark("local")) == (1, 0)
    assert task_slots(fake_spark("local[3]", busy=(1,))) == (3, 1)
    assert task_slots(fake_spark("local[4,2]", cpus_per_task="2")) == (2, 0)
    assert task_slots(fake_spark("spark://head:7077", default_parallelism=16, busy=(2, 3))) == (16, 5)


def test_more_ranks_than_free_slots_is_refused_before_any_job_starts():
    with pytest.raises(ConfigError, match=r"workers=3 is not allowed: must be <= 1, .*local\[2\] \(2 slots, 1 busy\)"):
        check_spark(fake_spark("local[2]", busy=(1,)), 3, local_mode=False)
    check_spark(fake_spark("local[2]", busy=(1,)), 3, local_mode=True)  # ranks on the driver take no task slots
    with pytest.raises(ConfigError, match="PYSPARK_PYTHON"):
        check_spark(fake_spark("local[2]", python="python3-elsewhere"), 2, local_mode=False)


def test_spark_launches_only_ddp_or_decoupled_ranks():
    with pytest.raises(ConfigError, match="launcher='spark' is not allowed"):
        StrategyConfig(strategy="actor-learner", workers=2, launcher="spark")


# ---- real Spark (local[2] master, JVM): slow ----

needs_spark = pytest.mark.skipif(shutil.which("java") is None, reason="Spark needs a Java runtime on PATH")


@pytest.fixture(scope="module")
def spark():
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'distrl[spark]')")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime on PATH")
    from distrl.strategies.spark import session

    with session("local[2]") as spark:
        yield spark


def final_params_checksum(run_dir):
    from distrl.api import Model
    from distrl.strategies.ddp import checksum

    model = Model.load(run_dir)
    try:
        return checksum(model._trainer.broadcast_tensors()[0])
    finally:
        model.close()


@needs_spark
@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.parametrize("local_mode", [True, False], ids=["on-driver", "on-executors"])
def test_two_ranks_train_ppo_and_end_with_identical_parameters(spark, tmp_path, local_mode):
    from distrl.strategies.spark import train

    run_dir = tmp_path / "run"
    summary = train(
        spark,
        "ppo",
        "CartPole-v1",
        workers=2,
        local_mode=local_mode,
        total_steps=1024,
        run_dir=str(run_dir),
        scaling="equivalent",
        **SMALL,
    )
    assert summary["workers"] == 2 and summary["strategy"] == "ddp"
    assert summary["total_steps"] == 1024 and summary["iterations"] == 1024 // (
        2 * 2 * 32
    )  # 2 workers x 2 envs x n_steps 64 / 2
    first, second = summary["param_checksums"]
    assert first == second == final_params_checksum(run_dir)
    assert json.loads((run_dir / "summary.json").read_text()) == summary
    effective = json.loads((run_dir / "config.json").read_text())["ppo_effective"]
    assert effective["n_steps"] == 32 and effective["learning_rate"] == pytest.approx(2 * 2e-3)  # preset lr 2e-3
    assert len((run_dir / "monitor.csv").read_text().splitlines()) > 3


@needs_spark
@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_rank_that_raises_is_named_with_its_exception(spark, tmp_path):
    from distrl.strategies.spark import train

    start = time.monotonic()
    with pytest.raises(WorkerFailed) as caught:
        train(
            spark,
            "ppo",
            "distrl_testenvs:ExplodingOnRank1",
            workers=2,
            total_steps=100_000,
            run_dir=str(tmp_path / "run"),
            vec="sync",
            **SMALL,
        )
    assert time.monotonic() - start < 120
    assert str(caught.value).startswith("rank 1 of 2 failed under Spark: RuntimeError: boom from rank 1's env")


@needs_spark
@pytest.mark.slow
@pytest.mark.multiprocess
def test_too_many_ranks_for_the_master_fail_at_once_without_a_job(spark, tmp_path):
    from distrl.strategies.spark import train

    start = time.monotonic()
    with pytest.raises(ConfigError, match=r"workers=3 is not allowed: must be <= 2"):
        train(spark, "ppo", "CartPole-v1", workers=3, local_mode=False, run_dir=str(tmp_path / "run"))
    assert time.monotonic() - start < 5 and not (tmp_path / "run").exists()


@needs_spark
@pytest.mark.slow
@pytest.mark.multiprocess
def test_command_line_launcher_spark(tmp_path):
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'distrl[spark]')")
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "distrl",
            "train",
            "ppo",
            "CartPole-v1",
            "--strategy",
            "ddp",
            "--launcher",
            "spark",
            "--workers",
            "2",
            "--spark-master",
            "local[2]",
            "--total-steps",
            "512",
            "--n-envs",
            "2",
            "--n-steps",
            "64",
            "--batch-size",
            "64",
            "--quiet",
            "--run-dir",
            str(run_dir),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["workers"] == 2 and summary["param_checksums"][0] == summary["param_checksums"][1]
