"""How the spawned ranks of a stage ended, in one report: a failure, a stop, or nothing to say.

Each rank leaves a record in ``<run_dir>/.errors/`` when it raises (its traceback) or stops on
request (where last.pth stands); a rank killed by a signal or ending with an exit code leaves
none, and its peers then fail only with "connection reset by peer". The report names the cause:

* a rank that raised (not a lost connection): ``rank 1 failed (log: ...):`` and its traceback;
* else, a stop signal reached the launcher or a rank: ``StopRequested`` with the stop point;
* else, a rank that ended without a word: ``rank 1 (pid 4242) was killed by SIGKILL ...; its
  log: <run_dir>/rank1.log`` (``was terminated by SIGTERM``, ``crashed with SIGSEGV``,
  ``exited with code 3``), never its peers' "connection reset" traceback;
* else only lost connections: a rank on another machine ended first.
"""
from __future__ import annotations

import json
import shutil
import signal
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

from mdk.stop import StopRequested

OOM_HINT = "out of memory? see `dmesg` or the job's memory limit"
CRASH_SIGNALS = ("SIGSEGV", "SIGABRT", "SIGBUS", "SIGFPE", "SIGILL")


class RankFailedError(RuntimeError):
    """A rank raised or died; the message is its traceback, or one line on how it ended."""


def _errors(run_dir: Path) -> Path:
    d = Path(run_dir) / ".errors"
    d.mkdir(parents=True, exist_ok=True)
    return d


def record_failure(run_dir: Path, tag: str, rank: int) -> None:
    """In a rank's ``except`` block: its traceback, for the launcher's report."""
    (_errors(run_dir) / f"{tag}_rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "time": time.time(), "traceback": traceback.format_exc()}))


def record_stop(run_dir: Path, tag: str, rank: int, e: StopRequested) -> None:
    """A rank stopped on request: why, and where last.pth stands."""
    (_errors(run_dir) / f"{tag}_stop_rank{rank}.json").write_text(json.dumps(
        {"rank": rank, "reason": e.reason, "iteration": e.iteration, "epoch": e.epoch,
         "saved": e.saved}))


def lost_peer(text: str) -> bool:
    """True for the error a healthy rank gets when a peer died (gloo/NCCL connection lost)."""
    return any(k in text for k in ("closed by peer", "Connection reset", "remote worker crashing",
                                   "remote process exited", "Broken pipe"))


def _load(run_dir: Path, pattern: str) -> list[dict[str, Any]]:
    return [json.loads(p.read_text()) for p in (Path(run_dir) / ".errors").glob(pattern)]


def how_it_ended(rank: int, pid: int, code: int) -> str:
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


def _stopped(stops: list[dict[str, Any]], signum: Optional[int]) -> StopRequested:
    """The stop the ranks made: the signal (the launcher's, or the one a rank got itself) and
    where last.pth stands (rank 0 wrote it; every rank agreed on the step)."""
    signals = {s.name for s in signal.Signals}
    direct = sorted((s for s in stops if s["reason"] in signals), key=lambda s: s["rank"])
    name = signal.Signals(signum).name if signum is not None else \
        (direct[0]["reason"] if direct else "a stop request")
    sent_to = direct[0]["rank"] if signum is None and direct else None
    saved = [s for s in stops if s["saved"] and s["iteration"] is not None]
    if not saved:
        return StopRequested(name, saved=False, rank=sent_to)
    at = min(saved, key=lambda s: s["rank"])
    return StopRequested(name, at["iteration"], at["epoch"], rank=sent_to)


def ranks_outcome(run_dir: Path, tag: str, procs: Sequence[Any], first_rank: int,
                  first_index: Optional[int], signum: Optional[int],
                  several_machines: bool) -> Optional[BaseException]:
    """What to raise after the local ranks ``procs`` (with ``.pid``, ``.exitcode``) ended:
    ``first_index``: the one torch saw fail first; ``signum``: a stop signal the launcher got.
    None when every rank finished. Removes the records."""
    fails = sorted(_load(run_dir, f"{tag}_rank*.json"), key=lambda r: r["time"])
    stops = _load(run_dir, f"{tag}_stop_rank*.json")
    shutil.rmtree(Path(run_dir) / ".errors", ignore_errors=True)
    if not stops and all(p.exitcode == 0 for p in procs):
        return None  # finished (a signal meanwhile stops the run before the next stage)
    log = lambda r: f"{run_dir}/rank{r}.log"  # noqa: E731
    real = [f for f in fails if not lost_peer(f["traceback"])]
    if real:  # the rank's own traceback (a user error's last line becomes its one line)
        r = real[0]["rank"]
        return RankFailedError(f"rank {r} failed (log: {log(r)}):\n{real[0]['traceback']}")
    if signum is not None or stops:
        return _stopped(stops, signum)
    said = {f["rank"] for f in fails}
    silent = [(first_rank + i, p.pid, p.exitcode) for i, p in enumerate(procs)
              if p.exitcode not in (0, None) and first_rank + i not in said]
    if silent:
        first = [s for s in silent if first_index is not None and s[0] == first_rank + first_index]
        r, pid, code = (first or silent)[0]
        return RankFailedError(f"rank {r} (pid {pid}) {how_it_ended(r, pid, code)}; its log: "
                               f"{log(r)}")
    if fails:
        r = fails[0]["rank"]
        where = ("a rank on another machine probably ended first; see that machine's rank*.log"
                 if several_machines else "its peer ended without a report")
        return RankFailedError(f"rank {r} lost its connection to the other ranks: {where} "
                               f"(this rank's log: {log(r)})")
    return None
