"""Catalogue entries of resuming: one run per checkpoint folder (the lock), and a checkpoint that
knows what it means and what it was trained with (mdk/checkpoint/meaning.py). Through the real
command: in this process (``cli``), and as a separate ``python run.py`` where a second process
must hold the folder (or die holding it)."""
from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from conftest import REPO, run_cmd_env
from mdk.folder_lock import LOCK_NAME
from helpers.catalogue import argv_of, assert_intact, cli, one_error_line, snapshot

SWAPPED = "dataset.class_names=[square,circle,triangle,star,cross]"  # same count, other order
# No decay within these few iterations (the lr shows the base lr), through a 50-iteration warmup
STEP = ("scheduler=step", "scheduler.warmup.iters=50")


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """A finished tiny step1 (1 epoch of 2 iterations, optim.lr=0.002), made once."""
    tmp = tmp_path_factory.mktemp("meaning")
    return tmp


@pytest.fixture
def run_dir(trained, tmp_path, capsys) -> Path:
    """tmp_path with a copy of the trained step1 checkpoints under ck/."""
    if not (trained / "ck").exists():
        status, _, err = cli(trained, *STEP, capsys=capsys)
        assert status == 0, err[-2000:]
    shutil.copytree(trained / "ck", tmp_path / "ck")
    (tmp_path / "data").symlink_to(trained / "data")
    return tmp_path


def _ck(tmp: Path, name: str = "last.pth") -> dict:
    return torch.load(tmp / "ck" / "step1" / name, weights_only=False)


def _start(tmp: Path, fault: str, *args: str) -> tuple[subprocess.Popen, Path]:
    """A real `python run.py` on tmp's folders, with MDK_FAULT=fault; (process, its log)."""
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", MDK_FAULT=fault,
               MDK_FAULT_RELEASE=str(tmp / "release"))  # a hold ends once the test makes it
    log = tmp / "first.log"
    with open(log, "w") as f:
        proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), *argv_of(tmp, args),
                                 f"hydra.run.dir={tmp / 'first_run'}"], cwd=REPO, env=env,
                                stdout=f, stderr=subprocess.STDOUT, text=True)
    return proc, log


