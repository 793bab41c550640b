"""Stop signals on the real `python run.py`: one line, 128 + the signal, a bit-identical resume,
and no process left behind.

Each run waits at a known optimizer step (``MDK_FAULT=hold:iter:N``, mdk/faults.py) until it is
asked to stop, so the signal lands mid-epoch at that step however loaded the machine is. One
process stops after the step it is at; two processes agree one step later (the agreement costs
no host sync per step: mdk/engine/stop_hook.py), so after step N+1. The rerun is the same
command and must end with the weights and optimizer state of an uninterrupted run.
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
import torch

from conftest import REPO, run_cmd_env
from helpers.resume import TINY_RUN, assert_same_training_state, ckpt, run

TWO = ("dist.gpus=2", "trainer.epochs=2")
LINE = re.compile(r"^stopped by (SIG\w+)( \(sent to rank (\d)\))? in step1 at epoch (\d+) "
                  r"iteration (\d+); rerun the same command to resume$")
GONE_S = 10.0


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> tuple[Path, Path]:
    """Uninterrupted runs: one process (3 epochs, 12 steps) and two (2 epochs, 8 steps)."""
    tmp = tmp_path_factory.mktemp("stop")
    data = tmp / "data"
    for name, extra in (("ref1", ()), ("ref2", TWO)):
        p = run(tmp, name, data, "", *extra)
        assert p.returncode == 0, p.stderr[-3000:]
    return tmp, data


def _live(pgid: int, run_dir: Path) -> list[str]:
    """The processes of the command's group and its ranks (each rank runs in its own session, so
    it is found by the pid its log names) that are still running."""
    ranks = {m for p in run_dir.glob("rank*.log") for m in re.findall(r"runs as pid (\d+)",
                                                                      p.read_text())}
    out = subprocess.run(["ps", "-eo", "pgid=,pid=,stat=,args="], capture_output=True,
                         text=True).stdout
    return [ln for ln in out.splitlines()
            if (ln.split()[0] == str(pgid) or ln.split()[1] in ranks)
            and not ln.split()[2].startswith("Z")]


def signalled(tmp: Path, name: str, data: Path, fault: str, sig: int, target: str,
              *extra: str) -> tuple[int, list[str], Path]:
    """Run until ``fault`` holds, send ``sig`` to ``target`` (``parent``, ``group`` or
    ``rank<r>``), wait; (status, stderr lines, run dir). Asserts that within GONE_S of the
    command's exit no process it started is left."""
    run_dir = tmp / "runs" / name
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", MDK_FAULT=fault)
    args = [*TINY_RUN, f"paths.data={data}", f"paths.checkpoints={tmp / name}",
            f"hydra.run.dir={run_dir}", *extra]
    out, err = tmp / f"{name}.out", tmp / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        proc = subprocess.Popen([sys.executable, str(REPO / "run.py"), *args], cwd=REPO, env=env,
                                stdout=o, stderr=e, start_new_session=True)
    try:
        log = run_dir / f"{target}.log" if target.startswith("rank") else out
        end = time.monotonic() + 240
        while "MDK_FAULT: holding at " not in (log.read_text() if log.exists() else ""):
            assert proc.poll() is None and time.monotonic() < end, err.read_text()[-2000:]
            time.sleep(0.1)
        if target == "parent":
            proc.send_signal(sig)
        elif target == "group":  # Ctrl-C: the terminal signals every process of the group
            os.killpg(proc.pid, sig)
        else:
            os.kill(int(re.search(r"runs as pid (\d+)", log.read_text()).group(1)), sig)
        code = proc.wait(timeout=120)
        left, gone = _live(proc.pid, run_dir), time.monotonic() + GONE_S
        while left and time.monotonic() < gone:
            time.sleep(0.2)
            left = _live(proc.pid, run_dir)
        assert not left, f"still running {GONE_S:g}s after the command ended:\n" + "\n".join(left)
    finally:
        if proc.poll() is None or _live(proc.pid, run_dir):
            os.killpg(proc.pid, signal.SIGKILL)
    return code, err.read_text().strip().splitlines(), run_dir


def _stopped_at(lines: list[str], sig: str, rank: str | None = None) -> int:
    """The iteration the one stderr line names (and checks the rest of the line)."""
    assert len(lines) == 1, lines
    m = LINE.match(lines[0])
    assert m and m.group(1) == sig and m.group(3) == rank, lines[0]
    return int(m.group(5))


@pytest.mark.slow
def test_sigterm_mid_epoch_one_process_saves_that_step_and_resumes_bit_identically(refs):
    tmp, data = refs
    code, lines, _ = signalled(tmp, "one", data, "hold:iter:5", signal.SIGTERM, "parent")
    assert code == 143 and _stopped_at(lines, "SIGTERM") == 5
    assert lines == ["stopped by SIGTERM in step1 at epoch 2 iteration 5; rerun the same "
                     "command to resume"]
    assert ckpt(tmp, "one")["trainer"]["iter"] == 5  # mid-epoch (periodic saves: 2, 4)
    p = run(tmp, "one", data)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "(iteration 5)" in p.stdout
    assert_same_training_state(ckpt(tmp, "one"), ckpt(tmp, "ref1"))


