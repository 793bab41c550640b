"""The time-left line of a stage: after the first epoch (and the first evaluation), how long the
rest of the stage takes at the measured pace, and how that stands against a time budget."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

from mdk.engine.hooks import evaluates
from mdk.engine.loop import HookBase

log = logging.getLogger(__name__)


class TimeLeftHook(HookBase):
    """After this process's first epoch (and again after its first evaluation, when that came
    later), one line with the time to the end of the stage: the epochs left times the measured
    epoch (``weights``: each epoch's cost relative to the first, for a resolution schedule), plus
    the evaluations left times the measured evaluation; with a time budget, how that stands
    against it. Register it last."""

    def __init__(self, stage: str, eval_every: int, is_main: bool,
                 weights: Optional[Callable[[], list[float]]] = None,
                 budget: Optional[Any] = None) -> None:
        self.stage, self.every, self.is_main = stage, max(1, eval_every), is_main
        self.weights, self.budget = weights, budget
        self.epoch_s: Optional[float] = None  # a training epoch, evaluation excluded
        self.said_eval = False

    def before_epoch(self) -> None:
        self._t0 = time.perf_counter()
        self._steps: list[float] = []  # the ends of this epoch's first and latest steps
        self._b0 = self.trainer.batch_in_epoch  # a resumed epoch starts part-way
        self.trainer.last_eval_s = None

    def after_step(self) -> None:
        if self.epoch_s is None:  # the first epoch measures the steady step
            self._steps[1:] = [time.perf_counter()] if self._steps else []
            if not self._steps:
                self._steps.append(time.perf_counter())

    def _steady(self, took: float, eval_s: float) -> float:
        """The first epoch's time without what only it pays (loader start-up, first-step set-up):
        its later steps' mean for every step, plus what followed the last step (the checkpoint)."""
        t = self.trainer
        n = t.batch_in_epoch - self._b0
        if len(self._steps) < 2 or n < 3:
            return took - eval_s
        first, last = self._steps
        after = (self._t0 + took) - last - eval_s
        return (last - first) / (n - 1) * t.iters_per_epoch + max(0.0, after)

    def _weight(self, epoch: int) -> float:
        w = self.weights() if self.weights is not None else None
        return w[epoch] / w[self._first] if w and epoch < len(w) else 1.0

    def after_epoch(self) -> None:
        t = self.trainer
        took = time.perf_counter() - self._t0
        eval_s = getattr(t, "last_eval_s", None)
        first = self.epoch_s is None
        if first:
            self.epoch_s, self._first = self._steady(took, eval_s or 0.0), t.epoch
        if not self.is_main or t.stop or not (first or (eval_s is not None and not self.said_eval)):
            return
        epochs_left = t.epochs - t.epoch - 1
        evals_left = sum(evaluates(e, self.every, t.epochs) for e in range(t.epoch + 1, t.epochs))
        left = sum(self._weight(e) for e in range(t.epoch + 1, t.epochs)) * self.epoch_s \
            + evals_left * (eval_s or 0.0)
        done = f"epoch {t.epoch + 1} took {took:.0f} s" + (
            f" (its evaluation {eval_s:.0f} s)" if eval_s is not None else "")
        more = (f"; {counted(evals_left, 'evaluation')} not timed yet"
                if eval_s is None and evals_left else "")
        if self.budget is not None:
            spare = self.budget.left() - left
            more += (f"; trainer.time={duration(self.budget.budget_s)}: "
                     + (f"{duration(spare)} to spare" if spare >= 0 else
                        f"{duration(-spare)} short, so the budget ends the stage early"))
        log.info("%s: %s; %s and %s left: about %s to the end of the stage%s", self.stage, done,
                 counted(epochs_left, "epoch"), counted(evals_left, "evaluation"), duration(left),
                 more)
        self.said_eval = self.said_eval or eval_s is not None


def counted(n: int, word: str) -> str:
    """``1 epoch``, ``3 epochs``: the time-left line reads as a sentence."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def duration(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m} min {s:02d} s" if m else f"{s} s"
