import errno
import hashlib
import json
import os
import shutil

import pytest
import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from distrl.config import ConfigError
from distrl.run import checkpoint


def step_dir(run_dir, steps):
    return run_dir / checkpoint.CHECKPOINTS_DIR / f"step-{steps:012d}"


def make_run(run_dir, steps=(1, 2, 3), model=False):
    """A run directory with a periodic checkpoint per entry of ``steps`` (and the final model)."""
    for n in steps:
        checkpoint.save(step_dir(run_dir, n), {"w": torch.full((1000,), float(n))}, {"steps": n})
    if model:
        final = max(steps) + 1
        checkpoint.save(run_dir / checkpoint.MODEL_DIR, {"w": torch.full((1000,), float(final))}, {"steps": final})
    return run_dir


def flip_a_byte(path):
    """Flip one byte in the middle of a checkpoint's tensor data: its header still reads."""
    file = path / checkpoint.TENSORS
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))


def truncate(path):
    file = path / checkpoint.TENSORS
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2])


def test_digest_recorded_is_the_tensor_files_sha256(tmp_path):
    tensors = {"a": torch.arange(1000.0), "b": torch.ones(2, 3)}
    path = checkpoint.save(tmp_path / "ck", tensors, {"steps": 5, checkpoint.DIGEST: "stale"})
    state = json.loads((path / checkpoint.STATE).read_text())
    assert state[checkpoint.DIGEST] == hashlib.sha256((path / checkpoint.TENSORS).read_bytes()).hexdigest()
    assert state["format_version"] == checkpoint.FORMAT_VERSION == 1
    assert checkpoint.verify(path) is None
    loaded, state = checkpoint.load(path)
    assert state["steps"] == 5
    torch.testing.assert_close(loaded["a"], tensors["a"], rtol=0, atol=0)


def test_a_flipped_byte_is_found_by_the_digest(tmp_path):
    """A damaged tensor file that safetensors itself still reads is refused by load and verify, naming it."""
    path = checkpoint.save(tmp_path / "ck", {"a": torch.arange(1000.0)}, {"steps": 1})
    flip_a_byte(path)
    assert not torch.equal(load_file(str(path / checkpoint.TENSORS))["a"], torch.arange(1000.0))  # reads, wrongly
    with pytest.raises(ConfigError) as raised:
        checkpoint.load(path)
    message = str(raised.value)
    assert message.startswith(f"checkpoint={str(path)!r}: tensors.safetensors is damaged (sha256 differs")
    assert "\n" not in message
    assert checkpoint.verify(path) == message


def test_a_truncated_tensor_file_is_found_with_or_without_a_digest(tmp_path):
    path = checkpoint.save(tmp_path / "ck", {"a": torch.arange(1000.0)}, {"steps": 1})
    truncate(path)
    with pytest.raises(ConfigError, match=r"tensors\.safetensors is truncated or corrupt"):
        checkpoint.load(path)
    assert "truncated" in checkpoint.verify(path)
    drop_digest(path)  # as written before distrl recorded it: the header check still finds it
    assert "truncated" in checkpoint.verify(path)


def drop_digest(path):
    state = json.loads((path / checkpoint.STATE).read_text())
    del state[checkpoint.DIGEST]
    (path / checkpoint.STATE).write_text(json.dumps(state))


def test_a_checkpoint_without_a_digest_still_loads(tmp_path):
    path = checkpoint.save(tmp_path / "ck", {"a": torch.arange(1000.0)}, {"steps": 9})
    drop_digest(path)
    assert checkpoint.verify(path) is None
    loaded, state = checkpoint.load(path)
    assert state["steps"] == 9 and checkpoint.DIGEST not in state
    assert torch.equal(loaded["a"], torch.arange(1000.0))
    assert checkpoint.find_intact(path) == (path, [])


