"""Stop signals: SIGTERM, SIGINT and SIGUSR1 ask the run to save and stop (docs/errors.md, "Stop
signals"). Two kinds of process install the handlers:

* ``launcher``: the process the user (or SLURM, Kubernetes) started. With spawned ranks running
  (``forwarding``) the first signal goes to torch's elastic agent as its ``SignalException``; a
  second one, more than ``DUPLICATE_S`` after the first, exits at once without saving.
* ``rank``: a spawned or torchrun rank. Repeats are ignored (the same signal often comes twice);
  whoever started the rank decides when to kill it.

With no training loop listening, the handler raises ``StopRequested`` (``saved`` False) at once.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import time
from typing import Any, Iterator, Optional

from torch.distributed.elastic.multiprocessing.api import SignalException

from mdk.stop import StopRequested, arm, clear_stop, request_stop

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)
DUPLICATE_S = 1.0  # a repeat sooner than this is the same request delivered twice

# kind: "launcher" | "rank"; first: the first stop signal's number; at: when it came;
# forwarding: spawned ranks run under torch's elastic agent in this process.
# held: this process's work is over (hold_stop_signals).
_state: dict[str, Any] = {"kind": None, "first": None, "at": 0.0, "forwarding": False,
                          "held": False}


def received() -> Optional[int]:
    """The first stop signal this process got (its number), or None."""
    return _state["first"]


def _handle(signum: int, frame: Any) -> None:
    name = signal.Signals(signum).name
    if _state["held"]:  # a signal sent to the process may reach a thread that did not block it
        return
    if _state["first"] is not None:
        if _state["kind"] == "launcher" and time.monotonic() - _state["at"] > DUPLICATE_S:
            exit_at_once(signum)
        return
    _state["first"], _state["at"] = signum, time.monotonic()
    if _state["forwarding"]:
        request_stop(name)  # nothing listens here: the reason, for between stages
        log.warning("caught %s: the ranks save last.pth after their current step and stop "
                    "(a second signal ends them at once)", name)
        raise SignalException(f"caught {name}", sigval=signal.Signals(signum))  # to the agent

    if request_stop(name):
        log.warning("caught %s: saving last.pth after the current step, then stopping", name)
        return
    raise StopRequested(name, saved=False)


def exit_at_once(signum: int) -> None:
    """The second signal: one line, exit 128 + signum (no teardown; the ranks die with us)."""
    name = signal.Signals(signum).name
    line = (f"stopped by a second {name}: ended at once without saving; the last checkpoint "
            "(last.pth) is kept, rerun the same command to resume from it")
    log.error("%s", line)
    logging.shutdown()
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, (line + "\n").encode())
    os._exit(128 + signum)


@contextlib.contextmanager
def stop_signals(kind: str) -> Iterator[None]:
    """While inside, the stop signals ask this process's run to stop (see the module doc); the
    previous handlers come back after. Unblocks them (a spawned rank starts with them blocked)."""
    prev = {s: signal.getsignal(s) for s in STOP_SIGNALS}
    _state.update(kind=kind, first=None, at=0.0, forwarding=False, held=False)
    clear_stop()
    for s in STOP_SIGNALS:
        signal.signal(s, _handle)
    arm(True)  # every rank listens: the loop's per-step agreement is needed
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    try:
        yield
    finally:
        arm(False)
        for s in STOP_SIGNALS:
            signal.signal(s, prev[s])
        _state.update(kind=None, first=None, forwarding=False, held=False)


def hold_stop_signals() -> None:
    """From now on the stop signals wait (blocked) in this process: its work is over, and no
    handler may raise into its last steps."""
    _state["held"] = True
    signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def end_on_stop_signals() -> None:
    """From now on a stop signal ends this process at once (the signal's default action): its
    work is over and its result handed on, so there is nothing left to save."""
    for s in STOP_SIGNALS:
        signal.signal(s, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)


@contextlib.contextmanager
def forwarding() -> Iterator[None]:
    """While inside, a stop signal to this process goes to the elastic agent running the ranks."""
    _state["forwarding"] = True
    try:
        yield
    finally:
        _state["forwarding"] = False
