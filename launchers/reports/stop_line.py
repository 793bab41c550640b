"""The one line a run stopped by a signal ends with, and its exit status: 128 + the signal, what a
shell reports for a process the signal ended, so SLURM's requeue and scripts behave as usual.
"""
from __future__ import annotations

import signal
from typing import Optional

from mdk.stop import StopRequested

RERUN = "rerun the same command to resume"
# A search's trial is not resumed: the rerun fails it and runs it again as a new trial.
SEARCH_RERUN = ("rerun the same command to continue the study (a trial that was running runs "
                "again as a new trial)")


def sweep_rerun(sweep_dir: str, to: str = "resume") -> str:
    """What to type to continue a sweep a stop ended."""
    return (f"rerun the same command with hydra.sweep.dir={sweep_dir} "
            f"hydra.callbacks.sweep.resume=true to {to}")


def stop_line(e: StopRequested, rerun: Optional[str] = None) -> str:
    by = f"stopped by {e.reason}" + (f" (sent to rank {e.rank})" if e.rank is not None else "")
    if e.saved and e.iteration is not None:
        where = f" in {e.stage}" if e.stage else ""
        epoch = f" epoch {e.epoch}" if e.epoch is not None else ""
        at = f"{where} at{epoch} iteration {e.iteration}"
    elif e.saved and e.stage:
        at = f" after {e.stage} finished"
    elif e.stage:
        at = (f" in {e.stage} outside its training loop (nothing new to save: its last "
              "checkpoint is kept)")
    else:
        at = " before any stage started"
    return f"{by}{at}; {rerun or RERUN}"


def stop_status(e: StopRequested) -> int:
    """128 + the signal's number; 143 when a peer's request, not a signal, stopped this process."""
    try:
        return 128 + int(signal.Signals[e.reason])
    except KeyError:
        return 128 + int(signal.SIGTERM)
