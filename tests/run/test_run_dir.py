"""Accidents to a run directory: a second run pointed at a live one, writes that fail (a disk that fills up),
a checkpoint damaged after it was written, and how many checkpoints a run keeps."""

import errno
import json
import os
import shutil
import subprocess
import sys
import time

import pytest
from safetensors import SafetensorError
from test_checkpoint_integrity import flip_a_byte

from distrl.cli import main
from distrl.run import checkpoint, rundir

SLOW = "distrl_testenvs:SlowCartPole"


def short_run(run_dir, *extra):
    return [
        "train", "ppo", "CartPole-v1", "--n-envs", "2", "--n-steps", "32", "--batch-size", "32", "--n-epochs", "1",
        "--total-steps", "512", "--eval-episodes", "1", "--quiet", "--run-dir", str(run_dir), *extra,
    ]  # fmt: skip


# ---- one run directory, one run ----


def test_a_second_run_on_a_live_run_directory_is_refused_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    """The live run is a process of its own; the runs refused, the readers and the run that takes over run here (the
    lock is the open file's, so this process is a second holder as another would be)."""
    run = tmp_path / "run"
    live = subprocess.Popen(
        [sys.executable, "-m", "distrl", "train", "ppo", SLOW, "--n-envs", "2", "--n-steps", "32",
         "--total-steps", "200000", "--checkpoint-every", "64", "--quiet", "--run-dir", str(run)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not any((run / "checkpoints").glob("step-*")):
            assert live.poll() is None, live.communicate()[1]
            assert time.monotonic() < deadline
            time.sleep(0.05)
        config_before = (run / "config.json").read_text()
        holder = json.loads((run / rundir.LOCK_FILE).read_text())
        assert holder["pid"] == live.pid
        expected = f"distrl: error: run_dir={str(run)!r} is in use by a running run (pid {live.pid} on "

        for second in (
            short_run(run),  # a new run
            ["train", "ppo", SLOW, "--resume", str(run), "--quiet"],  # a resume
            short_run(run, "--strategy", "ddp", "--workers", "2"),  # a second launcher
        ):
            code = main(second)
            err = capsys.readouterr().err
            lines = err.strip().splitlines()
            assert code == 2 and len(lines) == 1 and lines[0].startswith(expected), err
            assert "wait for it to end, stop it, or choose another --run-dir" in lines[0]
            assert "rank" not in err  # refused before any rank started
        assert (run / "config.json").read_text() == config_before  # nothing of the live run was touched

        # readers do not take the lock
        assert main(["eval", str(run), "--episodes", "1", "--json"]) == 0, capsys.readouterr().err
        assert main(["plot", str(run), "--out", str(tmp_path / "curve.png")]) == 0, capsys.readouterr().err
        assert live.poll() is None
    finally:
        live.kill()  # dies holding the lock: the OS releases it, its name stays in the file
        live.wait()

    at = int(max((run / "checkpoints").glob("step-*")).name.split("-")[1])
    capsys.readouterr()
    assert main(["train", "ppo", SLOW, "--resume", str(run), "--total-steps", str(at + 64), "--quiet"]) == 0
    err = capsys.readouterr().err
    assert f"took over {run / rundir.LOCK_FILE}, left by pid {live.pid} on " in err
    assert "which is no longer running" in err
    assert (run / rundir.LOCK_FILE).read_text() == ""  # released at the end


def test_the_lock_names_its_holder_and_is_released(tmp_path):
    with rundir.held(tmp_path / "a" / "run", ["train", "ppo", "CartPole-v1"]):
        holder = json.loads((tmp_path / "a" / "run" / rundir.LOCK_FILE).read_text())
        assert holder["command"] == "distrl train ppo CartPole-v1"
        with pytest.raises(Exception, match="is in use by a running run"):  # another open file description
            with rundir.held(tmp_path / "a" / "run"):
                pass
    with rundir.held(tmp_path / "a" / "run"):  # free again
        pass


# ---- writes that fail ----


def test_a_failed_checkpoint_write_is_one_line_and_the_run_resumes_from_the_last_complete_one(
    tmp_path, monkeypatch, capsys
):
    """The disk fills while the third checkpoint is written (safetensors' own error, as on a full disk)."""
    run = tmp_path / "run"
    real_save, calls = checkpoint.save_file, []

    def filling_disk(tensors, filename, metadata=None):
        calls.append(filename)
        if len(calls) == 3:
            raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")
        return real_save(tensors, filename, metadata=metadata)

    monkeypatch.setattr(checkpoint, "save_file", filling_disk)
    status = main(short_run(run, "--checkpoint-every", "64"))
    err = capsys.readouterr().err
    assert status == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    second = run / "checkpoints" / f"step-{128:012d}"
    assert lines[0] == (
        f"distrl: error: could not write {run / 'checkpoints' / f'step-{192:012d}' / 'tensors.safetensors'}: "
        f"No space left on device (ENOSPC); free some space on that disk, then continue from the last complete "
        f"checkpoint ({second}) with: distrl train --resume {run}"
    )
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step-{64:012d}", f"step-{128:012d}"]
    assert checkpoint.verify(second) is None
    monkeypatch.setattr(checkpoint, "save_file", real_save)
    assert main(["train", "ppo", "CartPole-v1", "--resume", str(run), "--quiet"]) == 0
    assert checkpoint.read_state(run / "model")["steps"] == 512


TENSORBOARD_FILLS_THE_DISK = """
import errno, sys
from tensorboard.summary.writer.record_writer import RecordWriter
from distrl.cli import main
real_write, calls = RecordWriter.write, []
def filling_disk(self, data):
    calls.append(len(data))
    if len(calls) > 4:
        raise OSError(errno.ENOSPC, "No space left on device")
    return real_write(self, data)
RecordWriter.write = filling_disk
sys.exit(main(sys.argv[1:]))
"""


def test_a_tensorboard_write_that_fails_on_its_thread_is_one_line_from_the_training_thread(tmp_path):
    """TensorBoard writes from a thread of its own: the disk filling there ends the run in the same one line,
    with no second traceback from the dying thread printed into it (in a process of its own: pytest would
    catch the thread's end itself)."""
    run = tmp_path / "run"
    cmd = [sys.executable, "-c", TENSORBOARD_FILLS_THE_DISK, *short_run(run, "--checkpoint-every", "64")]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 1 and len(lines) == 1 and "Exception in thread" not in result.stderr, result.stderr
    assert lines[0].startswith(f"distrl: error: could not write into {run}: No space left on device (ENOSPC); ")


def test_write_failure_only_claims_write_errors(tmp_path):
    run = tmp_path / "run"
    inside = OSError(errno.EACCES, "Permission denied", str(run / "monitor.csv"))
    elsewhere = OSError(errno.EACCES, "Permission denied", "/etc/somewhere")
    assert "could not write" in str(rundir.write_failure(inside, run))
    assert rundir.write_failure(elsewhere, run) is None  # not the run's write: a traceback, as before
    assert rundir.write_failure(OSError(errno.ENOSPC, "No space left on device"), run) is not None
    assert rundir.write_failure(ValueError("x"), run) is None


def _can_mount_tmpfs() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, timeout=30
    )
    return probe.returncode == 0


FULL_DISK = """
set -u
mount -t tmpfs -o size=600k tmpfs "$DISK"
{train} --run-dir "$DISK/run"
echo "status=$?"
"$PYTHON" -c "
import sys, pathlib
from distrl.run import checkpoint
run = pathlib.Path(sys.argv[1])
print('left', sorted(p.name for p in (run / 'checkpoints').iterdir()))
print('damaged', [p.name for p in checkpoint.checkpoints_of(run) if checkpoint.verify(p)])
" "$DISK/run"
mount -o remount,size=64m "$DISK"
"$PYTHON" -m distrl train ppo CartPole-v1 --resume "$DISK/run" --quiet
echo "resumed=$?"
ls "$DISK/run"
"""


@pytest.mark.skipif(not _can_mount_tmpfs(), reason="needs user and mount namespaces (unshare -rm) for a small tmpfs")
@pytest.mark.parametrize("strategy", ["single", pytest.param("ddp", marks=pytest.mark.slow)])
def test_a_full_disk_ends_the_run_in_one_line_and_resume_continues_once_there_is_space(tmp_path, strategy):
    """A real full filesystem: a 600 KB tmpfs in a mount namespace of this test's own; then it grows and the run
    resumes. Under ddp rank 0's failure ends rank 1 too, as any failed rank does."""
    disk = tmp_path / "disk"
    disk.mkdir()
    spread = "--strategy ddp --workers 2" if strategy == "ddp" else ""
    train = f'"$PYTHON" -m distrl train ppo CartPole-v1 --total-steps 40000 --checkpoint-every 2048 --quiet {spread}'
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", FULL_DISK.format(train=train)],
        env={**os.environ, "DISK": str(disk), "PYTHON": sys.executable},  # this interpreter, whatever PATH says
        capture_output=True,
        text=True,
        timeout=300,
    )
    out, err = result.stdout, result.stderr
    assert "status=1" in out, out + err
    errors = [line for line in err.splitlines() if line.startswith("distrl: error:")]
    assert (
        errors and "No space left on device (ENOSPC); free some space on that disk, then continue from" in errors[-1]
    ), err
    if strategy == "ddp":
        assert errors[-1].startswith("distrl: error: rank 0 failed (exit status 1): distrl: error: could not write")
    else:
        assert len(errors) == 1 and "Traceback" not in err
    assert "damaged []" in out  # every checkpoint left is whole
    assert "left ['step-" in out and ".tmp-" not in out
    assert "resumed=0" in out, out + err
    assert "model" in out.split("resumed=0")[1]


