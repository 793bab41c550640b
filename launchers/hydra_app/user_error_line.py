"""The one line a user error becomes instead of a traceback, also when a spawned rank raised it
(``HYDRA_FULL_ERROR=1`` still shows the traceback). A rank's error arrives as ``RankFailedError``
with the rank's traceback text, whose last line is matched against the user-error classes by
name, or for a full or read-only disk, as an ``OSError`` line.
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
    rank = re.match(r"rank (\d+) failed", str(exc))
    where = f" (rank {rank.group(1)})" if rank else ""
    lines = str(exc).strip().splitlines()
    for line in reversed(lines):
        m = last_line.match(line.strip())
        if m:
            return f"{labels[m.group(1)]}{where}: {m.group(2)}"
    # A full/read-only disk a rank met outside any check.
    m = _OS_ERROR.match(lines[-1].strip()) if lines else None
    disk = m and error_line(OSError(int(m.group(1)), m.group(2), m.group(3)))
    if not disk:
        return None
    label, _, message = disk.partition(": ")
    return f"{label}{where}: {message}"


_OS_ERROR = re.compile(r"^(?:[\w.]+\.)?\w*Error: \[Errno (\d+)\] (.+?)(?:: '(.+)')?$")