@pytest.mark.slow
def test_sigterm_to_the_parent_of_two_ranks_saves_and_resumes_bit_identically(refs):
    tmp, data = refs
    code, lines, run_dir = signalled(tmp, "two", data, "hold:iter:5", signal.SIGTERM, "parent",
                                     *TWO)
    assert code == 143
    at = _stopped_at(lines, "SIGTERM")
    assert at == 6 and ckpt(tmp, "two")["trainer"]["iter"] == 6  # the ranks agree one step on
    assert "Traceback" not in (run_dir / "rank1.log").read_text()
    p = run(tmp, "two", data, "", *TWO)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "(iteration 6)" in p.stdout
    a = ckpt(tmp, "two")
    assert_same_training_state(a, ckpt(tmp, "ref2"))
    assert sorted(a["rng"]) == [0, 1]


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_the_whole_run_and_names_that_rank(refs):
    tmp, data = refs
    code, lines, _ = signalled(tmp, "rank1", data, "hold:iter:5:1", signal.SIGTERM, "rank1",
                               *TWO)
    assert code == 143
    at = _stopped_at(lines, "SIGTERM", rank="1")
    assert at == 6 and ckpt(tmp, "rank1")["trainer"]["iter"] == 6


@pytest.mark.slow
def test_ctrl_c_with_loader_workers_stops_with_status_130(refs):
    """SIGINT to the whole process group, as a terminal sends it: the loader workers ignore it,
    the run saves the step it is at."""
    tmp, data = refs
    code, lines, _ = signalled(tmp, "ctrlc", data, "hold:iter:5", signal.SIGINT, "group",
                               "dataset.num_workers=2")
    assert code == 130 and _stopped_at(lines, "SIGINT") == 5
    assert ckpt(tmp, "ctrlc")["trainer"]["iter"] == 5


@pytest.mark.slow
def test_sigkill_to_the_parent_of_two_ranks_leaves_no_rank_alive(refs):
    tmp, data = refs
    code, lines, _ = signalled(tmp, "orphans", data, "hold:iter:5", signal.SIGKILL, "parent",
                               *TWO)
    assert code == -signal.SIGKILL and lines == []  # and (signalled) no rank within 10 s


@pytest.mark.slow
def test_sigterm_to_a_submitit_local_job_is_one_line_from_the_launcher(refs):
    """The job saves and ends (no result); the launching process says so in one line, not with
    submitit's "Error stream produced" and the job's traceback, and exits 143."""
    tmp, data = refs
    sweep = tmp / "sweep"
    env = dict(run_cmd_env(), OMP_NUM_THREADS="1", MDK_FAULT="hold:iter:2")
    argv = [sys.executable, str(REPO / "run.py"), "-m", *TINY_RUN, f"paths.data={data}",
            f"hydra.sweep.dir={sweep}", "hydra/launcher=submitit_local",
            "hydra.launcher.gpus_per_node=0"]
    proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        end = time.monotonic() + 240
        held = []  # submitit's task names its pid where it holds
        while not held:
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read()[-2000:]
            time.sleep(0.2)
            held = [m for p in sweep.glob(".submitit/*/*_log.out")
                    for m in re.findall(r"holding at iter 2 \(pid (\d+)\)", p.read_text())]
        os.kill(int(held[0]), signal.SIGTERM)
        code = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = proc.stderr.read().strip().splitlines()
    job_id = next(sweep.glob(".submitit/*/*_log.out")).parent.name
    assert code == 143 and lines == [
        f"sweep job 0 ({job_id}): stopped by SIGTERM in step1 at epoch 1 iteration 2; rerun the "
        f"same command with hydra.sweep.dir={sweep} hydra.callbacks.sweep.resume=true to resume"]
    last = sweep / "0" / "checkpoints" / "step1" / "last.pth"
    assert torch.load(last, weights_only=False)["trainer"]["iter"] == 2


def test_a_signal_before_any_stage_ends_the_command_at_once_with_its_line(tmp_path):
    """No training loop listens yet (MDK_FAULT holds the launching process before the first
    stage): nothing to save, so the command ends at once, saying so."""
    code, lines, _ = signalled(tmp_path, "early", tmp_path / "data", "hold:start:1",
                               signal.SIGTERM, "parent", "dist.gpus=2")
    assert code == 143 and lines == [
        "stopped by SIGTERM before any stage started; rerun the same command to resume"]


@pytest.mark.slow
def test_sigterm_in_a_stages_last_step_ends_the_pipeline_after_that_stage(refs):
    """Two ranks run the stages of a pipeline one after another: a stop asked for in step1's last
    step (no later step to agree in) is agreed between the stages; step1 is whole, step2 has not
    started, and the same command goes on with step2."""
    tmp, data = refs
    chain = (*TWO, "pipeline=[step1,step2]")
    code, lines, _ = signalled(tmp, "between", data, "hold:iter:8", signal.SIGTERM, "parent",
                               *chain)
    assert code == 143 and lines == [
        "stopped by SIGTERM after step1 finished; rerun the same command to resume"]
    assert ckpt(tmp, "between")["trainer"]["iter"] == 8
    assert ckpt(tmp, "between", "best.pth") and not (tmp / "between" / "step2").exists()
    p = run(tmp, "between", data, "", *chain)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "resuming step1 from" in p.stdout and (tmp / "between" / "step2" / "best.pth").is_file()
    assert_same_training_state(ckpt(tmp, "between"), ckpt(tmp, "ref2"))
