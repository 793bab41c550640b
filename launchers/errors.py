"""Which exceptions are the user's to fix, and the one line they see instead of a traceback.

A bad config, dataset, checkpoint or rendezvous address is not a bug: the user gets one line on
stderr naming the file/key and what to do, and exit status 1 (``HYDRA_FULL_ERROR=1`` still
shows the traceback). Errors raised inside spawned ranks arrive as ``RankFailedError`` carrying
the rank's traceback text; its last line is matched against the same classes.
"""
from __future__ import annotations

import re
from typing import Optional

from launchers.rendezvous import RendezvousError
from mdk.checkpoint import CheckpointError
from mdk.config import ConfigError
from mdk.data.voc import DataError
from mdk.engine.loop import NonFiniteLossError
from mdk.errors import MissingStageInput

KINDS: dict[type, str] = {
    ConfigError: "config error",
    DataError: "data error",
    CheckpointError: "checkpoint error",
    MissingStageInput: "missing stage input",
    NonFiniteLossError: "training stopped",
    RendezvousError: "distributed setup error",
}
_NAMES = {cls.__name__: kind for cls, kind in KINDS.items()}
# Subclasses raised by the code (NonFiniteWeightsError is a CheckpointError) keep their kind.
_NAMES["NonFiniteWeightsError"] = "training stopped"
_LAST_LINE = re.compile(r"^(?:[\w.]+\.)?(" + "|".join(map(re.escape, _NAMES)) + r"): (.+)$")


def user_error_line(exc: BaseException) -> Optional[str]:
    """``"<kind>: <message>"`` for a user error (also inside a failed rank), else None."""
    for cls, kind in KINDS.items():
        if isinstance(exc, cls):
            if type(exc).__name__ == "NonFiniteWeightsError":
                kind = "training stopped"
            return f"{kind}: {exc}"
    if type(exc).__name__ == "RankFailedError":
        text = str(exc)
        rank = re.match(r"rank (\d+) failed", text)
        for line in reversed(text.strip().splitlines()):
            m = _LAST_LINE.match(line.strip())
            if m:
                where = f" (rank {rank.group(1)})" if rank else ""
                return f"{_NAMES[m.group(1)]}{where}: {m.group(2)}"
    return None
