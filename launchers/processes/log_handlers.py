"""Log handlers that survive their destination: a stdout closed early (``| head``), a log file's
disk full (docs/errors.md, #77 and #78). Python's own print ``--- Logging error ---`` and a
traceback for every record they fail to write. The ranks log through these classes (every rank
to ``<run_dir>/rank<r>.log``, rank 0 also to stdout); Hydra's job logging names them
(conf/hydra/job_logging/mdk.yaml).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys
from pathlib import Path

from mdk.errors import disk_reason

# Hydra's default job-logging format, so worker lines look like the parent's.
FMT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"
# ``extra=FILE_ONLY``: a record for the log files, not the console (a rank's traceback of a user
# error, whose one line the launcher prints).
FILE_ONLY = {"file_only": True}


class ConsoleHandler(logging.StreamHandler):
    """A StreamHandler (stdout by default) for which a reader that went away ends nothing, and
    which leaves the records logged with ``extra=FILE_ONLY`` to the files."""

    def filter(self, record: logging.LogRecord) -> bool | logging.LogRecord:
        return not getattr(record, "file_only", False) and super().filter(record)

    def handleError(self, record: logging.LogRecord) -> None:
        exc = sys.exc_info()[1]
        if isinstance(exc, OSError) and exc.errno == errno.EPIPE:
            # The rest of the stream's writes (and its buffer at exit) go to /dev/null; without
            # a file descriptor (a test's capture) there is nothing to redirect.
            with contextlib.suppress(OSError, ValueError):
                devnull = os.open(os.devnull, os.O_WRONLY)
                os.dup2(devnull, self.stream.fileno())
                os.close(devnull)
            return
        super().handleError(record)


class RunLogFileHandler(logging.FileHandler):
    """A FileHandler whose full, read-only or forbidden disk costs one line on stderr, once."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:
        reason = disk_reason(sys.exc_info()[1])
        if reason is None:
            super().handleError(record)
            return
        self.failed = True
        with contextlib.suppress(OSError, ValueError):
            sys.stderr.write(f"warning: could not write the log file {self.baseFilename}: "
                             f"{reason}; the run goes on, its log lines only on the console\n")
            sys.stderr.flush()


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
