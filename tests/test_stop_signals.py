"""Stop signals and how a run's ranks ended, unit by unit (the real command: test_stop_cli.py).

launchers/processes/stop_signals.py (a signal asks the loop to stop, or stops at once where no
loop listens; the launcher forwards it to its ranks and a second one ends everything at once),
launchers/processes/rank_ends.py (one line on how a rank ended), launchers/reports/stop_line.py
(the stop's line and exit status) and launchers/hydra_app/job_ends.py (a submitit job without a
result).
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from conftest import REPO, run_cmd_env
from launchers.hydra_app.job_ends import jobs_end_lines, record_stopped_job
from launchers.processes.rank_ends import (STOP_EXIT, RankFailedError, error_files,
                                            ranks_outcome, record_stop)
from launchers.processes.stop_signals import DUPLICATE_S, stop_signals
from launchers.reports.stop_line import stop_line, stop_status, sweep_rerun
from mdk import stop


def _delivered() -> None:
    """Let Python run a pending signal handler (it runs between bytecodes of the main thread)."""
    for _ in range(100):
        time.sleep(0.01)


def test_the_stop_line_and_the_exit_status():
    e = stop.StopRequested("SIGTERM", 57, 3, stage="step1")
    assert stop_line(e) == ("stopped by SIGTERM in step1 at epoch 3 iteration 57; rerun the "
                            "same command to resume")
    assert stop_status(e) == 143
    e = stop.StopRequested("SIGUSR1", 6, 2, stage="step2", rank=1)
    assert stop_line(e, sweep_rerun("/s")) == (
        "stopped by SIGUSR1 (sent to rank 1) in step2 at epoch 2 iteration 6; rerun the same "
        "command with hydra.sweep.dir=/s hydra.callbacks.sweep.resume=true to resume")
    assert stop_status(e) == 138
    e = stop.StopRequested("SIGINT", saved=False, stage="cal")
    assert stop_line(e) == ("stopped by SIGINT in cal outside its training loop (nothing new to "
                            "save: its last checkpoint is kept); rerun the same command to resume")
    assert stop_status(e) == 130
    assert stop_line(stop.StopRequested("SIGTERM", stage="step1")) == (
        "stopped by SIGTERM after step1 finished; rerun the same command to resume")
    assert stop_line(stop.StopRequested("SIGTERM", saved=False)) == (
        "stopped by SIGTERM before any stage started; rerun the same command to resume")
    # a rank stopped because a peer was asked: no signal of its own, SIGTERM's status
    assert stop_status(stop.StopRequested("another rank was asked to stop", 4, 1)) == 143


@pytest.mark.parametrize("kind", ["launcher", "rank"])
def test_a_signal_where_no_loop_listens_stops_at_once_and_handlers_come_back(kind):
    before = signal.getsignal(signal.SIGUSR1)
    with pytest.raises(stop.StopRequested) as e:
        with stop_signals(kind):
            assert stop.is_armed()
            os.kill(os.getpid(), signal.SIGUSR1)
            _delivered()
    assert (e.value.reason, e.value.saved, e.value.iteration) == ("SIGUSR1", False, None)
    assert signal.getsignal(signal.SIGUSR1) is before and not stop.is_armed()
    stop.clear_stop()


@pytest.mark.parametrize("kind", ["launcher", "rank"])
def test_a_signal_while_a_loop_listens_only_asks_it_to_stop_and_repeats_are_one_request(kind):
    with stop_signals(kind):
        stop.start_listening()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # the same request twice (terminal + SLURM)
            _delivered()
            if kind == "rank":  # a rank ignores repeats: whoever started it decides when to end
                time.sleep(DUPLICATE_S + 0.2)
                os.kill(os.getpid(), signal.SIGTERM)
                _delivered()
            assert stop.stop_requested() == "SIGTERM"
        finally:
            stop.stop_listening()
    stop.clear_stop()


# A launcher process with one rank (it dies with its parent, as spawned ranks do) that reports
# the signals it gets and ignores them; the launcher's agent is played by an except clause.
_LAUNCHER = textwrap.dedent("""
    import logging, os, signal, subprocess, sys, time
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from launchers.processes.stop_signals import forwarding, stop_signals
    logging.getLogger().addHandler(logging.NullHandler())  # stderr: only what the user reads
    rank = subprocess.Popen([sys.executable, "-c", "import signal, sys, time\\n"
        "from mdk.engine.build import die_with_parent\\n"
        "die_with_parent()\\n"
        "signal.signal(signal.SIGTERM, lambda s, f: print('rank got', s, flush=True))\\n"
        "print('ready', file=sys.stderr, flush=True); time.sleep(60)"], stdout=sys.stdout,
        stderr=subprocess.PIPE, text=True)
    print(rank.stderr.readline().strip(), flush=True)  # its handler is in
    print("rank pid", rank.pid, flush=True)
    with stop_signals("launcher"), forwarding():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1.0)
        except SignalException as e:  # what torch's agent does: pass it on to the ranks
            print("agent got", e.sigval.name, flush=True)
            os.kill(rank.pid, e.sigval)
        os.kill(os.getpid(), signal.SIGTERM)  # within DUPLICATE_S: the same request
        time.sleep(1.2)
        print("still here", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)  # a second request: the launcher ends everything
        time.sleep(1.0)
    print("launcher went on", flush=True)
