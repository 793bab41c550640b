"""The one line a user error becomes instead of a traceback, also when a spawned rank raised it.

A bad config, dataset, checkpoint or rendezvous address is not a bug: the user gets one line on
stderr naming the file/key and what to do, and exit status 1 (``HYDRA_FULL_ERROR=1`` still
shows the traceback). Which classes those are, and the label of each, is mdk/errors.py's
(``UserError`` and its subclasses; the rendezvous error joins them from
launchers/processes/join.py). Errors raised inside spawned ranks arrive as
``RankFailedError`` carrying the rank's traceback text; its last line is matched against the same
classes by name, or, for a rank's full or read-only disk, its ``OSError`` line.
"""
from __future__ import annotations

import re
from typing import Optional

from launchers.processes.join import RendezvousError  # noqa: F401  (registers its label)
from mdk.errors import error_line, user_errors


def user_error_line(exc: BaseException) -> Optional[str]:
    """``"<label>: <message>"`` for a user error (also inside a failed rank), else None."""
    line = error_line(exc)
    if line is not None or type(exc).__name__ != "RankFailedError":
        return line
    labels = {cls.__name__: cls.label for cls in user_errors()}
    last_line = re.compile(r"^(?:[\w.]+\.)?(" + "|".join(map(re.escape, labels)) + r"): (.+)$")
    text = str(exc)
    rank = re.match(r"rank (\d+) failed", text)
    where = f" (rank {rank.group(1)})" if rank else ""
    for line in reversed(text.strip().splitlines()):
        m = last_line.match(line.strip())
        if m:
            return f"{labels[m.group(1)]}{where}: {m.group(2)}"
    # A full/read-only disk met by a rank outside any check: its OSError is the last line.
    lines = text.strip().splitlines()
    m = _OS_ERROR.match(lines[-1].strip()) if lines else None
    if m:
        disk = error_line(OSError(int(m.group(1)), m.group(2), m.group(3)))
        if disk is not None:
            label, _, message = disk.partition(": ")
            return f"{label}{where}: {message}"
    return None


_OS_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*Error: \[Errno (\d+)\] (.+?)(?:: '(.+)')?$")
