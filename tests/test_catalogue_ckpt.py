"""Catalogue, checkpoint and training-fault entries: bad files in the checkpoint folder, a full
disk, an incompatible model, NaN losses. Each asserts what the user sees, the exit status and that
the good files are untouched (a bad file is moved aside byte for byte, never deleted)."""
from __future__ import annotations

import errno
import shutil
from pathlib import Path

import pytest
import torch

from mdk.checkpoint import files as checkpoint
from helpers.catalogue import assert_intact, cli, one_error_line, snapshot


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """Where a finished tiny step1 (2 iterations, last.pth + best.pth) is made once (by run_dir)."""
    return tmp_path_factory.mktemp("trained")


@pytest.fixture
def run_dir(trained, tmp_path, capsys) -> Path:
    """tmp_path with a copy of the trained step1 checkpoints under ck/."""
    src = trained / "ck"
    if not src.exists():
        status, _, err = cli(trained, capsys=capsys)
        assert status == 0, err[-2000:]
    shutil.copytree(src, tmp_path / "ck")
    (tmp_path / "data").symlink_to(trained / "data")
    return tmp_path


def step1(tmp: Path, name: str = "last.pth") -> dict:
    return torch.load(tmp / "ck" / "step1" / name, weights_only=False)


def test_truncated_last_falls_back_to_best(run_dir, capsys):
    last = run_dir / "ck" / "step1" / "last.pth"
    last.write_bytes(last.read_bytes()[:3000])
    before = snapshot(run_dir / "ck")
    status, out, err = cli(run_dir, "trainer.epochs=2", capsys=capsys)
    assert status == 0, err[-2000:]
    assert f"checkpoint {last} is truncated or damaged" in out
    assert "last.pth.corrupt" in out and "resuming from" in out and "best.pth (iteration 2)" in out
    assert_intact({k: v for k, v in before.items() if k != last})
    assert_intact({last: before[last]}, moved={last: last.with_name("last.pth.corrupt")})
    assert step1(run_dir)["trainer"]["iter"] == 4  # resumed at 2, trained epoch 2


def test_foreign_last_and_no_best_starts_over_with_a_warning(run_dir, capsys):
    d = run_dir / "ck" / "step1"
    (d / "best.pth").unlink()
    (d / "last.pth").write_text("these are my notes, not a checkpoint\n")
    status, out, err = cli(run_dir, capsys=capsys)
    assert status == 0, err[-2000:]
    assert f"checkpoint {d / 'last.pth'} is not a PyTorch checkpoint (it starts with b'thes'" in out
    assert (d / "last.pth.corrupt").read_text() == "these are my notes, not a checkpoint\n"
    assert step1(run_dir)["trainer"]["iter"] == 2  # trained from scratch


def test_truncated_stage_input(run_dir, capsys):
    best = run_dir / "ck" / "step1" / "best.pth"
    best.write_bytes(best.read_bytes()[:3000])
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, "step=step2", capsys=capsys)
    one_error_line(status, err, f"checkpoint error: checkpoint {best} is truncated or damaged",
                   "it is the input of step2: run `python run.py step=step1` again")
    assert_intact(before)


def test_foreign_pretrained_file_in_step0(run_dir, capsys):
    d = run_dir / "ck" / "step0"
    d.mkdir()
    torch.save({"backbone.weight": torch.zeros(3)}, d / "imagenet.pth")
    shutil.rmtree(run_dir / "ck" / "step1")
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, capsys=capsys)
    one_error_line(status, err, f"checkpoint {d / 'imagenet.pth'} is none of the files mdk starts "
                   "from (a state_dict of 1 tensors named like ['backbone.weight'])",
                   "a GTI MDK checkpoint (features.conv{i}...) or a torchvision VGG file",
                   "pretrained starting point of step1 (step0/)")
    assert_intact(before)


def _forget_meaning(d: Path) -> None:
    """Make the checkpoints in ``d`` look written before checkpoints recorded their meaning."""
    for p in d.glob("*.pth"):
        ck = torch.load(p, weights_only=False)
        del ck["meaning"], ck["hparams"]
        torch.save(ck, p)


def test_input_from_an_incompatible_model(run_dir, capsys):
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, "step=step2", "model.net.channels=[8,M,8,M,8,M,8,M,8,M,16]",
                         capsys=capsys)
    one_error_line(status, err, "checkpoint error: model.net.channels=[8, 'M', 8, 'M', 8, 'M', 8, "
                   "'M', 8, 'M', 16] differs from the checkpoint's [8, 'M', 8, 'M', 8, 'M', 8, 'M', "
                   "8, 'M', 8]", "step1/best.pth, the input of step2): its weights belong to the "
                   "other model; run step=step1 again with this value")
    assert_intact(before)
    _forget_meaning(run_dir / "ck" / "step1")  # an older file: its tensors tell
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, "step=step2", "model.net.channels=[8,M,8,M,8,M,8,M,8,M,16]",
                         capsys=capsys)
    one_error_line(status, err, "checkpoint error: checkpoint", "step1/best.pth does not fit this "
                   "model", "layers.5.conv.weight: checkpoint (8, 8, 3, 3) vs model (16, 8, 3, 3)",
                   "it is the input of step2")
    assert_intact(before)