def test_find_intact_falls_back_past_damaged_checkpoints_with_a_note_each(tmp_path):
    run = make_run(tmp_path / "run", model=True)
    flip_a_byte(run / checkpoint.MODEL_DIR)
    truncate(step_dir(run, 3))
    assert checkpoint.find_latest(run) == run / checkpoint.MODEL_DIR  # unchanged: the newest, intact or not
    found, notes = checkpoint.find_intact(run)
    assert found == step_dir(run, 2)
    assert len(notes) == 2
    assert notes[0].startswith(f"skipped checkpoint={str(run / checkpoint.MODEL_DIR)!r}: ") and "damaged" in notes[0]
    assert notes[1].startswith(f"skipped checkpoint={str(step_dir(run, 3))!r}: ") and "truncated" in notes[1]
    assert checkpoint.load(found)[1]["steps"] == 2
    # nothing damaged: the newest, and no notes
    assert checkpoint.find_intact(make_run(tmp_path / "clean")) == (step_dir(tmp_path / "clean", 3), [])


def test_find_intact_with_no_intact_checkpoint_is_a_config_error(tmp_path):
    run = make_run(tmp_path / "run")
    for n in (1, 2, 3):
        flip_a_byte(step_dir(run, n))
    with pytest.raises(ConfigError) as raised:
        checkpoint.find_intact(run)
    message = str(raised.value)
    assert message.startswith(f"run={str(run)!r} holds no intact checkpoint (3 damaged); the newest: ")
    assert str(step_dir(run, 3)) in message and "damaged" in message
    with pytest.raises(ConfigError, match="does not exist"):
        checkpoint.find_intact(tmp_path / "nope")


def test_a_damaged_checkpoint_named_directly_has_no_fallback(tmp_path):
    run = make_run(tmp_path / "run")
    flip_a_byte(step_dir(run, 3))
    with pytest.raises(ConfigError) as raised:
        checkpoint.find_intact(step_dir(run, 3))
    assert str(raised.value).startswith(f"checkpoint={str(step_dir(run, 3))!r}: tensors.safetensors is damaged")
    assert checkpoint.find_intact(step_dir(run, 2)) == (step_dir(run, 2), [])


def test_prune_keeps_the_newest_periodic_checkpoints_and_the_model(tmp_path):
    run = make_run(tmp_path / "run", steps=(10, 20, 30, 40, 50), model=True)
    leftover = run / checkpoint.CHECKPOINTS_DIR / ".step-000000000060.tmp-999999"
    leftover.mkdir()
    assert checkpoint.prune(run, 0) == [] and checkpoint.prune(run, -1) == []
    assert len(checkpoint.checkpoints_of(run)) == 6
    removed = checkpoint.prune(run, 2)
    assert removed == [step_dir(run, 30), step_dir(run, 20), step_dir(run, 10)]
    assert sorted(os.listdir(run / checkpoint.CHECKPOINTS_DIR)) == [
        leftover.name,
        "step-000000000040",
        "step-000000000050",
    ]
    assert checkpoint.load(run / checkpoint.MODEL_DIR)[1]["steps"] == 51
    assert checkpoint.prune(run, 2) == []


def test_a_crash_mid_prune_leaves_nothing_find_latest_would_pick(tmp_path, monkeypatch):
    """The directory is renamed out of sight before its files go, so a removal cut short hides it whole."""
    run = make_run(tmp_path / "run", steps=(1, 2))

    def dies_half_way(path, *args, **kwargs):
        (path / checkpoint.STATE).unlink()
        raise OSError(errno.EIO, "killed half way", str(path))

    monkeypatch.setattr(checkpoint.shutil, "rmtree", dies_half_way)
    with pytest.raises(OSError):
        checkpoint.prune(run, 1)
    monkeypatch.undo()
    assert checkpoint.checkpoints_of(run) == [step_dir(run, 2)]
    assert checkpoint.find_intact(run) == (step_dir(run, 2), [])


def failing_writer(message):
    def save_file(*args, **kwargs):
        raise SafetensorError(message)

    return save_file


