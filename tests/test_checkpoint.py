"""Checkpoint files: atomic writes under a full disk, clear load errors, resume fallback."""
from __future__ import annotations

import errno
import hashlib
import logging
import os
from pathlib import Path

import pytest
import torch

from mdk.checkpoint.files import (CheckpointError, NonFiniteWeightsError, atomic_save, load_checkpoint,
                            load_model_weights, save_checkpoint)
from mdk.checkpoint.layout import find_resume, iteration


def _state(it: int, value: float = 1.0) -> dict:
    return {"model": {"w": torch.full((4, 3), value), "b": torch.zeros(4)},
            "optimizer": {"state": {}, "param_groups": []}, "iter": it, "epoch": 0}


def _sha(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_atomic_save_roundtrip_mode_and_no_temp_left(tmp_path):
    p = tmp_path / "step1" / "last.pth"
    atomic_save(_state(3), p)
    assert load_checkpoint(p)["iter"] == 3
    assert [q.name for q in p.parent.iterdir()] == ["last.pth"]
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask


def test_disk_full_keeps_previous_checkpoint(tmp_path, monkeypatch):
    p = tmp_path / "last.pth"
    atomic_save(_state(2), p)
    before = _sha(p)
    real_write, calls = os.write, []

    def full_disk(fd, data):  # the first chunk lands, then the disk is full
        calls.append(len(data))
        if len(calls) > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, bytes(data[: len(data) // 2]))

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(CheckpointError) as ei:
        atomic_save(_state(4, 2.0), p)
    monkeypatch.undo()
    msg = str(ei.value)
    assert str(p) in msg and "disk is full" in msg and "previous last.pth is intact" in msg
    assert "paths.checkpoints" in msg
    assert _sha(p) == before and load_checkpoint(p)["iter"] == 2
    assert [q.name for q in tmp_path.iterdir()] == ["last.pth"]  # the temp file is gone


def test_save_refuses_nan_weights_and_keeps_last_good(tmp_path):
    p = tmp_path / "last.pth"
    save_checkpoint(_state(2), p)
    before = _sha(p)
    bad = _state(3, float("nan"))
    with pytest.raises(NonFiniteWeightsError, match=r"iteration 3 \(e\.g\. w\).*keeps the last good"):
        save_checkpoint(bad, p)
    assert _sha(p) == before


@pytest.mark.parametrize("content, needle", [
    (b"", "is empty (0 bytes)"),
    (b"hello, I am a text file\n", "is not a PyTorch checkpoint (it starts with b'hell'"),
    (None, "is truncated or damaged"),
])
def test_unreadable_files_are_named_and_explained(tmp_path, content, needle):
    p = tmp_path / "last.pth"
    if content is None:  # a real checkpoint cut in half
        atomic_save(_state(1), p)
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
    else:
        p.write_bytes(content)
    before = _sha(p)
    with pytest.raises(CheckpointError) as ei:
        load_checkpoint(p)
    assert str(p) in str(ei.value) and needle in str(ei.value), str(ei.value)
    assert "Traceback" not in str(ei.value) and _sha(p) == before


def test_foreign_pickles_are_not_mdk_checkpoints(tmp_path):
    p = tmp_path / "x.pth"
    torch.save({"conv.weight": torch.zeros(2)}, p)
    with pytest.raises(CheckpointError, match=r"not an mdk checkpoint \(a bare state_dict \(1 tensors\)"):
        load_checkpoint(p)
    torch.save([1, 2, 3], p)
    with pytest.raises(CheckpointError, match=r"a list without a 'model' entry"):
        load_checkpoint(p)


def test_find_resume_falls_back_from_truncated_last_to_best(tmp_path, caplog):
    atomic_save(_state(8), tmp_path / "best.pth")
    (tmp_path / "last.pth").write_bytes(b"PK\x03\x04 cut off")
    with caplog.at_level(logging.WARNING):
        state, path = find_resume(tmp_path)
    assert path == tmp_path / "best.pth" and iteration(state) == 8
    # The bad file is moved aside, byte for byte, not deleted.
    assert (tmp_path / "last.pth.corrupt").read_bytes() == b"PK\x03\x04 cut off"
    assert not (tmp_path / "last.pth").exists()
    assert "last.pth is truncated or damaged" in caplog.text and "last.pth.corrupt" in caplog.text


def test_find_resume_prefers_newest_and_removes_stale_temps(tmp_path, caplog):
    atomic_save(_state(6), tmp_path / "last.pth")
    atomic_save(_state(8), tmp_path / "best.pth")  # a kill came between best and last
    stale = tmp_path / ".last.pth.abc123.tmp"
    stale.write_bytes(b"half")
    with caplog.at_level(logging.WARNING):
        state, path = find_resume(tmp_path)
    assert path.name == "best.pth" and iteration(state) == 8 and not stale.exists()
    assert "newer than last.pth" in caplog.text and "interrupted" in caplog.text
    assert find_resume(tmp_path / "nothing") == (None, None)


def test_incompatible_model_names_the_tensors(tmp_path):
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 4, 1))
    other = torch.nn.Sequential(torch.nn.Conv2d(3, 16, 3), torch.nn.Conv2d(16, 4, 1))
    with pytest.raises(CheckpointError) as ei:
        load_model_weights(model, other.state_dict(), tmp_path / "best.pth")
    msg = str(ei.value)
    assert "3 shape mismatch(es)" in msg and "0.weight: checkpoint (16, 3, 3, 3) vs model (8, 3, 3, 3)" in msg
    assert str(tmp_path / "best.pth") in msg
