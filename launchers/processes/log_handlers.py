"""Log handlers that survive their destination: a stdout closed early (``| head``), a log file's
disk full (docs/errors.md, #77 and #78). Python's own print ``--- Logging error ---`` and a
traceback for every record they fail to write. The ranks' handlers are these classes; Hydra's job
logging gets their behaviour from :func:`harden_log_handlers` (run.py).
"""
from __future__ import annotations

import contextlib
import errno
import logging
import os
import sys

from mdk.errors import disk_reason


class ConsoleHandler(logging.StreamHandler):
    """A StreamHandler (stdout by default) for which a reader that went away ends nothing."""

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


def harden_log_handlers(logger: logging.Logger | None = None) -> None:
    """Give the plain stream and file handlers of ``logger`` (default: the root, where Hydra's
    job logging puts its console and run.log handlers) the behaviour of the classes above: the
    same objects, their class swapped (neither subclass adds state)."""
    for h in (logger or logging.getLogger()).handlers:
        if type(h) is logging.StreamHandler:
            h.__class__ = ConsoleHandler
        elif type(h) is logging.FileHandler:
            h.__class__ = RunLogFileHandler
