"""How the spawned ranks of a stage ended, in one report: a failure, a stop, or nothing to say
(the forms: docs/distributed.md, "Failure behaviour"). A rank that raises leaves its traceback in
torch's error file, a stop its point in ``<run_dir>/.errors/``; a killed rank leaves neither, and
its peers fail only with "connection reset by peer", so the cause is looked for in that order:
a real traceback, a rank that ended without a word, a stop, lost connections only.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path
from typing import Any, Optional

from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs
from torch.distributed.elastic.multiprocessing.api import LogsDest

from mdk.stop import StopRequested

OOM_HINT = "out of memory? see `dmesg` or the job's memory limit"
CRASH_SIGNALS = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL")
# How a spawned rank that stopped on request ends (sysexits.h EX_TEMPFAIL: rerun to resume). Not
# 0: torch's agent waits for a result from every rank that ends cleanly.
STOP_EXIT = 75


class RankFailedError(RuntimeError):
    """A rank raised or died; the message is its traceback, or one line on how it ended."""


def record_stop(run_dir: Path, tag: str, rank: int, e: StopRequested) -> None:
    """A rank stopped on request: why, and where last.pth stands."""
    errors = Path(run_dir) / ".errors"
    errors.mkdir(parents=True, exist_ok=True)
    (errors / f"{tag}_stop_rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "reason": e.reason, "iteration": e.iteration, "epoch": e.epoch,
         "saved": e.saved, "stage": e.stage}))


def lost_peer(text: str) -> bool:
    """True for the error a healthy rank gets when a peer died (gloo/NCCL connection lost), or
    when the agent's shutdown SIGTERMed its process group while a loader worker was starting."""
    return any(k in text for k in ("closed by peer", "Connection reset", "remote worker crashing",
                                   "remote process exited", "Broken pipe",
                                   "is killed by signal: Terminated"))


def how_it_ended(code: int) -> str:
    """``was killed by SIGKILL (...)`` / ``was terminated by SIGTERM`` / ``exited with code 3``."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"was killed by signal {-code}"
    if name == "SIGKILL":
        return f"was killed by SIGKILL ({OOM_HINT})"
    if name in CRASH_SIGNALS:
        return f"crashed with {name}"
    return f"was terminated by {name}"


def _stopped(stops: list[dict[str, Any]], signum: Optional[int],
             left_first: set[int]) -> StopRequested:
    """The stop the ranks made: the signal (the launcher's, or the one a rank got itself), the
    stage they were in and where last.pth stands (rank 0 wrote it; every rank agreed on the
    step). ``left_first``: the rank the agent saw leave on request first, the one that was sent
    the signal (its peers may get the agent's SIGTERM too while they save: their records name it
    as well)."""
    signals = {s.name for s in signal.Signals}
    direct = sorted((s for s in stops if s["reason"] in signals),
                    key=lambda s: (s["rank"] not in left_first, s["rank"]))
    name = signal.Signals(signum).name if signum is not None else \
        (direct[0]["reason"] if direct else "a stop request")
    sent_to = direct[0]["rank"] if signum is None and direct else None
    stage = next((s["stage"] for s in sorted(stops, key=lambda s: s["rank"]) if s.get("stage")),
                 None)
    saved = [s for s in stops if s["saved"] and s["iteration"] is not None]
    if not saved:  # (a stop between stages saved its stage whole: a record says so)
        done = any(s["saved"] for s in stops)
        return StopRequested(name, saved=done, stage=stage, rank=sent_to)
    at = min(saved, key=lambda s: s["rank"])
    return StopRequested(name, at["iteration"], at["epoch"], stage=stage, rank=sent_to)


class ErrorFileLogs(DefaultLogsSpecs):
    """torch's default log layout under ``log_dir``, keeping the error file the agent gives each
    local rank (``LogsDest.error_files``, torch's ``TORCHELASTIC_ERROR_FILE``): after the ranks
    end, the launcher reads the tracebacks there, whether the agent reported a failure or was
    stopped by a signal (then it reports none)."""

    def __init__(self, log_dir: str) -> None:
        super().__init__(log_dir=log_dir)
        self.error_files: dict[int, str] = {}  # local rank -> the file torch named

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        self.error_files.update(dest.error_files)
        return dest


def error_files(files: dict[int, str], first_rank: int) -> dict[int, str]:
    """The tracebacks in torch's error files (``files``: local rank -> path; a rank that raised
    wrote its file), by global rank, the first written first (torch's own time stamp is in whole
    seconds). The agent's ``ChildFailedError`` names only the first rank it saw end, which may be
    a peer that merely lost its connection."""
    written = [(Path(p), r) for r, p in files.items() if p != os.devnull and Path(p).is_file()]
    out = {}
    for p, local in sorted(written, key=lambda w: w[0].stat().st_mtime_ns):
        m = json.loads(p.read_text())["message"]
        out[first_rank + local] = m["extraInfo"]["py_callstack"] if isinstance(m, dict) else str(m)
    return out


def ranks_outcome(run_dir: Path, tag: str, failures: Optional[dict[int, Any]],
                  tracebacks: dict[int, str], signum: Optional[int],
                  several_machines: bool) -> Optional[BaseException]:
    """What to raise after the local ranks ended: ``failures``: the elastic agent's (global rank
    -> ``ProcessFailure``: pid and exit code); ``tracebacks``: of the ranks that raised
    (``error_files``); ``signum``: a stop signal the launcher got. None when every rank
    finished. Removes the stop records."""
    stops = [json.loads(p.read_text())
             for p in (Path(run_dir) / ".errors").glob(f"{tag}_stop_rank*.json")]
    shutil.rmtree(Path(run_dir) / ".errors", ignore_errors=True)
    failures = failures or {}
    log = lambda r: f"{run_dir}/rank{r}.log"  # noqa: E731
    real = [r for r, t in tracebacks.items() if not lost_peer(t)]  # in the order written
    if real:  # the rank's own traceback (a user error's last line becomes its one line)
        r = real[0]
        return RankFailedError(f"rank {r} failed (log: {log(r)}):\n{tracebacks[r]}")
    stopped = {r for r, f in failures.items() if f.exitcode == STOP_EXIT}  # left on request
    silent = sorted((r, f) for r, f in failures.items() if r not in tracebacks and r not in stopped)
    if silent and signum is None:
        r, f = silent[0]
        return RankFailedError(f"rank {r} (pid {f.pid}) {how_it_ended(f.exitcode)}; "
                               f"its log: {log(r)}")
    if signum is not None or stops or stopped:
        return _stopped(stops, signum, stopped)
    if tracebacks:
        r = next(iter(tracebacks))
        where = ("a rank on another machine probably ended first; see that machine's rank*.log"
                 if several_machines else "its peer ended without a report")
        return RankFailedError(f"rank {r} lost its connection to the other ranks: {where} "
                               f"(this rank's log: {log(r)})")
    return None
