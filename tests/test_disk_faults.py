"""Faults of the machine around a run, through the real ``python run.py``: a disk that is full
before or during the run, a read-only folder, a stdout closed early, a dataset generation killed
half way, an annotation edited with its old time stamp (docs/errors.md, the disk entries; the
pieces without a run: tests/test_disk_fault_pieces.py).

Full and read-only disks are real: a small tmpfs, or a read-only bind mount, made in a private
mount namespace of the command (``unshare --mount``), so nothing is left mounted. That needs
root (as in CI's container); elsewhere those tests are skipped with the reason.
"""
from __future__ import annotations

import functools
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cmd_env
from helpers.catalogue import SHAPES, TINY_CLI, one_error_line

FULL = "the disk is full"


@functools.cache
def _mount_reason() -> str:
    """Why mounts cannot be made here ('' when they can)."""
    if os.geteuid() != 0:
        return "needs root for a private tmpfs / read-only bind mount (unshare --mount)"
    probe = subprocess.run(["unshare", "--mount", "sh", "-c",
                            "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"cannot mount here: {probe.stderr.strip()[:200]}"


mounts = pytest.mark.skipif(bool(_mount_reason()), reason=_mount_reason() or "-")


def argv_of(tmp: Path, *args: str, run_dir: Path | None = None) -> list[str]:
    return [sys.executable, str(REPO / "run.py"), *TINY_CLI, *SHAPES,
            f"paths.data={tmp / 'data'}", f"paths.checkpoints={tmp / 'ck'}",
            f"hydra.run.dir={run_dir or tmp / 'run'}", *args]


def _in_namespace(mount: str, argv: list[str]) -> list[str]:
    """``argv`` run after ``mount`` (a shell command) in a private mount namespace."""
    return ["unshare", "--mount", "bash", "-c", f"{mount} && exec {shlex.join(argv)}"]


def _popen(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(argv, cwd=REPO, env=dict(run_cmd_env(), OMP_NUM_THREADS="1"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err


def _run(argv: list[str]) -> tuple[int, str, str]:
    return _finish(_popen(argv))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    """The tiny generated dataset, made once (read-only tests need it in place beforehand)."""
    tmp = tmp_path_factory.mktemp("disk")
    status, out, err = _run(argv_of(tmp, "trainer.epochs=1"))
    assert status == 0, err[-2000:]
    return tmp / "data"


@mounts
def test_real_command_run_dir_without_space_is_one_line(tmp_path, data):
    """A run dir on a nearly full disk: one line before anything is built or trained."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = argv_of(tmp_path, f"paths.data={data}", run_dir=mnt / "run")
    status, _, err = _run(_in_namespace(f"mount -t tmpfs -o size=1M tmpfs {mnt}", argv))
    line = one_error_line(status, err, f"disk error: {mnt / 'run'}: not enough free space:",
                          "MB free, this run writes about 4.0 MB on that disk (the run dir: 4 MB "
                          "of logs and report pictures); free space there or point these paths "
                          "at another disk")
    assert err.strip() == line
    assert not (tmp_path / "ck").exists()  # nothing ran


@mounts
def test_real_command_disk_filling_during_the_run_warns_once_and_finishes(tmp_path, data):
    """The run dir's disk fills up after the first epoch: TensorBoard, the report pictures and
    summary.txt each warn once, training finishes (status 0) and its checkpoints are written."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    argv = argv_of(tmp_path, f"paths.data={data}", "logger=tensorboard", "trainer.epochs=2",
                 "trainer.limit_train_batches=null", run_dir=mnt / "run")
    proc = _popen(_in_namespace(f"mount -t tmpfs -o size=6M tmpfs {mnt}", argv))
    lines, filled = [], False
    for line in proc.stdout:
        lines.append(line)
        if not filled and "epoch 1/2" in line:  # the sink is writing by now: fill its disk
            # the command's mount; unbuffered: a write the disk takes only part of leaves
            # nothing behind for close() to raise on again
            with open(f"/proc/{proc.pid}/root{mnt}/filler", "wb", buffering=0) as f:
                with pytest.raises(OSError, match="No space left"):
                    while True:
                        f.write(b"\0" * 65536)
            filled = True
    status, _, err = _finish(proc)
    out = "".join(lines)
    assert filled and status == 0, err[-2000:]
    assert "Traceback" not in err and "Logging error" not in err, err[-3000:]
    warned = [ln for ln in lines if "][WARNING] - " in ln]
    assert sum("TensorBoardSink stopped writing to " in ln and f"{FULL} ([Errno 28]" in ln and
               ln.rstrip().endswith("the run goes on without it") for ln in warned) == 1, out
    assert any("could not write" in ln and "summary.txt" in ln for ln in warned), out
    assert "epoch 2/2" in out
    assert {p.name for p in (tmp_path / "ck").rglob("*.pth")} == {"best.pth", "last.pth"}


@mounts
def test_real_command_read_only_data_folder_is_one_line(tmp_path):
    """paths.data where the dataset must be generated, read-only: one config line, before any
    work (before: Hydra's 'Error in call to target ... OSError(30, ...)' block)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    argv = argv_of(tmp_path, f"paths.data={ro}")
    status, _, err = _run(_in_namespace(f"mount -o bind,ro {ro} {ro}", argv))
    line = one_error_line(status, err, f"config error: paths.data='{ro}': {ro} is not writable "
                          "(creating a file there failed: Read-only file system); choose a folder "
                          "you can write to")
    assert err.strip() == line


@mounts
def test_real_command_read_only_data_folder_with_everything_in_place_runs(tmp_path, data):
    """A read-only paths.data holding the generated data and its caches needs no write: it
    runs (the probe asks for writing only what the run writes)."""
    argv = argv_of(tmp_path, f"paths.data={data}")
    status, out, err = _run(_in_namespace(f"mount -o bind,ro {data} {data}", argv))
    assert status == 0, err[-2000:]
    assert "Traceback" not in err


@mounts
def test_real_command_read_only_run_dir_is_one_line(tmp_path):
    """Hydra cannot even make the run dir: one disk line naming it (before: Hydra's traceback)."""
    ro = tmp_path / "ro"
    ro.mkdir()
    argv = argv_of(tmp_path, run_dir=ro / "run")
    status, _, err = _run(_in_namespace(f"mount -o bind,ro {ro} {ro}", argv))
    line = one_error_line(status, err, f"disk error: {ro / 'run'}: the file system is read-only; "
                          "set paths.checkpoints, paths.data or hydra.run.dir to a folder you can "
                          "write to")
    assert err.strip() == line


@pytest.mark.parametrize("gpus", [1, pytest.param(2, marks=pytest.mark.slow)])
def test_real_command_with_stdout_closed_early_ends_as_usual(tmp_path, data, gpus):
    """``python run.py | head -2``: the reader goes away, the run trains to its end, exits 0 and
    prints no '--- Logging error ---' (it printed one per log line before)."""
    extra = ["dataset.num_workers=0"] + ([f"dist.gpus={gpus}"] if gpus > 1 else [])
    proc = _popen(argv_of(tmp_path, f"paths.data={data}", *extra))
    for _ in range(2):
        proc.stdout.readline()
    proc.stdout.close()  # what `head` does after its lines
    try:
        status = proc.wait(timeout=240)
        err = proc.stderr.read()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert status == 0, err[-2000:]
    assert "Logging error" not in err and "Traceback" not in err and "BrokenPipe" not in err, err
    assert (tmp_path / "run" / "summary.txt").is_file()  # it ran to its end
    assert "summary" in (tmp_path / "run" / "run.log").read_text()


def test_real_command_removes_the_folder_of_a_killed_generation(tmp_path):
    """kill -9 while the dataset is generated leaves ``.shapes.tmp-*``; the next run removes it
    (with a warning) and generates the data again."""
    data = tmp_path / "data"
    proc = _popen(argv_of(tmp_path, f"paths.data={data}", "dataset.generate.num_train=4000"))
    try:
        deadline = time.monotonic() + 120
        while not any(data.glob(".shapes.tmp-*/Annotations/*.xml")):
            assert time.monotonic() < deadline and proc.poll() is None, "no generation seen"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    left = list(data.glob(".shapes.tmp-*"))
    assert len(left) == 1 and not (data / "shapes").exists()
    status, out, err = _run(argv_of(tmp_path, f"paths.data={data}"))
    assert status == 0, err[-2000:]
    assert f"removing {left[0]}: writing the shapes dataset was interrupted there (a killed " \
           "run); it is made again from the start" in out
    assert list(data.glob(".shapes*")) == [] and (data / "shapes" / "manifest.json").is_file()


def test_real_command_sees_an_annotation_edited_with_an_old_time_stamp(tmp_path):
    """An annotation edited and its old modification time put back (a restore from a backup):
    the next run rebuilds the index and trains on the edit (before: the stale index, silently)."""
    own = tmp_path / "data"
    status, _, err = _run(argv_of(tmp_path, f"paths.data={own}"))  # data and index made
    assert status == 0, err[-2000:]
    xml = own / "shapes" / "Annotations" / "000003.xml"
    st, text = xml.stat(), xml.read_text()
    xmin = text.split("<xmin>")[1].split("<")[0]
    xml.write_text(text.replace(f"<xmin>{xmin}<", f"<xmin>{int(xmin) + 1}<", 1))
    os.utime(xml, ns=(st.st_atime_ns, st.st_mtime_ns))
    meta = next(own.glob("meta/shapes-*/train.txt"))
    assert meta.stat().st_mtime_ns > st.st_mtime_ns  # the old rule (mtimes) called it fresh
    status, out, err = _run(argv_of(tmp_path, f"paths.data={own}"))
    assert status == 0, err[-2000:]
    assert f"wrote {meta} (16 images)" in out
    line = next(ln for ln in meta.read_text().splitlines() if ln.startswith("JPEGImages/000003"))
    assert line.split()[3] == str(int(xmin) + 1)
