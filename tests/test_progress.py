"""Progress bars (mdk/progress.py): on a terminal, never in a log file unless forced; and a
multi-process run ends with its summary, no resource warning after it."""
from __future__ import annotations

import io
import multiprocessing.synchronize
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm import tqdm
from tqdm.std import TqdmDefaultWriteLock

from conftest import REPO, run_cmd_env
from mdk import progress
from mdk.progress import bars_on, progress_bar
from helpers.catalogue import argv_of


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


@pytest.mark.parametrize("tty", [True, False])
def test_the_rule_auto_follows_the_terminal_true_forces_false_never(tty, monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Stream(tty))
    assert bars_on("auto") is tty and bars_on() is tty
    assert bars_on(True) is True and bars_on(False) is False
    for setting in ("auto", True, False):
        assert bars_on(setting, is_main=False) is False  # only the main process draws


def test_without_a_bar_the_iterable_comes_back_and_no_tqdm_is_made(monkeypatch):
    monkeypatch.setattr(sys, "stderr", _Stream(False))
    made = []
    monkeypatch.setattr(progress, "tqdm", lambda *a, **k: made.append(a))
    items = [1, 2, 3]
    assert progress_bar(items, desc="eval") is items
    assert progress_bar(items, setting=True, is_main=False) is items
    assert progress_bar(total=5) is None  # a hand-driven bar: the caller checks for None
    assert made == []


def _count_semaphores(monkeypatch) -> list:
    """Record every multiprocessing semaphore made from now on; forget tqdm's global locks so the
    next bar makes its lock again."""
    made: list = []
    init = multiprocessing.synchronize.SemLock.__init__

    def counting(self, *a, **k):
        made.append(k.get("ctx"))
        init(self, *a, **k)

    monkeypatch.setattr(multiprocessing.synchronize.SemLock, "__init__", counting)
    monkeypatch.delattr(tqdm, "_lock", raising=False)
    monkeypatch.delattr(TqdmDefaultWriteLock, "mp_lock", raising=False)
    return made


def test_a_bar_takes_a_thread_lock_not_a_semaphore(monkeypatch):
    """A plain tqdm makes a multiprocessing RLock, a named semaphore a rank leaving through
    os._exit never unlinks (the resource_tracker warning); mdk's bars make none."""
    made = _count_semaphores(monkeypatch)
    tqdm([1], file=io.StringIO()).close()
    assert len(made) == 1  # the cause, as tqdm does it

    made = _count_semaphores(monkeypatch)
    out = io.StringIO()
    bar = progress_bar(range(3), setting=True, file=out, desc="eval")
    assert list(bar) == [0, 1, 2]
    assert made == [] and "eval" in out.getvalue() and "\r" in out.getvalue()


def _run_to_file(tmp_path: Path, *args: str, env: dict | None = None) -> tuple[int, str]:
    """`python run.py` (tiny) with stdout and stderr redirected to one file, as in a SLURM log."""
    log = tmp_path / "run.log"
    with open(log, "w") as f:
        p = subprocess.run([sys.executable, str(REPO / "run.py"), *argv_of(tmp_path, args)],
                           cwd=REPO, env=dict(run_cmd_env(), OMP_NUM_THREADS="1", **(env or {})),
                           stdout=f, stderr=subprocess.STDOUT, timeout=300)
    return p.returncode, log.read_bytes().decode()  # read_text() would turn \r into \n


def test_a_log_file_gets_no_bar_frames(tmp_path):
    status, log = _run_to_file(tmp_path, "trainer.progress=auto")
    assert status == 0, log[-2000:]
    assert "\r" not in log
    # The epoch lines carry what the bars would have shown.
    assert "epoch 1/1  loss " in log and "epoch 1/1  val mAP@0.5 " in log


def test_progress_true_forces_the_bars_into_a_file(tmp_path):
    status, log = _run_to_file(tmp_path, "trainer.progress=true")
    assert status == 0, log[-2000:]
    assert "\repoch 1/1: " in log and "\reval: " in log


def test_two_process_run_ends_with_its_summary_and_no_resource_warning(tmp_path):
    """With bars in rank 0 (trainer.progress=true) tqdm's semaphore used to leak: the resource
    tracker printed a warning after the summary. It prints when the launching process has
    exited, so the output is read through a pipe, to its end (every writer closed), not from a
    file that may be read before the tracker wrote."""
    p = subprocess.run([sys.executable, str(REPO / "run.py"),
                        *argv_of(tmp_path, ("dist.gpus=2", "trainer.progress=true"))],
                       cwd=REPO, env=dict(run_cmd_env(), OMP_NUM_THREADS="1",
                                          PYTHONWARNINGS="always::ResourceWarning"),
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)
    status, log = p.returncode, p.stdout.decode()
    assert status == 0, log[-2000:]
    assert "\reval: " in log  # rank 0 drew its bars
    assert "resource_tracker" not in log and "ResourceWarning" not in log and "leaked" not in log
    assert log.rstrip("\n").splitlines()[-1] == f"run dir: {tmp_path / 'run'}"