def test_a_full_disk_is_an_oserror_and_the_old_checkpoint_stays(tmp_path, monkeypatch):
    path = checkpoint.save(tmp_path / "ck", {"a": torch.zeros(10)}, {"steps": 1})
    full = "Error while serializing: I/O error: No space left on device (os error 28)"
    monkeypatch.setattr(checkpoint, "save_file", failing_writer(full))
    with pytest.raises(OSError) as raised:
        checkpoint.save(path, {"a": torch.ones(10)}, {"steps": 2})
    assert raised.value.errno == errno.ENOSPC and raised.value.strerror == os.strerror(errno.ENOSPC)
    assert raised.value.filename.endswith(checkpoint.TENSORS)
    assert os.listdir(tmp_path) == ["ck"]
    tensors, state = checkpoint.load(path)
    assert state["steps"] == 1 and torch.equal(tensors["a"], torch.zeros(10))
    # a safetensors failure that names no os error is still an OSError
    monkeypatch.setattr(checkpoint, "save_file", failing_writer("Error while serializing: something else"))
    with pytest.raises(OSError) as raised:
        checkpoint.save(tmp_path / "other", {"a": torch.ones(10)}, {"steps": 2})
    assert raised.value.errno == errno.EIO
    assert os.listdir(tmp_path) == ["ck"]


def test_the_original_error_is_raised_when_cleaning_up_fails_too(tmp_path, monkeypatch):
    full = "Error while serializing: I/O error: No space left on device (os error 28)"
    monkeypatch.setattr(checkpoint, "save_file", failing_writer(full))
    real_rmtree = shutil.rmtree

    def rmtree_that_fails(path, ignore_errors=False, **kwargs):  # as shutil.rmtree does when it cannot remove
        if not ignore_errors:
            raise OSError(errno.EBUSY, os.strerror(errno.EBUSY), str(path))

    monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree_that_fails)
    with pytest.raises(OSError) as raised:
        checkpoint.save(tmp_path / "ck", {"a": torch.ones(10)}, {"steps": 2})
    assert raised.value.errno == errno.ENOSPC
    monkeypatch.undo()
    real_rmtree(tmp_path / f".ck.tmp-{os.getpid()}")  # the removal that "failed"


def test_a_failed_rename_puts_the_old_checkpoint_back(tmp_path, monkeypatch):
    path = checkpoint.save(tmp_path / "ck", {"a": torch.zeros(10)}, {"steps": 1})
    real_replace = os.replace

    def replace(src, dst):
        if os.path.basename(src).startswith(".ck.tmp-"):
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(src))
        real_replace(src, dst)

    monkeypatch.setattr(checkpoint.os, "replace", replace)
    with pytest.raises(OSError):
        checkpoint.save(path, {"a": torch.ones(10)}, {"steps": 2})
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["ck"]
    assert checkpoint.load(path)[1]["steps"] == 1


def test_real_write_failures_are_oserrors_that_leave_nothing(tmp_path, monkeypatch):
    # the directory vanishes while the tensors are written: safetensors' own error, as an OSError
    run = tmp_path / "run"
    run.mkdir()
    real_save_file = checkpoint.save_file

    def vanishing(tensors, filename, **kwargs):
        shutil.rmtree(run)
        real_save_file(tensors, filename, **kwargs)

    monkeypatch.setattr(checkpoint, "save_file", vanishing)
    with pytest.raises(OSError) as raised:
        checkpoint.save(run / "ck", {"a": torch.ones(10)}, {"steps": 1})
    assert raised.value.errno == errno.ENOENT and raised.value.filename
    assert os.listdir(tmp_path) == []
    monkeypatch.undo()
    # a file where the checkpoint or a folder above it should be: it stays as it was
    blocker = tmp_path / "blocker"
    blocker.write_text("mine")
    for target in (blocker, blocker / "ck"):
        with pytest.raises(OSError) as raised:
            checkpoint.save(target, {"a": torch.ones(10)}, {"steps": 1})
        assert raised.value.errno in (errno.ENOTDIR, errno.EEXIST) and raised.value.filename
        assert os.listdir(tmp_path) == ["blocker"] and blocker.read_text() == "mine"
