"""The stop flag: a request to save and stop, set by whoever asks (a launcher's signal handler,
a test), read by the training loop's StopOnRequestHook (mdk/engine/stop_hook.py).

Low on purpose: fault injection and the engine both read it, and it imports nothing of mdk. Its
state changes only through the functions below.
"""
from __future__ import annotations

from typing import Optional

# reason: why a stop was asked (None: not asked); listeners: running loops with the hook;
# armed: a launcher installed stop-signal handlers in every rank, so the ranks must agree on the
# step to stop at (a collective per step; distributed runs without handlers, e.g. a test's own
# process group, pay nothing).
_state: dict = {"reason": None, "listeners": 0, "armed": False}


class StopRequested(BaseException):
    """Raised out of the training loop after last.pth was written (``saved``), or out of a stop
    signal's handler where no training loop could save (``saved`` False: the stage's last
    checkpoint is what a rerun resumes from).

    A BaseException on purpose: it must pass through ``except Exception`` blocks (Hydra's job
    runner, the sweep's failure guard) so the job ends as "interrupted", not as failed or done.
    ``reason``: the signal's name (``"SIGTERM"``), or why else; ``epoch`` (1-based) and
    ``iteration`` (optimizer steps done): where last.pth stands; ``stage`` and ``rank``
    (the rank the signal reached, when not the launching process) are filled in on the way out."""

    def __init__(self, reason: str, iteration: Optional[int] = None, epoch: Optional[int] = None,
                 saved: bool = True, stage: Optional[str] = None,
                 rank: Optional[int] = None) -> None:
        where = f"after iteration {iteration}; last.pth holds this state" if saved and \
            iteration is not None else "outside a training loop; nothing new was saved"
        super().__init__(f"stopped on request ({reason}) {where}")
        self.reason, self.iteration, self.epoch, self.saved = reason, iteration, epoch, saved
        self.stage, self.rank = stage, rank


def request_stop(reason: str) -> bool:
    """Ask the running training loop to save and stop. Safe to call from a signal handler.

    Returns True when a loop with a StopOnRequestHook is running and will act on it; False when
    nothing listens (e.g. during calibration or data generation): the caller decides then."""
    _state["reason"] = reason
    return _state["listeners"] > 0


def arm(on: bool = True) -> None:
    """Called by a launcher on every rank before training when stop requests may come."""
    _state["armed"] = on


def is_armed() -> bool:
    return _state["armed"]


def start_listening() -> None:
    """A training loop that acts on requests starts (StopOnRequestHook.before_train)."""
    _state["listeners"] += 1


def stop_listening() -> None:
    _state["listeners"] = max(0, _state["listeners"] - 1)


def stop_requested() -> Optional[str]:
    return _state["reason"]


def clear_stop() -> None:
    _state["reason"] = None


def listening() -> bool:
    return _state["listeners"] > 0
