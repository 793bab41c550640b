"""Faults of the machine around a run, piece by piece without a run (the real commands:
tests/test_disk_faults.py): the log handlers on a closed pipe and a full disk, the one line of a
full or read-only disk's OSError, preflight's free-space sum, a killed or disk-full dataset
generation (docs/errors.md, the disk entries).
"""
from __future__ import annotations

import errno
import logging
import logging.config
import os
import shutil
import signal
import subprocess
import sys

import pytest
from omegaconf import OmegaConf

from conftest import TINY, compose, run_cmd_env
from mdk.compose import compose as compose_app
from launchers.hydra_app.user_error_line import user_error_line
from launchers.processes.log_handlers import ConsoleHandler, RunLogFileHandler
from launchers.processes.rank_ends import RankFailedError
from mdk import preflight
from mdk.data import shapes
from mdk.data.staging import remove_leftovers, staged
from mdk.errors import DiskError, error_line


def test_console_handler_on_a_closed_pipe_is_silent_and_stdout_goes_nowhere(capfd):
    read, write = os.pipe()
    os.close(read)  # the reader (`head`) is gone
    stream = os.fdopen(write, "w")
    h = ConsoleHandler(stream)
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "a line", None, None)
    for _ in range(3):
        h.emit(rec)
    stream.write("more\n")
    stream.flush()  # the exit's flush: the fd is /dev/null now, nothing fails
    assert os.readlink(f"/proc/self/fd/{stream.fileno()}") == os.devnull
    stream.close()
    assert "Logging error" not in capfd.readouterr().err


def test_log_file_on_a_full_disk_says_so_once(tmp_path, capfd, monkeypatch):
    h = RunLogFileHandler(tmp_path / "run.log")
    rec = logging.LogRecord("x", logging.INFO, __file__, 1, "a line", None, None)
    h.emit(rec)

    def full(_text):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(h.stream, "write", full)
    for _ in range(5):
        h.emit(rec)
    err = capfd.readouterr().err
    assert err == (f"warning: could not write the log file {tmp_path / 'run.log'}: the disk is "
                   "full; the run goes on, its log lines only on the console\n")
    h.close()


def test_an_os_error_of_a_full_or_read_only_disk_is_one_line():
    full = OSError(errno.ENOSPC, "No space left on device", "/x/run/.tag.result.json")
    assert error_line(full) == (
        "disk error: /x/run/.tag.result.json: the disk is full; free space there, or set "
        "paths.checkpoints, paths.data or hydra.run.dir to a folder on another disk, then run "
        "the same command again")
    assert error_line(PermissionError(errno.EACCES, "Permission denied", "/x")) == (
        "disk error: /x: permission denied; give this user access to it, or set "
        "paths.checkpoints, paths.data or hydra.run.dir to a folder you can write to")
    assert error_line(OSError(errno.EIO, "Input/output error")) is None  # not the user's: a trace
    rank = RankFailedError("rank 1 failed (log: /x/rank1.log):\nTraceback (most recent call "
                           "last):\n  File \"spawn.py\", line 1\nOSError: [Errno 28] No space "
                           "left on device: '/x/run/.tag.result.json'")
    assert user_error_line(rank) == error_line(full).replace("disk error:", "disk error (rank 1):")