""")


def test_the_launcher_passes_a_signal_to_the_agent_and_a_second_one_ends_it_and_its_ranks():
    p = subprocess.run([sys.executable, "-c", _LAUNCHER], cwd=REPO,
                       env=run_cmd_env(), capture_output=True, text=True, timeout=60)
    out = p.stdout.splitlines()
    assert out[0] == "ready" and out[1].startswith("rank pid"), p.stdout + p.stderr
    assert out[2:] == ["agent got SIGTERM", f"rank got {int(signal.SIGTERM)}", "still here"], \
        p.stdout + p.stderr
    assert p.returncode == 128 + signal.SIGTERM, p.stderr
    assert p.stderr.strip().splitlines() == [
        "stopped by a second SIGTERM: ended at once without saving; the last checkpoint "
        "(last.pth) is kept, rerun the same command to resume from it"]
    pid = int(out[1].split()[-1])
    for _ in range(50):  # the rank died with its launcher (SIGKILL: no second "rank got")
        if not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]:
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"rank {pid} outlived its launcher")


def _failed(rank: int, code: int, first_rank: int = 0) -> dict:
    """The elastic agent's report: the one rank it saw end first, its pid and exit code."""
    return {rank: SimpleNamespace(pid=4000 + rank - first_rank, exitcode=code)}


RESET = "RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection reset by peer\n"


@pytest.mark.parametrize("code, how", [
    (-signal.SIGKILL, "was killed by SIGKILL (out of memory? see `dmesg` or the job's memory "
                      "limit)"),
    (-signal.SIGTERM, "was terminated by SIGTERM"), (-signal.SIGSEGV, "crashed with SIGSEGV"),
    (3, "exited with code 3")])
def test_a_rank_that_ended_without_a_word_is_named_not_its_peer(tmp_path, code, how):
    tracebacks = {0: "Traceback ...\n" + RESET}  # rank 0 only lost its peer
    err = ranks_outcome(tmp_path, "tag", _failed(1, code), tracebacks, None, False)
    assert isinstance(err, RankFailedError)
    assert str(err) == f"rank 1 (pid 4001) {how}; its log: {tmp_path}/rank1.log"
    assert not (tmp_path / ".errors").exists()


def test_the_rank_torch_saw_end_first_is_the_cause_and_a_raise_beats_a_death(tmp_path):
    # both ended silently (rank 1 killed, rank 0 then killed by the agent's SIGKILL)
    err = ranks_outcome(tmp_path, "tag", _failed(1, -9), {}, None, False)
    assert str(err).startswith("rank 1 (pid 4001) was killed by SIGKILL")
    # on machine 1 (ranks 2, 3): global ranks
    err = ranks_outcome(tmp_path, "tag", _failed(3, 5, first_rank=2), {}, None, True)
    assert str(err) == f"rank 3 (pid 4001) exited with code 5; its log: {tmp_path}/rank3.log"
    tracebacks = {1: "Traceback ...\nValueError: boom\n"}
    err = ranks_outcome(tmp_path, "tag", _failed(0, -9), tracebacks, None, False)
    assert str(err).startswith(f"rank 1 failed (log: {tmp_path}/rank1.log):\nTraceback")


def test_the_first_error_file_written_names_the_rank_and_a_terminated_loader_is_no_cause(tmp_path):
    """Torch's error files (one per local rank that raised) in the order they were written: rank 0
    of machine 1 (global 2) wrote after global rank 3; a loader worker SIGTERMed with its rank's
    process group by the agent's shutdown is a consequence, like a lost peer."""
    files = {2: str(tmp_path / "never_written.json")}  # local rank 2 did not raise
    for local, text, t in [(0, "Traceback ...\nValueError: later\n", 2_000), (1, "Traceback "
                           "...\nValueError: first\n", 1_000)]:
        f = tmp_path / "mdk-step1_x" / "attempt_0" / str(local) / "error.json"
        f.parent.mkdir(parents=True)
        files[local] = str(f)
        f.write_text(json.dumps({"message": {"message": "ValueError", "extraInfo": {
            "py_callstack": text, "timestamp": "1"}}}))
        os.utime(f, ns=(t * 10**9, t * 10**9))
    tracebacks = error_files(files, first_rank=2)
    assert list(tracebacks) == [3, 2] and tracebacks[3].endswith("ValueError: first\n")
    err = ranks_outcome(tmp_path, "tag", _failed(2, 1, first_rank=2), tracebacks, None, True)
    assert str(err).startswith(f"rank 3 failed (log: {tmp_path}/rank3.log):\nTraceback")
    loader = "RuntimeError: DataLoader worker (pid 7461) is killed by signal: Terminated. \n"
    err = ranks_outcome(tmp_path, "tag", _failed(0, 1), {0: loader, 1: "ValueError: boom\n"},
                        None, False)
    assert str(err).startswith("rank 1 failed")


