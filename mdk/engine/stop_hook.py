"""Graceful stop on request: write last.pth at the next step boundary, then leave the loop
(docs/errors.md, "Stop signals"; docs/cluster.md, "Preemption and time limits").

A signal handler must not save itself, as it can run mid optimizer step: it only sets the flag,
which the hook checks after every step, so last.pth is a consistent "N steps done" state. Under
DDP the flag is MAX-all-reduced, step N's read after step N+1 (no host sync per step); at an
epoch's end, after evaluation and checkpoint, the ranks agree at once.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

from mdk import dist
from mdk.engine.loop import HookBase
from mdk.stop import (StopRequested, is_armed, start_listening, stop_listening,
                      stop_requested)

log = logging.getLogger(__name__)


class StopOnRequestHook(HookBase):
    """Register after the CheckpointHook. ``save_last`` writes ``last.pth`` (every rank calls it:
    the RNG gather inside is a collective); ``distributed``: the World has several ranks."""

    def __init__(self, save_last: Callable[[], None], distributed: bool = False) -> None:
        self.save_last, self.distributed = save_last, distributed
        self._pending: Optional[Callable[[], float]] = None  # the last step's agreement
        self._at_epoch_end = False  # agreed on the epoch's last step: stop after its checkpoint

    def before_train(self) -> None:
        start_listening()
        self._pending, self._at_epoch_end = None, False

    def after_train(self) -> None:
        stop_listening()
        self._pending = None  # (left by an error: every rank started it, it completes unread)

    def _agreed(self, now: bool) -> bool:
        """Whether any rank was asked: by now, or (``now`` False) by the previous step, whose
        agreement is read without a host sync. This process alone: by now."""
        if not self.distributed:
            return stop_requested() is not None
        if not is_armed():
            return False
        if now:
            self._pending = dist.max_flag_started(float(stop_requested() is not None))
        before = self._pending is not None and self._pending() > 0
        self._pending = None
        return before

    def _stop(self, saved_by_epoch_end: bool) -> None:
        t = self.trainer
        reason = stop_requested() or "another rank was asked to stop"
        if not saved_by_epoch_end:
            self.save_last()
        log.warning("stop requested (%s): saved last.pth after iteration %d; stopping", reason,
                    t.iter)
        raise StopRequested(reason, t.iter, t.epoch + 1)

    def after_step(self) -> None:
        t = self.trainer
        # The last step of an epoch is followed by evaluation and the epoch-end checkpoint; stop
        # after those (after_epoch), so best.pth and the epoch's metrics are not lost.
        mid_epoch = t.batch_in_epoch < t.iters_per_epoch
        if self._agreed(now=False):
            if mid_epoch:
                self._stop(saved_by_epoch_end=False)
            self._at_epoch_end = True
        elif mid_epoch and self.distributed and is_armed():
            # this step's agreement, read after the next step (no host sync now)
            self._pending = dist.max_flag_started(float(stop_requested() is not None))

    def after_epoch(self) -> None:
        t = self.trainer
        asked = self._at_epoch_end or self._agreed(now=True)  # the same on every rank
        self._at_epoch_end = False
        if t.epoch + 1 < t.epochs and asked:
            self._stop(saved_by_epoch_end=True)