def test_preflight_adds_up_what_the_run_writes_per_disk(tmp_path, monkeypatch):
    cfg = compose(TINY + [f"paths.data={tmp_path / 'data'}", f"paths.checkpoints={tmp_path / 'ck'}",
                          "pipeline=[step1,step2]"])
    one = preflight.checkpoint_bytes(cfg)
    weights = sum(v.nbytes for v in preflight.build_model(cfg).state_dict().values())
    assert one == 4 * weights + (1 << 20)
    (tmp_path / "ck" / "step1").mkdir(parents=True)
    (tmp_path / "ck" / "step1" / "last.pth").write_bytes(b"x")  # step1: best.pth + a temp to go
    needs = preflight._needs(cfg, tmp_path, tmp_path / "run")
    assert [n for _, n, _ in needs[:2]] == [(2 + 3) * one, 2 * preflight.RUN_DIR_PER_STAGE]
    assert sum(n for _, n, _ in needs) > 5 * one  # + 64 generated images and their index
    free = sum(n for _, n, _ in needs) - 1
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10**12, 0, free))
    with pytest.raises(DiskError, match=r"not enough free space: .* MB free, this run writes "
                       r"about .* MB on that disk \(paths.checkpoints: 5 checkpoint files of "
                       r"~1.\d MB; the run dir: 8 MB of logs and report pictures; paths.data: "
                       r"0.5 MB of generated images and annotations; the index of 64 images\)"):
        preflight.check_paths(cfg, tmp_path, tmp_path / "run")
    monkeypatch.setattr(shutil, "disk_usage",
                        lambda p: shutil._ntuple_diskusage(10**12, 0, free + 1))
    preflight.check_paths(cfg, tmp_path, tmp_path / "run")


def test_a_killed_generation_is_removed_and_a_live_one_kept(tmp_path, caplog):
    root = tmp_path / "shapes"
    code = ("import os, signal, sys; from pathlib import Path\n"
            "from mdk.data.staging import staged\n"
            f"with staged(Path({str(root)!r})) as tmp:\n"
            "    (tmp / 'Annotations').mkdir(); os.kill(os.getpid(), signal.SIGKILL)")
    killed = subprocess.run([sys.executable, "-c", code], env=run_cmd_env())
    assert killed.returncode == -signal.SIGKILL
    (left,) = tmp_path.glob(".shapes.tmp-*")
    with staged(root) as live:  # a generation running now (its lock held) is never touched
        assert remove_leftovers(root, "the shapes dataset") == [left]
        assert live.is_dir() and not left.exists()
    (tmp_path / ".other.tmp-x").mkdir()  # not a folder of this target: kept
    shapes.ensure_shapes_dataset(root, num_train=2, num_val=1, image_size=32)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp-x", "shapes"]
    assert "writing the shapes dataset was interrupted there" in caplog.text
    assert not (root / ".writing").exists()  # the lock file is no part of the data


def test_a_full_disk_while_generating_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    real = shapes._generate

    def fill_up(out, params):
        real(out, {**params, "num_train": 1, "num_val": 1})  # some files written, then:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shapes, "_generate", fill_up)
    with pytest.raises(DiskError) as e:
        shapes.ensure_shapes_dataset(tmp_path / "shapes", num_train=8, num_val=4, image_size=64)
    assert error_line(e.value) == (
        f"disk error: {tmp_path}: the disk is full; the shapes dataset is generated there (about "
        "0.1 MB): free space there, or set paths.data to a folder on another disk, then run the "
        "same command again")
    assert list(tmp_path.iterdir()) == []  # no half dataset, no temp folder


def test_hydra_job_logging_handlers_are_the_hardened_ones(tmp_path):
    """The job logging Hydra applies to a run (conf/hydra/job_logging/mdk.yaml) gives the root
    logger the robust console and run.log handlers."""
    job_logging = compose_app(["debug=tiny", "hydra.job.name=run"], hydra_config=True).hydra.job_logging
    conf = OmegaConf.to_container(job_logging, resolve=False)
    conf["handlers"]["file"]["filename"] = str(tmp_path / "run.log")  # a run dir's, resolved
    root = logging.getLogger()
    before, level = list(root.handlers), root.level
    try:
        logging.config.dictConfig(conf)  # what Hydra does with it in the job
        made = [h for h in root.handlers if h not in before]
        assert len(made) == 2 and {type(h) for h in made} == {ConsoleHandler, RunLogFileHandler}
    finally:
        for h in list(root.handlers):
            if h not in before:
                root.removeHandler(h)
                h.close()
        for h in before:
            if h not in root.handlers:
                root.addHandler(h)
        root.setLevel(level)
