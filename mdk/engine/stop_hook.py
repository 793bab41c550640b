"""Graceful stop on request: write last.pth at the next step boundary, then leave the loop.

Who asks is not this module's business (``mdk`` knows nothing about SLURM): the launcher turns a
preemption / time-limit signal into ``request_stop(reason)``; a signal handler must not save a
checkpoint itself, because it can run in the middle of an optimizer step. The hook checks the
flag after every step, so the saved state is always a consistent "N steps done" state, the same
kind of last.pth the periodic checkpoints write, and a resumed run continues bit-identically.

Under DDP the ranks may see the signal at different steps; the flag is MAX-all-reduced every step
so all ranks stop after the same step (one tiny collective per step, only when world > 1).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from mdk import dist
from mdk.engine.loop import HookBase
from mdk.stop import (StopRequested, is_armed, start_listening, stop_listening,
                      stop_requested)

log = logging.getLogger(__name__)


class StopOnRequestHook(HookBase):
    """Register after the CheckpointHook. ``save_last`` writes ``last.pth`` (on rank 0; every rank
    calls it, as for the periodic checkpoint, since the RNG gather inside is a collective)."""

    def __init__(self, save_last: Callable[[], None]) -> None:
        self.save_last = save_last

    def before_train(self) -> None:
        start_listening()

    def after_train(self) -> None:
        stop_listening()

    def _agreed(self) -> bool:
        flag = stop_requested() is not None
        if dist.world_size() <= 1:
            return flag
        if not is_armed():
            return False
        t = torch.tensor([1.0 if flag else 0.0], device=self.trainer.device)
        return bool(dist.all_reduce_max(t).item())

    def _stop(self, saved_by_epoch_end: bool) -> None:
        t = self.trainer
        reason = stop_requested() or "another rank was asked to stop"
        if not saved_by_epoch_end:
            self.save_last()
        log.warning("stop requested (%s): saved last.pth after iteration %d; stopping", reason,
                    t.iter)
        raise StopRequested(reason, t.iter)

    def after_step(self) -> None:
        t = self.trainer
        # The last step of an epoch is followed by evaluation and the epoch-end checkpoint; stop
        # after those (after_epoch), so best.pth and the epoch's metrics are not lost.
        if t.batch_in_epoch < t.iters_per_epoch and self._agreed():
            self._stop(saved_by_epoch_end=False)

    def after_epoch(self) -> None:
        t = self.trainer
        if t.epoch + 1 < t.epochs and self._agreed():
            self._stop(saved_by_epoch_end=True)
