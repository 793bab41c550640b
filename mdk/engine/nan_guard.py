"""The NaN guard of the training loop: a NaN/Inf loss stops the run naming the iteration and the
term, without a host sync per step on CUDA."""
from __future__ import annotations

import logging
import math
from typing import Optional

import torch

from mdk import dist
from mdk.engine.device_io import DeferredRead
from mdk.engine.loop import HookBase
from mdk.errors import NonFiniteLossError

log = logging.getLogger(__name__)
HINT = "The last good checkpoint is kept; lower optim.lr or check the data"


def _not_finite(it: int, names: list[str], values: list[float]) -> NonFiniteLossError:
    """The error naming iteration ``it`` and its non-finite terms (none: another rank's loss)."""
    bad = [(k, v) for k, v in zip(names, values) if not math.isfinite(v)]
    if not bad:
        return NonFiniteLossError(f"loss is not finite at iteration {it} on another rank. {HINT}")
    return NonFiniteLossError(f"loss is not finite at iteration {it}: term(s) "
                              f"{[k for k, _ in bad]} = {[v for _, v in bad]}. {HINT}")


class NanGuardHook(HookBase):
    """A NaN/Inf loss stops the run naming the iteration and the term; no NaN reaches a checkpoint.

    ``skip_limit`` 0 (default): each step records on the device the first bad iteration; the flag
    is read (one sync, under DDP a MIN all-reduce) only at ``check()``: at log steps, before every
    checkpoint write and before each evaluation. With ``skip_limit`` > 0 every step syncs once (to
    skip the optimizer step or not); that many bad batches are skipped before it stops."""

    NONE = 2 ** 62  # "no bad iteration yet"

    def __init__(self, skip_limit: int = 0, check_every: int = 10) -> None:
        self.limit, self.skipped = max(0, int(skip_limit)), 0
        self.every = max(1, int(check_every))
        self.first_bad: Optional[torch.Tensor] = None  # device int64: first bad iteration
        self._read = DeferredRead()
        self.bad_values: Optional[torch.Tensor] = None  # device float per term, at that iteration

    def after_backward(self) -> None:
        t = self.trainer
        vals = torch.stack([v.detach().float().reshape(()) for v in t.loss_terms.values()])
        if self.limit:
            self._skip_or_stop(vals)
            return
        bad = ~torch.isfinite(vals).all()
        if self.first_bad is None:
            self.first_bad = torch.full((), self.NONE, dtype=torch.int64, device=vals.device)
            self.bad_values = torch.zeros_like(vals)
        new = bad & (self.first_bad == self.NONE)
        self.first_bad = torch.where(new, torch.full_like(self.first_bad, t.iter + 1), self.first_bad)
        self.bad_values = torch.where(new, vals, self.bad_values)

    def check(self) -> None:
        """Raise if any step so far had a non-finite loss (every rank calls it: a collective)."""
        if self.limit or self.first_bad is None:
            return
        it = int(dist.all_reduce_min(self.first_bad.clone()))
        if it == self.NONE:
            return
        mine = self.bad_values.tolist() if int(self.first_bad) == it else []
        raise _not_finite(it, list(self.trainer.loss_terms), mine)

    def after_step(self) -> None:
        t = self.trainer
        if t.iter % self.every == 0 and not self.limit and self.first_bad is not None:
            # Read the previous log step's flag (copied back meanwhile: no wait on CUDA) and
            # start copying this one.
            got = self._read.pop()
            if got is not None and int(got[0]) != self.NONE:
                self.check()
            self._read.push(dist.all_reduce_min(self.first_bad.clone()))

    def after_epoch(self) -> None:
        self.check()

    def _skip_or_stop(self, vals: torch.Tensor) -> None:
        t = self.trainer
        bad = (~torch.isfinite(t.loss_terms["total"].detach()).all()).float().reshape(1)
        if not dist.all_reduce_max(bad).item():
            return
        e = _not_finite(t.iter + 1, list(t.loss_terms), vals.tolist())
        if self.skipped >= self.limit:
            raise NonFiniteLossError(f"{e} (trainer.nan_skip_limit={self.limit} bad batches were "
                                     "already skipped)")
        self.skipped += 1
        t.skip_step = True
        log.warning("%s; skipping this batch (%d of trainer.nan_skip_limit=%d)", e, self.skipped,
                    self.limit)
