"""How a submitit job that returned no result ended, as one line in the launching process
(docs/cluster.md, "Preemption"), instead of submitit's error holding the job's whole stderr. A job
a signal stopped records its line in ``<sweep dir>/.submitit/stops/<job>.json``.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Collection, Optional

from launchers.reports.stop_line import stop_line, stop_status
from mdk.atomic_file import write_json
from mdk.stop import StopRequested

STOPS = Path(".submitit") / "stops"


class JobsEndedError(SystemExit):
    """Jobs of a launch returned no result: ``lines`` say how each ended; the exit status is the
    command's. A search's sweeper catches it and fails that trial."""

    def __init__(self, status: int, lines: list[str]) -> None:
        super().__init__(status)
        self.lines = lines


def _record(sweep_dir: str, job_num: int) -> Path:
    return Path(sweep_dir) / STOPS / f"{job_num}.json"


def record_stopped_job(sweep_dir: str, job_num: int, job_id: str, e: StopRequested) -> None:
    """In the job: its stop, for the launching process (a requeued rerun forgets it)."""
    path = _record(sweep_dir, job_num)
    # whole or absent: a job killed mid-write leaves no half JSON
    write_json(path, {"job": job_num, "id": job_id, "status": stop_status(e),
                      "line": getattr(e, "line", None) or stop_line(e)})


def forget_stopped_job(sweep_dir: str, job_num: int) -> None:
    _record(sweep_dir, job_num).unlink(missing_ok=True)


def jobs_end_lines(sweep_dir: str, error: BaseException,
                   jobs: Optional[Collection[int]] = None) -> tuple[list[str], int]:
    """The lines for jobs that returned no result, and the command's exit status: the recorded
    stops, else one line from submitit's error (status 1). ``jobs``: this launch's job numbers
    (a search launches trials while others run)."""
    recs = sorted((json.loads(p.read_text()) for p in (Path(sweep_dir) / STOPS).glob("*.json")),
                  key=lambda r: r["job"])
    recs = [r for r in recs if jobs is None or r["job"] in jobs]
    if recs:
        return [f"sweep job {r['job']} ({r['id']}): {r['line']}" for r in recs], recs[0]["status"]
    text = str(error)
    job = re.search(r"Job (\S+) \(task: (\d+)\) with path (\S+)_result\.pkl", text)
    state = re.search(r"has not produced any output \(state: ([^)]*)\)", text)
    log = re.search(r"^\s*- (\S+_log\.err)$", text, re.M)
    if job:
        where = f"{job.group(3)}_log.err"
        return [f"sweep job {job.group(1)} (task {job.group(2)}) ended without a result "
                f"(state: {state.group(1) if state else 'unknown'}; killed, or it crashed "
                f"outside Python); its log: {where}"], 1
    last = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith(("-", " "))]
    cause = next((ln for ln in reversed(last) if not ln.startswith(("You can check", "or at"))),
                 text.strip().splitlines()[0] if text.strip() else type(error).__name__)
    return [f"sweep job failed: {cause}" + (f"; its log: {log.group(1)}" if log else "")], 1
