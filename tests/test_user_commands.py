"""The commands a user types, each a fresh `python run.py ...` process (``MDK_TEST_COLD=1``: no
warm interpreter, nothing forked from the test process), as CI runs them besides the rest of the
suite: one stage, two processes, the whole chain, a local sweep, a submitit local job, a stop
signal mid-run. Each asserts what the user sees (exit status, the summary or stop line) and
what is left on disk (checkpoints, the chip model, the sweep's table).
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import REPO, run_cmd_env

pytestmark = pytest.mark.slow  # each command starts a fresh interpreter (imports ~5 s of CPU)
TINY = ["debug=tiny"]


def _env(**extra: str) -> dict:
    return dict(run_cmd_env(), MDK_TEST_COLD="1", OMP_NUM_THREADS="1", **extra)


def _run(tmp: Path, *args: str, multirun: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, str(REPO / "run.py"), *(["-m"] if multirun else []), *TINY,
           f"paths.data={tmp / 'data'}", *args]
    return subprocess.run(cmd, cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=420)


def test_python_run_py_trains_step1_and_says_where_its_weights_are(tmp_path):
    p = _run(tmp_path, f"paths.checkpoints={tmp_path / 'ck'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "ck" / "step1" / "best.pth").is_file()
    assert (tmp_path / "run" / "summary.txt").is_file()
    assert "step1" in (tmp_path / "run" / "summary.txt").read_text()


def test_two_processes_train_the_same_stage(tmp_path):
    p = _run(tmp_path, "dist.gpus=2", f"paths.checkpoints={tmp_path / 'ck'}",
             f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 0, p.stderr[-3000:]
    assert (tmp_path / "ck" / "step1" / "best.pth").is_file()
    assert sorted(q.name for q in (tmp_path / "run").glob("rank*.log")) == ["rank0.log",
                                                                           "rank1.log"]


def test_the_whole_chain_ends_with_a_chip_model(tmp_path):
    p = _run(tmp_path, "pipeline=[step1,step2,cal,step3,step4]",
             f"paths.checkpoints={tmp_path / 'ck'}", f"hydra.run.dir={tmp_path / 'run'}")
    assert p.returncode == 0, p.stderr[-3000:]
    for stage in ("step1", "step2", "cal", "step3", "step4"):
        assert (tmp_path / "ck" / stage / "best.pth").is_file(), stage
    assert any((tmp_path / "ck" / "step4" / "chip_model").iterdir())


@pytest.mark.parametrize("launcher", ["basic", "submitit_local"])
def test_a_sweep_runs_each_job_and_prints_its_table(tmp_path, launcher):
    p = _run(tmp_path, "seed=0,1", f"hydra/launcher={launcher}",
             f"hydra.sweep.dir={tmp_path / 'sweep'}", multirun=True)
    assert p.returncode == 0, p.stderr[-3000:]
    jobs = sorted((tmp_path / "sweep").glob("*/checkpoints/step1/best.pth"))
    assert len(jobs) == 2, p.stderr[-3000:]
    table = [ln for ln in (p.stdout + p.stderr).splitlines() if ln.split()[:2] == ["job", "seed"]]
    assert table, p.stdout[-3000:]


def test_a_stop_signal_saves_says_one_line_and_the_rerun_resumes(tmp_path):
    args = [sys.executable, str(REPO / "run.py"), *TINY, f"paths.data={tmp_path / 'data'}",
            "trainer.epochs=3", f"paths.checkpoints={tmp_path / 'ck'}",
            f"hydra.run.dir={tmp_path / 'run'}"]
    with open(tmp_path / "out", "w") as out, open(tmp_path / "err", "w") as err:
        proc = subprocess.Popen(args, cwd=REPO, env=_env(MDK_FAULT="hold:iter:5"),
                                stdout=out, stderr=err, start_new_session=True)
    end = time.monotonic() + 240
    log = tmp_path / "out"
    while "MDK_FAULT: holding at " not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None and time.monotonic() < end, (tmp_path / "err").read_text()
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    lines = [ln for ln in (tmp_path / "err").read_text().splitlines() if ln.startswith("stopped")]
    assert lines == ["stopped by SIGTERM in step1 at epoch 1 iteration 5; "
                     "rerun the same command to resume"]
    assert (tmp_path / "ck" / "step1" / "last.pth").is_file()
    again = _run(tmp_path, "trainer.epochs=3", f"paths.checkpoints={tmp_path / 'ck'}",
                 f"hydra.run.dir={tmp_path / 'run2'}")
    assert again.returncode == 0, again.stderr[-3000:]
    said = again.stdout + again.stderr
    assert f"resuming step1 from {tmp_path / 'ck' / 'step1' / 'last.pth'} (iteration 5)" in said, \
        said[-3000:]
    assert (tmp_path / "ck" / "step1" / "best.pth").is_file()