def test_only_lost_connections_point_at_another_machine_only_when_there_is_one(tmp_path):
    err = ranks_outcome(tmp_path, "tag", _failed(2, 1, first_rank=2), {2: RESET}, None, True)
    assert str(err) == ("rank 2 lost its connection to the other ranks: a rank on another "
                        "machine probably ended first; see that machine's rank*.log (this "
                        f"rank's log: {tmp_path}/rank2.log)")
    assert ranks_outcome(tmp_path, "tag", None, {}, None, False) is None


def test_a_stop_is_reported_with_its_signal_the_rank_it_reached_and_the_saved_step(tmp_path):
    record_stop(tmp_path, "tag", 0, stop.StopRequested("another rank was asked to stop", 6, 2))
    record_stop(tmp_path, "tag", 1, stop.StopRequested("SIGTERM", 6, 2))
    e = ranks_outcome(tmp_path, "tag", None, {}, None, False)
    assert isinstance(e, stop.StopRequested)
    assert (e.reason, e.rank, e.iteration, e.epoch, e.saved) == ("SIGTERM", 1, 6, 2, True)
    # the launcher's own signal; a peer's lost connection while stopping is no failure
    record_stop(tmp_path, "tag", 0, stop.StopRequested("SIGINT", saved=False))
    e = ranks_outcome(tmp_path, "tag", _failed(1, 1), {1: RESET}, int(signal.SIGINT), False)
    assert (e.reason, e.rank, e.saved) == ("SIGINT", None, False)


def test_a_rank_that_left_with_the_stop_status_is_a_stop_not_a_failure(tmp_path):
    """Torch's agent counts a rank that stopped on request (status STOP_EXIT, no result) as the
    first failure when only that rank got the signal; the report is the stop its record says."""
    record_stop(tmp_path, "tag", 1, stop.StopRequested("SIGUSR1", 4, 1))
    record_stop(tmp_path, "tag", 0, stop.StopRequested("another rank was asked to stop", 4, 1))
    e = ranks_outcome(tmp_path, "tag", _failed(1, STOP_EXIT), {}, None, False)
    assert isinstance(e, stop.StopRequested)
    assert (e.reason, e.rank, e.iteration, e.epoch, e.saved) == ("SIGUSR1", 1, 4, 1, True)
    # the status alone (its record lost) is still no failure; another status is one
    e = ranks_outcome(tmp_path, "tag", _failed(1, STOP_EXIT), {}, None, False)
    assert isinstance(e, stop.StopRequested) and not e.saved
    assert isinstance(ranks_outcome(tmp_path, "tag", _failed(1, STOP_EXIT + 1), {}, None, False),
                      RankFailedError)


def test_the_rank_sent_the_signal_is_named_when_the_agents_sigterm_reached_a_peer_too(tmp_path):
    """SIGTERM to rank 1: it leaves first (the agent's report), and the agent's SIGTERM to rank 0
    may land while rank 0 still saves, so both records name SIGTERM; rank 1 is the one named."""
    record_stop(tmp_path, "tag", 1, stop.StopRequested("SIGTERM", 6, 2, stage="step1"))
    record_stop(tmp_path, "tag", 0, stop.StopRequested("SIGTERM", 6, 2, stage="step1"))
    e = ranks_outcome(tmp_path, "tag", _failed(1, STOP_EXIT), {}, None, False)
    assert (e.reason, e.rank, e.iteration, e.epoch, e.stage) == ("SIGTERM", 1, 6, 2, "step1")


def test_a_submitit_job_without_a_result_is_one_line(tmp_path):
    from submitit.core.utils import UncompletedJobError

    msg = (f"Job 77 (task: 0) with path {tmp_path}/.submitit/77/77_0_result.pkl\n"
           "has not produced any output (state: FINISHED)\nError stream produced:\n"
           "----------------------------------------\nTraceback (most recent call last):\n ...")
    lines, status = jobs_end_lines(str(tmp_path), UncompletedJobError(msg))
    assert lines == [f"sweep job 77 (task 0) ended without a result (state: FINISHED; killed, "
                     f"or it crashed outside Python); its log: {tmp_path}/.submitit/77/"
                     "77_0_log.err"] and status == 1
    e = stop.StopRequested("SIGTERM", 2, 1, stage="step1")
    e.line = stop_line(e)
    record_stopped_job(str(tmp_path), 0, "77", e)
    lines, status = jobs_end_lines(str(tmp_path), UncompletedJobError(msg))
    assert lines == ["sweep job 0 (77): stopped by SIGTERM in step1 at epoch 1 iteration 2; "
                     "rerun the same command to resume"] and status == 143
    # a launch of job 1 only (a search launches one trial at a time): job 0's stop is not its
    lines, status = jobs_end_lines(str(tmp_path), UncompletedJobError(msg), jobs=[1])
    assert lines[0].startswith("sweep job 77 (task 0) ended without a result") and status == 1
