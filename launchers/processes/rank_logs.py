"""Logging for the ranks of a run: every rank writes <run_dir>/rank<r>.log; only rank 0 prints.

All ranks of a machine log into the one run directory the parent (or, under torchrun/SLURM,
rank 0) resolved, so a multi-process run leaves one folder with one log per rank.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

from launchers.processes.log_handlers import ConsoleHandler, RunLogFileHandler

# Hydra's default job-logging format, so worker lines look like the parent's.
FMT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"


def setup_worker_logging(run_dir: Path, rank: int, keep_existing: bool = False) -> None:
    """Send this process's logs to ``<run_dir>/rank<rank>.log`` (and stdout on rank 0).

    ``keep_existing``: rank 0 under torchrun/SLURM keeps Hydra's console and run.log handlers
    (it is the process the user watches) and only gains the rank file."""
    root = logging.getLogger()
    if not keep_existing:
        root.handlers.clear()
    root.setLevel(logging.INFO)
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    fh = RunLogFileHandler(Path(run_dir) / f"rank{rank}.log")  # a full disk: one line
    fh.setFormatter(logging.Formatter(FMT))
    root.addHandler(fh)
    if rank == 0 and not keep_existing:
        sh = ConsoleHandler(sys.stdout)  # `| head`: no logging tracebacks
        sh.setFormatter(logging.Formatter(FMT))
        root.addHandler(sh)


def remove_rank_file_handler(rank: int) -> None:
    """Undo the rank file handler (a process that runs several stages adds it once per stage)."""
    root = logging.getLogger()
    for h in list(root.handlers):
        if isinstance(h, logging.FileHandler) and Path(h.baseFilename).name == f"rank{rank}.log":
            root.removeHandler(h)
            h.close()
