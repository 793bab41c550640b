"""``trainer.time``: a training stage sized by a time budget (docs/pipeline.md, "A time budget").

Before the first step the stage times a few optimizer steps at each input size it will train at,
and a forward pass of the evaluation, on a throw-away copy of its model and loss (nothing of the
run's weights, statistics or random streams moves), and chooses the most epochs whose training,
evaluations and checkpoints fit; it logs them, so ``trainer.epochs=N`` repeats the run exactly.
While training, ``TimeBudgetHook`` ends the stage at the budget if the machine turns out slower
(finish the step, evaluate, save), and a resumed stage keeps its epochs and the time it spent.
"""
from __future__ import annotations

import copy
import logging
import math
import statistics
import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Callable, Optional

import torch

from mdk import dist
from mdk.data.augment import resize_image
from mdk.engine.context import StageContext
from mdk.engine.hooks import evaluates
from mdk.engine.time_left import duration
from mdk.engine.loop import HookBase
from mdk.trainer_config import epoch_sizes

log = logging.getLogger(__name__)

PROBE_STEPS = 4        # timed optimizer steps per input size (their median), after WARM_STEPS
WARM_STEPS = 2         # untimed: kernels and buffers are set up in a size's first steps
STEP_MARGIN = 1.08     # a real step also loads, logs and syncs: the probe's steps are bare
EPOCH_OVERHEAD_S = 0.5  # last.pth and the epoch's bookkeeping
EVAL_MARGIN = 1.5      # decoding, matching and AP on top of the forward passes


