"""How long a training stage runs and at what input sizes: ``trainer.epochs`` (or the epochs a
``trainer.time`` budget fits) and, for a float stage, ``trainer.image_sizes``' resolution schedule
(docs/pipeline.md, "Fewer pixels, a time budget").
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from itertools import groupby
from typing import Any, Optional

import torch

from mdk.engine.context import StageContext
from mdk.engine.time_left import duration
from mdk.engine.time_budget import Costs, Replan, TimeBudgetHook, fit_epochs, probe_costs
from mdk.trainer_config import epoch_sizes, image_sizes, seconds

log = logging.getLogger(__name__)


@dataclass
class StagePlan:
    """How long this training stage runs: its epochs, their input sizes (None: all at the
    model's), and with ``trainer.time`` the budget's hook and what the probe measured."""

    epochs: int
    sizes: Optional[list[int]] = None
    budget: Optional[TimeBudgetHook] = None
    costs: Optional[Costs] = None
    done: bool = False  # the budget already ended this stage (a resumed run has nothing left)

    def allow_replan(self, ctx: StageContext, scheduler: Any, loader: Any,
                     iters_per_epoch: int) -> None:
        """Let the budget plan again after the first epoch (not on a resume: its LR schedule
        was made for the epochs it has). New epochs apply when the first epoch's learning rates
        and input size are the same under them; the loader's workers restart to see new sizes."""
        if self.budget is None or self.costs is None:
            return
        phases = image_sizes(ctx.cfg) if self.sizes else None

        def apply(epochs: int) -> bool:
            lr_at, restage = getattr(scheduler, "lr_at", None), getattr(scheduler, "restage", None)
            if lr_at is None or restage is None:
                return False
            first = [lr_at(i) for i in range(iters_per_epoch)]
            old = self.epochs
            restage(epochs)
            sizes = epoch_sizes(phases, epochs) if phases else None
            if [lr_at(i) for i in range(iters_per_epoch)] != first or (
                    sizes and self.sizes and sizes[0] != self.sizes[0]):
                restage(old)
                return False
            if sizes is not None and sizes != self.sizes[:len(sizes)]:
                ctx.train_ds.epoch_sizes = sizes
                close = getattr(loader, "close", None)
                if close is not None:  # persistent workers hold the sizes they forked with
                    close()
            self.epochs, self.sizes = epochs, sizes
            return True

        self.budget.replan = Replan(self.costs, phases, ctx.train_ds.image_size,
                                    int(ctx.cfg.trainer.eval_every), apply)

    def epoch_weights(self) -> list[float]:
        """Each epoch's training time relative to the first one's (for the time-left line)."""
        sizes = self.sizes or [0] * self.epochs
        if self.costs is not None and self.sizes:
            return [self.costs.step_s[s] / self.costs.step_s[sizes[0]] for s in sizes]
        return [(s / sizes[0]) ** 2 if sizes[0] else 1.0 for s in sizes]


def plan_stage(ctx: StageContext, iters_per_epoch: int, amp_dtype: Optional[torch.dtype],
               channels_last: bool) -> StagePlan:
    """The stage's epochs (``trainer.epochs``, or what ``trainer.time`` fits: a resumed stage
    keeps the epochs it chose) and its input sizes, said once in the log."""
    cfg, world = ctx.cfg, ctx.world
    budget_s = seconds(cfg.trainer.get("time"))
    phases = image_sizes(cfg) if ctx.spec.quant.is_float else None
    if budget_s is None:
        return StagePlan(int(cfg.trainer.epochs), schedule_sizes(ctx, int(cfg.trainer.epochs)))
    saved = ((ctx.start.resume or {}).get("hooks") or {}).get(TimeBudgetHook.__name__)
    final = ctx.train_ds.image_size
    if saved:  # resumed: the epochs its LR schedule was made for
        epochs, costs = int(saved["epochs"]), None
        left = budget_s - float(saved.get("spent_s", 0.0))
        if world.is_main:
            log.info("trainer.time=%s: %s resumes its %d epochs with %s of the budget left",
                     duration(budget_s), ctx.spec.name, epochs, duration(max(0.0, left)))
    else:
        sizes_needed = sorted({s for s, _ in phases} if phases else {final})
        costs = probe_costs(ctx, sizes_needed, amp_dtype, channels_last)
        left = budget_s - (time.perf_counter() - ctx.started)
        epochs, est = fit_epochs(left, costs, iters_per_epoch, phases, final,
                                 int(cfg.trainer.eval_every))
        if world.is_main:
            per = ", ".join(f"{costs.step_s[s]:.3f} s at {s} px" for s in sizes_needed)
            log.info("trainer.time=%s: %s trains %d epochs (about %s: a step takes %s, an "
                     "evaluation ~%.1f s; %.0f s went to start-up); the same schedule again: "
                     "trainer.epochs=%d", duration(budget_s), ctx.spec.name, epochs,
                     duration(est), per, costs.eval_s, budget_s - left, epochs)
    hook = TimeBudgetHook(budget_s, epochs, ctx.started, 0.0,
                          costs.eval_s if costs else 0.0, world.distributed)
    return StagePlan(epochs, schedule_sizes(ctx, epochs), hook, costs,
                     done=bool(saved and saved.get("done")))


def schedule_sizes(ctx: StageContext, epochs: int) -> list[int] | None:
    """Give the train split its per-epoch input sizes (a float stage with ``trainer.image_sizes``)
    and say them once; a quantized stage trains at the chip's size. None: no schedule."""
    phases = image_sizes(ctx.cfg)
    if phases is None:
        return None
    if not ctx.spec.quant.is_float:
        if ctx.world.is_main:
            log.info("trainer.image_sizes: %s trains quantized, at model.image_size=%d",
                     ctx.spec.name, ctx.train_ds.image_size)
        return None
    sizes = epoch_sizes(phases, epochs)
    ctx.train_ds.epoch_sizes = sizes
    if ctx.world.is_main:
        runs, first = [], 1
        for size, group in groupby(sizes):
            n = len(list(group))
            runs.append(f"epoch {first}" + (f"-{first + n - 1}" if n > 1 else "") + f" at {size} px")
            first += n
        log.info("trainer.image_sizes: %s (evaluation at %d px)", ", ".join(runs),
                 ctx.train_ds.image_size)
    return sizes