def test_a_run_directory_that_cannot_be_made_is_refused_before_any_rank_starts(tmp_path, capsys):
    (tmp_path / "file").write_text("not a directory")
    assert main(short_run(tmp_path / "file" / "run", "--strategy", "ddp", "--workers", "2")) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"distrl: error: run_dir={str(tmp_path / 'file' / 'run')!r} cannot be made (Not a directory): "
        "must be a directory you can write"
    ]


# ---- damaged checkpoints, retention ----


def test_a_damaged_checkpoint_is_named_and_resume_falls_back_to_the_newest_intact_one(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(short_run(run, "--checkpoint-every", "128", "--total-steps", "384")) == 0
    flip_a_byte(run / "model")
    flip_a_byte(run / "checkpoints" / f"step-{256:012d}")

    capsys.readouterr()
    assert main(["eval", str(run / "model"), "--episodes", "1"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"distrl: error: checkpoint={str(run / 'model')!r}: tensors.safetensors is damaged (sha256 differs from the "
        "one recorded when it was written): resume from an earlier checkpoint of the run, or restore this one "
        "from a copy"
    ]

    assert main(["train", "ppo", "CartPole-v1", "--resume", str(run), "--quiet"]) == 0
    err = capsys.readouterr().err
    good = run / "checkpoints" / f"step-{128:012d}"
    for skipped in (run / "model", run / "checkpoints" / f"step-{256:012d}"):
        assert f"distrl: note: skipped checkpoint={str(skipped)!r}: tensors.safetensors is damaged" in err
    assert f"going on from {good}" in err
    assert f"resumed at step 128 from {good}" in (run / "events.log").read_text()
    assert checkpoint.verify(run / "model") is None  # the final model was written again, whole


def test_keep_checkpoints_keeps_the_newest_periodic_ones_and_the_model(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(short_run(run, "--checkpoint-every", "64", "--keep-checkpoints", "2")) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step-{384:012d}", f"step-{448:012d}"]
    assert (run / "model").is_dir()
    capsys.readouterr()
    assert main(short_run(tmp_path / "other", "--keep-checkpoints", "-1")) == 2
    assert "keep_checkpoints=-1 is not allowed: must be >= 0 (0: keep all)" in capsys.readouterr().err