@dataclass
class Costs:
    """Seconds per optimizer step at each input size, and per evaluation."""

    step_s: dict[int, float]
    eval_s: float

    def epoch_s(self, size: int, iters: int) -> float:
        return iters * self.step_s[size] * STEP_MARGIN + EPOCH_OVERHEAD_S


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def probe_costs(ctx: StageContext, sizes: list[int], amp_dtype: Optional[torch.dtype],
                channels_last: bool) -> Costs:
    """Time this rank's share of a global batch at each of ``sizes`` (forward, backward, an
    AdamW step) and one evaluation batch; the slowest rank's numbers, so every rank agrees."""
    device, ds = ctx.world.device, ctx.train_ds
    model = copy.deepcopy(ctx.model).train()
    loss_fn = copy.deepcopy(ctx.loss_fn)
    if channels_last:
        model.to(memory_format=torch.channels_last)
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=0.0) if params else None
    local = max(1, int(ctx.cfg.trainer.batch_size) // ctx.world.size)
    idx = [i % len(ds) for i in range(local)]
    full = torch.stack([ds.image(i) for i in idx]).to(device)
    gts = [ds.gt(i)[:2] for i in idx]

    def batch(size: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = full if size == ds.image_size else resize_image(full, size)
        f = size / ds.image_size
        t = torch.stack([ds.head.encode(b * f, lab, size // ds.stride, size) for b, lab in gts])
        if channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return x, t.to(device)

    def step(x: torch.Tensor, t: torch.Tensor) -> None:
        with (torch.autocast(device.type, dtype=amp_dtype) if amp_dtype else nullcontext()):
            pred = model(x)
        loss = loss_fn(pred, t)["total"]
        if params:
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

    step_s = {}
    for size in sorted(set(sizes)):
        x, t = batch(size)
        for _ in range(WARM_STEPS):
            step(x, t)
        times = []
        for _ in range(PROBE_STEPS):
            _sync(device)
            t0 = time.perf_counter()
            step(x, t)
            _sync(device)
            times.append(time.perf_counter() - t0)
        step_s[size] = statistics.median(times)
    model.eval()
    x, _ = batch(ds.image_size)
    with torch.no_grad():
        model(x)
        _sync(device)
        t0 = time.perf_counter()
        model(x)
        _sync(device)
    fwd = time.perf_counter() - t0
    val = len(ctx.val_ds)
    limit = ctx.cfg.trainer.get("limit_val_batches")
    batches = math.ceil(val / (local * ctx.world.size))
    eval_s = min(batches, limit or batches) * fwd * EVAL_MARGIN
    keys = sorted(step_s)
    agreed = dist.all_reduce_max(torch.tensor([step_s[k] for k in keys] + [eval_s],
                                              dtype=torch.float64, device=dist.comm_device()))
    vals = agreed.tolist()
    return Costs(dict(zip(keys, vals[:-1])), vals[-1])


def fit_epochs(left_s: float, costs: Costs, iters: int, phases: Optional[list[tuple[int, float]]],
               final_size: int, eval_every: int, done: int = 0,
               most: int = 100_000) -> tuple[int, float]:
    """The most epochs (at least ``done + 1``) whose epochs after the first ``done`` (training,
    evaluations, epoch overheads) take at most ``left_s`` seconds; and the time those take."""
    def total(e: int) -> float:
        sizes = epoch_sizes(phases, e) if phases else [final_size] * e
        evals = sum(evaluates(k, eval_every, e) for k in range(done, e))
        return sum(costs.epoch_s(s, iters) for s in sizes[done:]) + evals * costs.eval_s

    lo, hi = done + 1, done + 1
    while hi < most and total(hi * 2) <= left_s:  # doubling, then bisection: O(log) totals
        hi *= 2
    hi = min(hi * 2, most)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if total(mid) <= left_s else (lo, mid - 1)
    return lo, total(lo)


@dataclass
class Replan:
    """What re-planning after the first epoch needs: the probe's costs, the stage's resolution
    phases and sizes, and how to apply new epochs (scheduler, train split, loader)."""

    costs: Costs
    phases: Optional[list[tuple[int, float]]]
    final_size: int
    eval_every: int
    apply: Callable[[int], bool]  # new epochs -> applied (False: the first epoch would differ)


class TimeBudgetHook(HookBase):
    """Ends training at the budget: after the step that leaves too little time for the last
    evaluation and save, the epoch ends there, is evaluated and saved (``trainer.budget_spent``),
    and the stage returns its best. Under DDP the ranks agree on the step (a MAX all-reduce read
    one step later, no host sync per step). Its state: the planned epochs and the time spent."""

    def __init__(self, budget_s: float, epochs: int, started: float, spent_before: float,
                 eval_estimate_s: float, distributed: bool,
                 replan: Optional[Replan] = None) -> None:
        self.budget_s, self.epochs = float(budget_s), int(epochs)
        self.started, self.spent_before = started, float(spent_before)
        self.eval_estimate_s, self.distributed = float(eval_estimate_s), distributed
        self.replan = replan  # None: a resumed stage keeps the epochs its LR was made for
        self._pending: Optional[Callable[[], float]] = None
        self._steps: list[float] = []  # the first epoch's step ends (its measured step)
        self.done = False  # the budget ended the stage (a later run of it has nothing left)

    def elapsed(self) -> float:
        """Seconds of the budget used: before a resume, and since this stage started."""
        return self.spent_before + time.perf_counter() - self.started

    def left(self) -> float:
        return self.budget_s - self.elapsed()

    def _over(self) -> bool:
        t = self.trainer
        reserve = (getattr(t, "last_eval_s", None) or self.eval_estimate_s) + EPOCH_OVERHEAD_S
        return self.elapsed() + reserve >= self.budget_s

    def after_step(self) -> None:
        t = self.trainer
        if self.replan is not None and t.epoch == 0:
            self._steps.append(time.perf_counter())
        if t.batch_in_epoch >= t.iters_per_epoch or t.epoch + 1 > t.epochs:
            return  # the epoch ends anyway: evaluated if it is due, or the next one decides
        if not self.distributed:
            over = self._over()
        else:  # this step's flag is read after the next step
            over = self._pending is not None and self._pending() > 0
            self._pending = dist.max_flag_started(float(self._over()))
        if over:
            self._pending = None
            t.stop, t.budget_spent, self.done = True, True, True
            log.warning("trainer.time=%s: the budget ends the stage in epoch %d/%d after "
                        "iteration %d; evaluating and saving", duration(self.budget_s),
                        t.epoch + 1, t.epochs, t.batch_in_epoch)

    def before_epoch(self) -> None:
        self._pending = None  # the epoch's end agreed on every rank

    def after_epoch(self) -> None:
        """After the first epoch: plan again with its measured steps and evaluation, when the
        epochs already trained are the same under the new length (so ``trainer.epochs=N`` still
        repeats the run)."""
        t, plan = self.trainer, self.replan
        self.replan = None
        if plan is None or t.epoch != 0 or self.done or len(self._steps) < 3:
            return
        size = (epoch_sizes(plan.phases, t.epochs) if plan.phases else [plan.final_size])[0]
        measured = (self._steps[-1] - self._steps[0]) / (len(self._steps) - 1)
        r = measured / plan.costs.step_s[size]
        eval_s = getattr(t, "last_eval_s", None) or plan.costs.eval_s * r
        costs = Costs({k: v * r for k, v in plan.costs.step_s.items()}, eval_s)
        self.eval_estimate_s = eval_s
        epochs, est = fit_epochs(self.left(), costs, t.iters_per_epoch, plan.phases,
                                 plan.final_size, plan.eval_every, done=1)
        if self.distributed:  # rank 0's plan for every rank
            epochs, est = dist.broadcast_object((epochs, est))
        if epochs == t.epochs or not plan.apply(epochs):
            return
        log.info("trainer.time=%s: the first epoch's steps took %.3f s (%.0f%% of the probe's): "
                 "%d epochs instead of %d (about %s left); the same schedule again: "
                 "trainer.epochs=%d", duration(self.budget_s), measured, 100 * r, epochs,
                 t.epochs, duration(est), epochs)
        self.epochs = t.epochs = epochs

    def state_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "spent_s": self.elapsed(), "budget_s": self.budget_s,
                "done": self.done}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.spent_before = float(state.get("spent_s", 0.0))
        self.done = bool(state.get("done", False))
