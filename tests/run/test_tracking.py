"""--track wandb|mlflow: the trackers get what TensorBoard gets (the same scalars at the same steps), the
resolved config, the summary and a recorded evaluation video; a ddp run is tracked once, by its main
process. W&B runs offline and its run file is read back record by record; MLflow writes a local
SQLite store (MLflow's own default kind of local store) and is read back through its client."""

import glob
import json
import struct
from pathlib import Path

import pytest

from distrl.cli import main

wandb = pytest.importorskip("wandb")
mlflow = pytest.importorskip("mlflow")


@pytest.fixture
def stores(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=uri)


def wandb_records(run_dir: Path, run_id: str) -> list:
    """Every record of a run's offline W&B files (its first run and any resumption), in order.

    The file is W&B's 7-byte header, then records in 32 KiB blocks, each record a 7-byte header (CRC, length,
    type: full, first, middle, last) and a piece of a serialised ``Record`` message.
    """
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for path in sorted(glob.glob(str(run_dir / "wandb" / f"offline-run-*-{run_id}" / f"run-{run_id}.wandb"))):
        data = Path(path).read_bytes()
        assert data[:4] == b":W&B"
        pos, piece = 7, b""
        while pos + 7 <= len(data):
            left = 32768 - pos % 32768
            _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
            if left < 7 or length == kind == 0:  # the rest of a block is padding
                pos += left
                continue
            piece += data[pos + 7 : pos + 7 + length]
            pos += 7 + length
            if kind in (1, 4):
                record = pb.Record()
                record.ParseFromString(piece)
                records.append(record)
                piece = b""
    return records


def wandb_history(records: list) -> dict[str, list[tuple[int, float]]]:
    series: dict[str, list[tuple[int, float]]] = {}
    for r in records:
        if r.WhichOneof("record_type") != "history":
            continue
        items = {item.key or "/".join(item.nested_key): item.value_json for item in r.history.item}
        step = int(items.pop("_step"))
        for key, value in items.items():
            if not key.startswith("_"):
                series.setdefault(key, []).append((step, json.loads(value) if value[:1] != "{" else value))
    return series


def tensorboard_scalars(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0}).Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _close(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
    """Equal steps, and values equal to TensorBoard's float32."""
    return [s for s, _ in a] == [s for s, _ in b] and all(
        v == pytest.approx(w, rel=1e-6, abs=1e-30) for (_, v), (_, w) in zip(a, b)
    )


def test_a_tracked_run_sends_both_trackers_what_tensorboard_gets(tmp_path, stores, capsys):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "ppo",
                "CartPole-v1",
                "--total-steps",
                "2048",
                "--eval-every",
                "1024",
                "--eval-episodes",
                "3",
                "--run-dir",
                str(run),
                "--track",
                "wandb",
                "--track",
                "mlflow",
                "--quiet",
            ]
        )
        == 0
    )
    ids = json.loads((run / "tracking.json").read_text())
    summary = json.loads((run / "summary.json").read_text())
    board = tensorboard_scalars(run)
    assert {"charts/episodic_return", "losses/policy_loss", "eval/mean_return"} <= set(board)

    records = wandb_records(run, ids["wandb"])
    logged = wandb_history(records)
    assert set(logged) == set(board)
    assert all(_close(logged[tag], board[tag]) for tag in board), [t for t in board if not _close(logged[t], board[t])]
    config = {
        item.key: json.loads(item.value_json)
        for r in records
        if r.WhichOneof("record_type") == "run"
        for item in r.run.config.update
    }
    assert (
        config["run"]["total_steps"] == 2048
        and config["ppo"]["n_envs"] == json.loads((run / "config.json").read_text())["ppo"]["n_envs"]
    )
    final = {}
    for r in records:
        if r.WhichOneof("record_type") == "summary":
            final.update({item.key: item.value_json for item in r.summary.update})
    assert json.loads(final["final_eval_mean_return"]) == summary["final_eval_mean_return"]

    client = stores
    run_id = ids["mlflow"]
    for tag, points in board.items():
        history = sorted((m.step, m.value) for m in client.get_metric_history(run_id, tag))
        assert _close(history, sorted(points)), tag
    params = client.get_run(run_id).data.params
    assert params["run.total_steps"] == "2048" and params["run.seed"] == "0"
    saved = json.loads(Path(client.download_artifacts(run_id, "summary.json", str(tmp_path))).read_text())
    assert saved == summary
    assert client.get_run(run_id).info.status == "FINISHED"

    # A recorded evaluation video goes to the same tracked runs.
    video = tmp_path / "eval.gif"
    assert (
        main(["eval", str(run), "--record", str(video), "--episodes", "1", "--track", "wandb", "--track", "mlflow"])
        == 0
    )
    assert [f.path for f in client.list_artifacts(run_id, "eval")] == ["eval/eval.gif"]
    media = wandb_history(wandb_records(run, ids["wandb"]))
    assert media["eval/video/_type"] == [(summary["total_steps"], "video-file")] and media["eval/video/path"][0][
        1
    ].endswith(".gif")


