"""One run per checkpoint folder (mdk/folder_lock.py): refused while held, taken over after a
crash, not kept by a forked child, and a file system without flock only warns."""
from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cmd_env
from mdk import folder_lock
from mdk.errors import CheckpointError
from mdk.folder_lock import LOCK_NAME, one_run


def test_a_held_folder_refuses_a_second_holder_naming_the_first(tmp_path):
    ck = tmp_path / "ck"
    with one_run(ck, "/runs/first") as lock:
        held = json.loads(lock.read_text())
        assert held["pid"] == os.getpid() and held["host"] == socket.gethostname()
        with pytest.raises(CheckpointError) as e:  # another open file: flock conflicts in-process too
            with one_run(ck, "/runs/second"):
                pass
        assert str(e.value) == (
            f"{ck} is in use by the run of pid {os.getpid()} on host {socket.gethostname()} since "
            f"{held['since']} (its run dir: /runs/first, its lock: {ck / LOCK_NAME}); wait for it "
            "to end, or give this run another paths.checkpoints")
        assert json.loads(lock.read_text()) == held  # the refused run changed nothing
    assert lock.read_text() == ""  # released: nothing left to take over
    with one_run(ck, "/runs/third") as again:
        assert json.loads(again.read_text())["run_dir"] == "/runs/third"


def test_the_lock_of_a_killed_process_is_taken_over_even_if_its_forked_child_lives(tmp_path,
                                                                                   caplog):
    """A process takes the lock, forks a child that lives on (a DataLoader worker), and is
    killed: the child closed its copy of the lock at the fork, so the folder is free at once."""
    ck = tmp_path / "ck"
    script = textwrap.dedent(f"""
        import os, signal, time
        from pathlib import Path
        from mdk.folder_lock import one_run
        with one_run(Path({str(ck)!r}), "killed"):
            child = os.fork()
            if child == 0:
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, 1)  # let go of the test's pipes: it waits for their end
                os.dup2(devnull, 2)
                time.sleep(30)
                os._exit(0)
            print(child, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
    """)
    p = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=run_cmd_env(),
                       capture_output=True, text=True, timeout=120)
    child = int(p.stdout.split()[0])
    try:
        os.kill(child, 0)  # the child still lives
        assert '"run_dir": "killed"' in (ck / LOCK_NAME).read_text()
        with one_run(ck, "next"):
            assert "ended without releasing it (killed or crashed)" in caplog.text
    finally:
        os.kill(child, 9)


def test_a_file_system_without_flock_warns_and_runs(tmp_path, monkeypatch, caplog):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(folder_lock.fcntl, "flock", no_locks)
    t0 = time.monotonic()
    with one_run(tmp_path / "ck") as lock:
        assert lock.read_text() == ""  # nothing written: it is not held
    assert "no working flock, so a second run on" in caplog.text and time.monotonic() - t0 < 5


def test_a_lock_that_cannot_be_opened_is_one_line(tmp_path):
    (tmp_path / "ck" / LOCK_NAME).mkdir(parents=True)  # a folder where the file should be
    with pytest.raises(CheckpointError, match=r"cannot open the run lock .*\.mdk\.lock \(Is a "
                       r"directory\); remove what is there, or give this run another "
                       r"paths.checkpoints"):
        with one_run(Path(tmp_path / "ck")):
            pass


def test_a_forked_child_leaving_the_block_leaves_the_parents_lock_alone(tmp_path):
    ck = tmp_path / "ck"
    child = 0
    with one_run(ck, "parent") as lock:
        child = os.fork()
        if child == 0:
            pass  # the child runs on, out of the block (as a forked process returning would)
        else:
            _, status = os.waitpid(child, 0)
            assert status == 0
            assert json.loads(lock.read_text())["run_dir"] == "parent"  # not emptied
            with pytest.raises(CheckpointError, match="is in use by the run of pid"):
                with one_run(ck):  # still locked
                    pass
    if child == 0:
        os._exit(0)
    assert lock.read_text() == ""
