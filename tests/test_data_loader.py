"""mdk.data.loader.SafeLoader: an error in a DataLoader worker reaches the user as the same one
line as in the main process, and the process exits within seconds (a plain DataLoader hangs)."""
from __future__ import annotations

import multiprocessing as mp
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import torch
from torch.utils.data import DataLoader, Dataset

from conftest import REPO, run_cmd_env
from mdk.data.loader import SafeLoader, shutdown_workers, unwrap_worker_error
from mdk.errors import DataError
from mdk.engine.build import init_loader_worker

MSG = "/data/VOC/JPEGImages/000013.jpg: cannot decode image (image file is truncated); " \
      "replace the file or set dataset.on_bad_image=skip"


class Items(Dataset):
    """Item i is tensor([i]); item ``bad`` raises a DataError (or a bug-like KeyError)."""

    def __init__(self, n: int = 32, bad: int = -1, exc: type = DataError) -> None:
        self.n, self.bad, self.exc = n, bad, exc

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        if i == self.bad:
            raise self.exc(MSG)
        return torch.tensor([i])


def loader(cls: type, ds: Dataset, workers: int, **kw) -> DataLoader:
    return cls(ds, batch_size=4, num_workers=workers, multiprocessing_context="fork" if workers
               else None, worker_init_fn=init_loader_worker if workers else None, **kw)


@pytest.mark.parametrize("kw", [{}, {"persistent_workers": True, "prefetch_factor": 4}])
def test_same_batches_as_a_plain_loader(kw):
    plain = [b.tolist() for b in loader(DataLoader, Items(), 2, **kw)]
    safe = loader(SafeLoader, Items(), 2, **kw)
    assert [[b.tolist() for b in safe] for _ in range(2)] == [plain, plain]
    it = iter(loader(SafeLoader, Items(), 2))
    assert len(it) == 8 and len(it._workers) == 2  # noqa: SLF001 - the iterator's own attributes pass through


@pytest.mark.parametrize("workers", [0, 1, 2])
def test_worker_error_keeps_its_class_and_one_line_and_the_workers_stop(workers):
    it = iter(loader(SafeLoader, Items(bad=13), workers))
    with pytest.raises(DataError) as err:
        list(it)
    assert str(err.value) == MSG
    if workers:
        assert "in DataLoader worker process" in "".join(getattr(err.value, "__notes__", [""]))
        deadline = time.monotonic() + 10
        while mp.active_children() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not mp.active_children(), "loader workers still alive after the error"


def test_plain_loader_wraps_the_message_and_unwrap_restores_it():
    it = iter(loader(DataLoader, Items(bad=13), 1))
    with pytest.raises(DataError) as err:
        list(it)
    shutdown_workers(it)  # else this very test process would hang at exit (see SafeLoader)
    wrapped = err.value
    assert str(wrapped).startswith("Caught DataError in DataLoader worker process 0.\nOriginal "
                                   "Traceback") and str(wrapped).rstrip().endswith(MSG)
    clean = unwrap_worker_error(wrapped)
    assert type(clean) is DataError and str(clean) == MSG
    other = KeyError("x")
    assert unwrap_worker_error(other) is other and unwrap_worker_error(DataError(MSG)).args == (MSG,)


def test_a_bug_in_a_worker_stays_a_traceback():
    with pytest.raises(ValueError, match="Caught ValueError in DataLoader worker process"):
        list(loader(SafeLoader, Items(bad=5, exc=ValueError), 2))


SCRIPT = """
from torch.utils.data import DataLoader
from mdk.data.loader import SafeLoader
from mdk.errors import DataError
from test_data_loader import Items, loader
try:
    for _ in loader({cls}, Items(n=64, bad=13), {workers}, **{kw}):
        pass
except DataError as e:
    print("ERROR_AT", flush=True)
    raise SystemExit(f"data error: {{e}}") from None
"""


def run_script(cls: str, workers: int, kw: dict, bound: float) -> tuple[int | None, float, str]:
    """(exit status or None if still running ``bound`` s after the error, seconds from the error
    to the exit, stderr). Startup is not timed: torch's import alone takes 10+ s on a busy host."""
    code = textwrap.dedent(SCRIPT.format(cls=cls, workers=workers, kw=kw))
    proc = subprocess.Popen([sys.executable, "-c", code],
                            env=dict(run_cmd_env(), PYTHONPATH=f"{REPO}:{REPO / 'tests'}"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    kill = lambda: os.killpg(proc.pid, signal.SIGKILL)  # noqa: E731 - the script and its workers
    watchdog = threading.Timer(180, kill)  # never wait forever for the error itself
    watchdog.start()
    try:
        line = proc.stdout.readline()
        error_at = time.time()
        assert line.startswith("ERROR_AT"), (line, proc.stderr.read()[-2000:])
        try:
            proc.wait(timeout=bound)
        except subprocess.TimeoutExpired:
            kill()
            return None, float("inf"), proc.communicate()[1]
        return proc.returncode, time.time() - error_at, proc.communicate()[1]
    finally:
        watchdog.cancel()


@pytest.mark.parametrize("workers,kw", [(4, {}),
                                        (2, {"persistent_workers": True, "prefetch_factor": 4})])
def test_worker_error_exits_within_seconds_with_one_line(workers, kw):
    """The loader workers ignore SIGTERM (mdk.engine.build.init_loader_worker, for SLURM
    preemption): the process must still exit, and its stderr is the one line."""
    # Bound: measured 2-5 s on a 2-core machine at load 7, nearly all of it torch's interpreter
    # teardown (a bare `import torch` process takes 3 s to exit there).
    status, after, err = run_script("SafeLoader", workers, kw, bound=15)
    assert status == 1, f"still running 15 s after the error: {err[-2000:]}"
    assert err.strip().splitlines()[-1] == f"data error: {MSG}"
    assert "Traceback" not in err


@pytest.mark.slow
def test_plain_dataloader_hangs_after_a_worker_error():
    """Why SafeLoader exists: the same script with torch's DataLoader does not exit."""
    status, _, err = run_script("DataLoader", 2, {}, bound=15)
    if status is not None:
        # seen with torch 2.11 on a 16-core machine: the premise is torch's, not mdk's behaviour
        pytest.skip(f"torch {torch.__version__}'s DataLoader exited ({status}) after the worker "
                    "error here: the hang SafeLoader guards against did not occur")
    assert "Caught DataError in DataLoader worker process" in err