def _wait_for(proc: subprocess.Popen, log: Path, marker: str, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while marker not in log.read_text():
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < end, f"{marker!r} never logged:\n{log.read_text()[-3000:]}"
        time.sleep(0.1)


@pytest.mark.slow
def test_a_second_run_on_the_same_folder_refuses_and_the_first_finishes(tmp_path, capsys):
    first, log = _start(tmp_path, "hold:iter:1", *STEP)
    try:
        _wait_for(first, log, "holding at iter 1")  # inside its stage: the folder is locked
        lock = tmp_path / "ck" / LOCK_NAME
        held = lock.read_text()
        status, out, err = cli(tmp_path, *STEP, capsys=capsys)
        one_error_line(status, err, f"checkpoint error: {tmp_path / 'ck'} is in use by the run "
                       f"of pid {first.pid} on host {socket.gethostname()} since ",
                       f"its run dir: {tmp_path / 'first_run'}, its lock: {lock}); wait for it to "
                       "end, or give this run another paths.checkpoints")
        assert "=== step1 ===" not in out  # refused before any stage started
        assert lock.read_text() == held  # the first run's lock is untouched
        (tmp_path / "release").touch()  # the first run goes on from its hold
        assert first.wait(timeout=240) == 0, log.read_text()[-3000:]
    finally:
        if first.poll() is None:
            first.kill()
    assert _ck(tmp_path)["trainer"]["iter"] == 2  # the first run finished its stage
    assert lock.read_text() == ""  # released when it ended


def test_the_lock_of_a_killed_run_is_taken_over(tmp_path, capsys):
    first, log = _start(tmp_path, "kill:iter:1", *STEP)
    assert first.wait(timeout=240) == -signal.SIGKILL, log.read_text()[-3000:]
    lock = tmp_path / "ck" / LOCK_NAME
    assert f'"pid": {first.pid}' in lock.read_text()  # left behind by the killed run
    status, out, err = cli(tmp_path, *STEP, capsys=capsys)
    assert status == 0, err[-2000:]
    assert (f"taking over {lock}: the run of pid {first.pid} on host {socket.gethostname()} "
            "since ") in out and "ended without releasing it (killed or crashed)" in out
    assert _ck(tmp_path)["trainer"]["iter"] == 2 and lock.read_text() == ""


def test_resume_with_another_class_order_refuses(run_dir, capsys):
    before = snapshot(run_dir / "ck")
    status, out, err = cli(run_dir, *STEP, SWAPPED, capsys=capsys)
    one_error_line(status, err, "checkpoint error: dataset.class_names=['square', 'circle', "
                   "'triangle', 'star', 'cross'] differs from the checkpoint's ['circle', "
                   f"'square', 'triangle', 'star', 'cross'] ({run_dir / 'ck' / 'step1'}/last.pth): "
                   "its class channels would mean other classes; use the checkpoint's value, "
                   "give this run another paths.checkpoints, or trainer.resume=false to start "
                   "step1 over")
    assert "=== step1 ===" not in out  # before any process started
    assert_intact(before)


def test_the_next_stage_from_another_class_order_refuses(run_dir, capsys):
    before = snapshot(run_dir / "ck")
    status, _, err = cli(run_dir, *STEP, "step=step2", SWAPPED, capsys=capsys)
    one_error_line(status, err, "checkpoint error: dataset.class_names=['square', 'circle', ",
                   f"({run_dir / 'ck' / 'step1'}/best.pth, the input of step2): its class "
                   "channels would mean other classes; run step=step1 again with this value")
    assert_intact(before)


def test_a_changed_lr_applies_from_the_resume_point_and_is_logged(run_dir, capsys):
    status, out, err = cli(run_dir, *STEP, "optim.lr=0.02", "trainer.epochs=2", capsys=capsys)
    assert status == 0, err[-2000:]
    assert "=== step1 ===  2 epochs, lr 0.02" in out
    assert ("step1 resumes at iteration 2 with changed hyper-parameters; the new values apply "
            "from there on (the iterations before keep the old ones): optim.lr 0.002 -> 0.02, "
            "trainer.epochs 1 -> 2") in out
    ck = _ck(run_dir)
    assert ck["trainer"]["iter"] == 4 and ck["hparams"]["optim.lr"] == 0.02
    # The lr of step 4 is the new base lr through the warmup (50 iterations from 0.5): 0.02 x 0.54,
    # not the checkpoint's 0.002 x 0.54.
    assert ck["scheduler"]["_last_lr"] == [pytest.approx(0.02 * (0.5 + 0.5 * 4 / 50))]
    assert ck["optimizer"]["param_groups"][0]["lr"] == pytest.approx(0.02 * 0.54)


def test_a_done_stage_with_a_changed_hyper_parameter_says_so(run_dir, capsys):
    before = snapshot(run_dir / "ck")
    status, out, err = cli(run_dir, *STEP, "optim.lr=0.02", capsys=capsys)
    one_error_line(status, err, f"checkpoint error: step1 is already done in {run_dir / 'ck'}/step1 "
                   "and this run changes what it was made with: optim.lr=0.02 differs from the "
                   "checkpoint's 0.002; nothing is left to do, so the new value would not be "
                   "used. Run it again with trainer.resume=false")
    assert "best mAP" not in out and "=== step1 ===" not in out  # no old result reported
    assert_intact(before)


def test_a_checkpoint_without_a_meaning_still_resumes(run_dir, capsys):
    """Files written before checkpoints recorded their meaning: nothing to compare, logged."""
    for name in ("last.pth", "best.pth"):
        p = run_dir / "ck" / "step1" / name
        ck = torch.load(p, weights_only=False)
        del ck["meaning"], ck["hparams"]
        torch.save(ck, p)
    status, out, err = cli(run_dir, *STEP, "trainer.epochs=2", capsys=capsys)
    assert status == 0, err[-2000:]
    assert "last.pth was written before checkpoints recorded what they mean and were trained " \
           "with: this run's config is not compared with it" in out
    assert _ck(run_dir)["trainer"]["iter"] == 4 and "meaning" in _ck(run_dir)


def test_another_optimizer_class_on_resume_starts_its_state_fresh(tmp_path, capsys):
    """SGD's momentum cannot continue as AdamW's moments (torch raised KeyError: 'step')."""
    status, _, err = cli(tmp_path, *STEP, "optim=sgd", capsys=capsys)
    assert status == 0, err[-2000:]
    status, out, err = cli(tmp_path, *STEP, "optim=adamw", "trainer.epochs=2", capsys=capsys)
    assert status == 0, err[-2000:]
    assert "optim._target_ 'torch.optim.SGD' -> 'torch.optim.AdamW'" in out
    assert "; another class: the optimizer state starts fresh" in out
    ck = _ck(tmp_path)
    assert ck["trainer"]["iter"] == 4
    assert all(s["step"] == 2 for s in ck["optimizer"]["state"].values())  # AdamW's 2 steps
