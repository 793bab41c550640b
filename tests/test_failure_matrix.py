"""Issue 14's matrix: a user error raised in each place a process can be, for each error class.

The places: the launching process (``start``, before any rank exists), a spawned rank
(``iter``: rank 1 of ``dist.gpus=2`` after its 2nd optimizer step, while rank 0 waits in a
collective) and a DataLoader worker (``item``: the 3rd sample fetched by a loader worker, one
process and under two ranks). The classes: every class docs/errors.md names a kind for. Each
case runs the real ``python run.py`` with ``MDK_FAULT=raise:<point>:N:<rank>:<Class>`` and
asserts: exactly one stderr line ``<kind>[ (rank R)]: <message>``, status 1, the whole process
tree gone within a time bound, and a checkpoint folder that existed before is unchanged.

Issue 26 adds a rank that ends without a word (killed, or an exit code straight from a C
library): one line naming the rank, its pid, how it ended and its log, never its peer's
"connection reset" traceback. Stop signals have their own tests (test_stop_cli.py).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cmd_env
from mdk.errors import UserError, user_errors

SMALL = ["debug=tiny", "dataset.generate.num_train=16", "dataset.generate.num_val=8",
         "trainer.epochs=1"]
# Every kind of user error mdk raises (mdk/errors.py's one list; subclasses share a kind's path).
KINDS = {c.__name__: c.label for c in user_errors()
         if c.__module__ == "mdk.errors" and UserError in c.__bases__}
# place -> (fault point, rank, overrides): where the error starts
PLACES = {
    "parent": ("start", 0, ["dataset.num_workers=0"]),
    "rank": ("iter", 1, ["dataset.num_workers=0", "dist.gpus=2"]),
    "rank_0": ("iter", 0, ["dataset.num_workers=0", "dist.gpus=2"]),  # the rank with a console
    "worker": ("item", 0, ["dataset.num_workers=2"]),
    "worker_of_rank": ("item", 1, ["dataset.num_workers=2", "dist.gpus=2"]),
}
# Exit bound after the error is logged, and for the whole command (2 loaded cores; measured
# 1-3 s and 8-30 s). A hang (the corrupt-JPEG case) fails at the bound.
AFTER_ERROR_S, TOTAL_S, GONE_S = 20.0, 240.0, 10.0


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("matrix_data")


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _group(pgid: int) -> str:
    """``ps`` lines of the live processes in process group ``pgid`` (zombies do not count)."""
    out = subprocess.run(["ps", "-eo", "pgid=,pid=,stat=,args="], capture_output=True,
                         text=True).stdout
    return "\n".join(ln for ln in out.splitlines()
                     if ln.split()[0] == str(pgid) and not ln.split()[2].startswith("Z"))


def _run(argv: list[str], env: dict) -> tuple[int, str, str, float, float]:
    """(status, stderr, stdout, seconds from the ERROR log line to exit, total seconds)."""
    t0 = time.monotonic()
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        error_at, out = None, []
        for line in proc.stdout:
            out.append(line)
            if error_at is None and "][ERROR] - " in line and "launchers.hydra_app.entry" in line:
                error_at = time.monotonic()
        status = proc.wait(timeout=TOTAL_S)
        end = time.monotonic()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Within seconds the process group is empty: no rank or loader worker outlives the command.
    left = _group(proc.pid)
    while left and time.monotonic() < end + GONE_S:
        time.sleep(0.2)
        left = _group(proc.pid)
    assert not left, f"still running {GONE_S:g}s after the command exited:\n{left}"
    return status, proc.stderr.read(), "".join(out), end - (error_at or t0), end - t0


def _case(tmp_path: Path, data: Path, place: str, cls: str) -> None:
    point, rank, extra = PLACES[place]
    n = {"start": 1, "iter": 2, "item": 3}[point]
    ck = tmp_path / "ck"
    (ck / "earlier" / "step1").mkdir(parents=True)
    (ck / "earlier" / "step1" / "best.pth").write_bytes(b"a result from before")
    before = _snapshot(ck)
    argv = [sys.executable, str(REPO / "run.py"), *SMALL, *extra, f"paths.data={data}",
            f"paths.checkpoints={ck}", f"hydra.run.dir={tmp_path / 'run'}"]
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", MDK_FAULT=f"raise:{point}:{n}:{rank}:{cls}")
    status, err, out, after, total = _run(argv, env)
    assert status == 1, err[-2000:]
    assert "Traceback" not in err, err[-2000:]
    assert "Traceback" not in out, out[-2000:]  # the console too: the rank's is in rank<r>.log
    lines = err.strip().splitlines()
    where = f" (rank {rank})" if place in ("rank", "rank_0", "worker_of_rank") else ""
    assert lines == [f"{KINDS[cls]}{where}: MDK_FAULT: injected {cls} at {point} {n} on rank {rank}"]
    assert after < AFTER_ERROR_S, f"{after:.1f}s from the error to exit"
    assert total < TOTAL_S
    assert {k: v for k, v in _snapshot(ck).items() if k in before} == before  # nothing lost


@pytest.mark.parametrize("cls", sorted(KINDS))
def test_error_in_the_launching_process(tmp_path, data, cls):
    _case(tmp_path, data, "parent", cls)


@pytest.mark.parametrize("cls", sorted(KINDS))
def test_error_in_a_loader_worker(tmp_path, data, cls):
    _case(tmp_path, data, "worker", cls)


@pytest.mark.slow
@pytest.mark.parametrize("cls", sorted(KINDS))
def test_error_in_a_spawned_rank(tmp_path, data, cls):
    _case(tmp_path, data, "rank", cls)


def test_error_in_rank_0_leaves_its_traceback_to_its_log(tmp_path, data):
    _case(tmp_path, data, "rank_0", "DataError")
    log = (tmp_path / "run" / "rank0.log").read_text()
    assert "Traceback" in log and "mdk.errors.DataError: MDK_FAULT: injected DataError" in log


@pytest.mark.slow
@pytest.mark.parametrize("cls", ["DataError", "NonFiniteLossError"])
def test_error_in_a_loader_worker_of_rank_1(tmp_path, data, cls):
    _case(tmp_path, data, "worker_of_rank", cls)


@pytest.mark.slow
@pytest.mark.parametrize("fault, how", [
    ("kill:iter:2:1", r"was killed by SIGKILL \(out of memory\? see `dmesg` or the job's memory "
                      r"limit\)"),
    ("exit:iter:2:1:3", "exited with code 3")], ids=["killed", "exit_code"])
def test_a_rank_that_dies_without_a_word_is_one_line_naming_it(tmp_path, data, fault, how):
    run = tmp_path / "run"
    argv = [sys.executable, str(REPO / "run.py"), *SMALL, "dataset.num_workers=0", "dist.gpus=2",
            f"paths.data={data}", f"paths.checkpoints={tmp_path / 'ck'}", f"hydra.run.dir={run}"]
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", MDK_FAULT=fault)
    status, err, _, after, total = _run(argv, env)
    assert status == 1, err[-2000:]
    lines = err.strip().splitlines()
    m = re.fullmatch(rf"rank 1 \(pid (\d+)\) {how}; its log: {re.escape(str(run))}/rank1\.log",
                     lines[0])
    assert len(lines) == 1 and m, err[-2000:]
    assert f"rank 1 runs as pid {m.group(1)}" in (run / "rank1.log").read_text()
    assert after < AFTER_ERROR_S and total < TOTAL_S
