"""Logging for worker processes: every rank writes <run_dir>/rank<r>.log; rank 0 also prints."""
from __future__ import annotations

import logging
import sys
from pathlib import Path

FMT = "[%(asctime)s][%(name)s][%(levelname)s] %(message)s"


def setup_worker_logging(run_dir: Path, rank: int) -> None:
    root = logging.getLogger()
    root.handlers.clear()
    root.setLevel(logging.INFO)
    fh = logging.FileHandler(Path(run_dir) / f"rank{rank}.log")
    fh.setFormatter(logging.Formatter(FMT))
    root.addHandler(fh)
    if rank == 0:
        sh = logging.StreamHandler(sys.stdout)
        sh.setFormatter(logging.Formatter(FMT))
        root.addHandler(sh)
