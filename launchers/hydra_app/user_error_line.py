"""The one line a user error becomes instead of a traceback, also when a spawned rank raised it.

A bad config, dataset, checkpoint or rendezvous address is not a bug: the user gets one line on
stderr naming the file/key and what to do, and exit status 1 (``HYDRA_FULL_ERROR=1`` still
shows the traceback). Which classes those are, and the label of each, is mdk/errors.py's
(``UserError`` and its subclasses; the rendezvous error joins them from
launchers/processes/rendezvous.py). Errors raised inside spawned ranks arrive as
``RankFailedError`` carrying the rank's traceback text; its last line is matched against the same
classes by name.
"""
from __future__ import annotations

import re
from typing import Optional

from launchers.processes.rendezvous import RendezvousError  # noqa: F401  (registers its label)
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
    for line in reversed(text.strip().splitlines()):
        m = last_line.match(line.strip())
        if m:
            where = f" (rank {rank.group(1)})" if rank else ""
            return f"{labels[m.group(1)]}{where}: {m.group(2)}"
    return None