@pytest.mark.multiprocess
@pytest.mark.heavy
def test_a_ddp_run_is_tracked_once_by_its_main_process(tmp_path, stores):
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "ppo",
                "CartPole-v1",
                "--strategy",
                "ddp",
                "--workers",
                "2",
                "--total-steps",
                "2048",
                "--run-dir",
                str(run),
                "--track",
                "mlflow",
                "--track-project",
                "ddp-test",
                "--quiet",
            ]
        )
        == 0
    )
    client = stores
    experiment = client.get_experiment_by_name("ddp-test")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 1 and runs[0].info.run_id == json.loads((run / "tracking.json").read_text())["mlflow"]
    board = tensorboard_scalars(run)
    history = sorted((m.step, m.value) for m in client.get_metric_history(runs[0].info.run_id, "losses/policy_loss"))
    assert history and _close(history, sorted(board["losses/policy_loss"]))


def test_track_on_eval_without_a_recording_is_one_line_exit_2(tmp_path, capsys):
    assert main(["eval", str(tmp_path), "--track", "mlflow"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "distrl: error: track=('mlflow',) is not allowed without --record: eval logs a recorded video"


def test_a_missing_tracker_package_is_one_line_exit_2_before_anything_starts(tmp_path, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: importing it raises ImportError
    run = tmp_path / "run"
    assert (
        main(
            [
                "train",
                "ppo",
                "CartPole-v1",
                "--strategy",
                "ddp",
                "--workers",
                "2",
                "--run-dir",
                str(run),
                "--track",
                "wandb",
            ]
        )
        == 2
    )
    assert capsys.readouterr().err.strip() == (
        "distrl: error: track='wandb' needs its package: pip install 'distrl[wandb]'"
    )
    assert not run.exists()


@pytest.mark.parametrize(
    ("track", "environment", "named"),
    [
        ("wandb", {}, "WANDB_API_KEY"),
        ("mlflow", {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"}, "MLFLOW_TRACKING_URI"),  # discard port: refused
        ("mlflow", {"MLFLOW_TRACKING_URI": "ftp://example.invalid/store"}, "MLFLOW_TRACKING_URI"),
        ("mlflow", {"MLFLOW_TRACKING_URI": "sqlite:////proc/distrl/mlflow.db"}, "cannot be made"),
    ],
)
def test_a_tracker_that_cannot_be_used_is_one_line_exit_2_before_the_run_directory(
    tmp_path, capsys, monkeypatch, track, environment, named
):
    for variable in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "MLFLOW_TRACKING_URI"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("NETRC", str(tmp_path / "empty-netrc"))  # no stored wandb login
    (tmp_path / "empty-netrc").write_text("")
    for variable, value in environment.items():
        monkeypatch.setenv(variable, value)
    run_dir = tmp_path / "run"
    code = main(["train", "ppo", "CartPole-v1", "--track", track, "--total-steps", "64", "--run-dir", str(run_dir)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and named in err[0] and f"track='{track}'" in err[0]
    assert not run_dir.exists()


def test_mlflow_file_store_opens_once_mlflow_is_told_it_may(tmp_path, monkeypatch):
    """The way out the refusal of a file store names works, read as MLflow reads it (true or 1, any case)."""
    from mlflow import environment_variables
    from mlflow.tracking import MlflowClient

    from distrl.config import ConfigError
    from distrl.run.tracking import check_trackers

    if not hasattr(environment_variables, "MLFLOW_ALLOW_FILE_STORE"):
        pytest.skip("MLflow before 3.13 opens its file store without being asked to")
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    for refused in ("false", "0", None):
        if refused is None:
            monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
        else:
            monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", refused)
        with pytest.raises(ConfigError, match="is MLflow's file store, which MLflow .* opens only with"):
            check_trackers(("mlflow",))
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "yes")
    with pytest.raises(ConfigError, match="MLFLOW_ALLOW_FILE_STORE='yes' is not allowed: must be true, false, 1 or 0"):
        check_trackers(("mlflow",))
    assert not (tmp_path / "mlruns").exists()  # refused before anything was made
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "True")
    check_trackers(("mlflow",))
    MlflowClient(tracking_uri=uri).create_experiment("opened")
    assert (tmp_path / "mlruns").is_dir()
