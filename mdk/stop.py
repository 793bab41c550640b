"""The stop flag: a request to save and stop, set by a launcher's signal handler (or a test), read
by the training loop's StopOnRequestHook (mdk/engine/stop_hook.py). Imports nothing of mdk, so
fault injection and the engine can both read it.
"""
from __future__ import annotations

from typing import Optional

# armed: every rank has stop-signal handlers, so ranks must agree on the step to stop at (a
# collective per step, which runs without handlers do not pay).
_state: dict = {"reason": None, "listeners": 0, "armed": False}


class StopRequested(BaseException):
    """Raised out of the training loop after last.pth was written (``saved``), or out of a signal
    handler where no loop could save (``saved`` False). A BaseException so it passes ``except
    Exception`` blocks (Hydra's job runner, the sweep's failure guard) and the job ends as
    "interrupted". ``reason``: the signal's name or why else; ``epoch`` (1-based) and
    ``iteration`` (optimizer steps done): where last.pth stands; ``stage`` and ``rank`` are filled
    in on the way out."""

    def __init__(self, reason: str, iteration: Optional[int] = None, epoch: Optional[int] = None,
                 saved: bool = True, stage: Optional[str] = None,
                 rank: Optional[int] = None) -> None:
        where = f"after iteration {iteration}; last.pth holds this state" if saved and \
            iteration is not None else "outside a training loop; nothing new was saved"
        super().__init__(f"stopped on request ({reason}) {where}")
        self.reason, self.iteration, self.epoch, self.saved = reason, iteration, epoch, saved
        self.stage, self.rank = stage, rank


def request_stop(reason: str) -> bool:
    """Ask the running training loop to save and stop; safe in a signal handler. False when no
    loop listens (e.g. during calibration): the caller decides then."""
    _state["reason"] = reason
    return _state["listeners"] > 0


def arm(on: bool = True) -> None:
    _state["armed"] = on


def is_armed() -> bool:
    return _state["armed"]


def start_listening() -> None:
    _state["listeners"] += 1


def stop_listening() -> None:
    _state["listeners"] = max(0, _state["listeners"] - 1)


def stop_requested() -> Optional[str]:
    return _state["reason"]


def clear_stop() -> None:
    _state["reason"] = None


def listening() -> bool:
    return _state["listeners"] > 0