def test_own_checkpoint_from_another_model(run_dir, capsys):
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, "dataset.class_names=[a,b,c]", "dataset.num_classes=3",
                         capsys=capsys)
    one_error_line(status, err, "checkpoint error: dataset.class_names=['a', 'b', 'c'] differs "
                   "from the checkpoint's ['circle', 'square', 'triangle', 'star', 'cross']",
                   "use the checkpoint's value, give this run another paths.checkpoints, or "
                   "trainer.resume=false to start step1 over")
    assert_intact(before)
    _forget_meaning(run_dir / "ck" / "step1")  # an older file: its tensors tell
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, "dataset.class_names=[a,b,c]", "dataset.num_classes=3",
                         capsys=capsys)
    one_error_line(status, err, "checkpoint error:", "does not fit this model", "shape mismatch",
                   "use another paths.checkpoints, or trainer.resume=false")
    assert_intact(before)


def test_disk_full_while_saving(run_dir, capsys, monkeypatch):
    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(checkpoint, "_write_all", full)
    last = run_dir / "ck" / "step1" / "last.pth"
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, "trainer.epochs=2", "trainer.checkpoint_every_iters=1",
                         capsys=capsys)
    one_error_line(status, err, f"checkpoint error: could not write checkpoint {last}: the disk is "
                   "full", "the previous last.pth is intact", "run the same command again")
    assert_intact(before)
    assert not list(last.parent.glob(".*.tmp"))


def test_nan_loss_stops_naming_iteration_and_term(run_dir, capsys, monkeypatch):
    monkeypatch.setenv("MDK_FAULT", "nan:iter:3")
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, "trainer.epochs=2", "trainer.checkpoint_every_iters=1",
                         capsys=capsys)
    one_error_line(status, err, "training stopped: loss is not finite at iteration 3: term(s) [")
    assert_intact(before)  # iteration 2's last.pth stays; iteration 3 was never stepped or saved


def test_nan_skip_limit_skips_then_stops(run_dir, capsys, monkeypatch):
    monkeypatch.setenv("MDK_FAULT", "nan:iter:3")
    status, out, err = cli(run_dir, "trainer.epochs=2", "trainer.nan_skip_limit=1", capsys=capsys)
    assert status == 0, err[-2000:]
    assert "skipping this batch (1 of trainer.nan_skip_limit=1)" in out
    ck = step1(run_dir)
    assert ck["trainer"]["iter"] == 4 and not checkpoint.nonfinite_tensors(ck["model"])
    monkeypatch.setenv("MDK_FAULT", "nan:iter:5,nan:iter:6")
    status, _, err = cli(run_dir, "trainer.epochs=3", "trainer.nan_skip_limit=1", capsys=capsys)
    one_error_line(status, err, "loss is not finite at iteration 6",
                   "(trainer.nan_skip_limit=1 bad batches were already skipped)")


def test_hold_fault_waits_for_a_stop_request(monkeypatch):
    """The ``hold`` fault the SLURM requeue test relies on: it returns once a stop is requested,
    and by itself after HOLD_S seconds."""
    import threading
    import time

    from mdk import faults
    from mdk import stop

    monkeypatch.setenv(faults.ENV, "hold:iter:3")
    monkeypatch.setattr(faults, "HOLD_S", 0.5)
    stop.clear_stop()
    t0 = time.monotonic()
    faults.at("iter", 2)  # not the held iteration: no wait
    assert time.monotonic() - t0 < 0.1
    faults.at("iter", 3)  # nobody asks to stop: waits HOLD_S, then goes on
    assert 0.5 <= time.monotonic() - t0 < 2.0
    timer = threading.Timer(0.1, stop.request_stop, args=("SIGTERM",))
    timer.start()
    t0 = time.monotonic()
    try:
        monkeypatch.setattr(faults, "HOLD_S", 30.0)
        faults.at("iter", 3)  # released by the stop request, long before HOLD_S
        assert time.monotonic() - t0 < 5.0 and stop.stop_requested() == "SIGTERM"
    finally:
        timer.cancel()
        stop.clear_stop()


def test_unwritable_checkpoint_folder_fails_before_any_compute(tmp_path, capsys):
    """paths.checkpoints under a folder that takes no files (here /proc, where even root's
    os.access says writable): one config error before the data is built or a step is taken."""
    status, out, err = cli(tmp_path, "paths.checkpoints=/proc/mdk_ck", capsys=capsys)
    one_error_line(status, err, "config error: paths.checkpoints='/proc/mdk_ck': /proc is not "
                   "writable", "choose a folder you can write to")
    assert not (tmp_path / "data").exists()  # stopped before the dataset was generated
    assert "epoch" not in out


def test_a_resume_with_no_readable_file_still_checks_the_input_before_anything_runs(run_dir,
                                                                                   capsys):
    """step2's own files unreadable: the engine would start from step1's best.pth, so the
    preflight checks that input (here: another model width) before any file is moved."""
    d = run_dir / "ck" / "step2"
    d.mkdir()
    (d / "last.pth").write_text("these are my notes, not a checkpoint\n")
    status, _, err = cli(run_dir, "step=step2", "model.net.channels=[16,M,8,M,8,M,8,M,8,M,8]",
                         capsys=capsys)
    one_error_line(status, err, str(run_dir / "ck" / "step1" / "best.pth"), "input of step2")
    assert (d / "last.pth").is_file() and not (d / "last.pth.corrupt").exists()
