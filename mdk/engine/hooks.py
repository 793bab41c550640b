"""Hooks of the training loop: LR stepping, evaluation, checkpoints, metrics, progress, NaN guard."""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from mdk import dist
from mdk.engine.loop import HookBase, NonFiniteLossError, check_finite
from mdk.sinks import NullSink

log = logging.getLogger(__name__)


class LRSchedulerHook(HookBase):
    """One scheduler step per optimizer step: warmup is counted in iterations (DESIGN §5)."""

    def __init__(self, scheduler: Any) -> None:
        self.scheduler = scheduler

    def after_step(self) -> None:
        self.scheduler.step()


class EvalHook(HookBase):
    """Evaluates every ``every`` epochs and after the last one; result in ``trainer.metrics``."""

    def __init__(self, eval_fn: Callable[[], dict[str, float]], every: int) -> None:
        self.eval_fn, self.every = eval_fn, max(1, every)

    def after_epoch(self) -> None:
        t = self.trainer
        last = t.epoch + 1 == t.epochs
        if (t.epoch + 1) % self.every == 0 or last:
            t0 = time.perf_counter()
            t.metrics = self.eval_fn()
            log.info("epoch %d/%d  val mAP@0.5 %.4f  val loss %.4f  (%.1fs)", t.epoch + 1, t.epochs,
                     t.metrics["map50"], t.metrics.get("loss", float("nan")), time.perf_counter() - t0)
        else:
            t.metrics = {}


class CheckpointHook(HookBase):
    """Writes last.pth every epoch (and every ``every_iters``), best.pth when mAP improves.

    ``state_fn`` builds the full training state (model, optimizer, scheduler, counters, RNG,
    config); it runs on every rank (gathering per-rank RNG states is a collective), and only
    rank 0 writes."""

    def __init__(self, stage_dir: Path, state_fn: Callable[[], dict], save_fn: Callable,
                 every_iters: int = 0, best: float = float("-inf"), best_epoch: int = -1) -> None:
        self.dir, self.state_fn, self.save_fn = Path(stage_dir), state_fn, save_fn
        self.every_iters = every_iters
        self.best, self.best_epoch = best, best_epoch

    def save_last(self) -> None:
        self._save(["last.pth"], epoch_done=False)

    def _save(self, names: list[str], epoch_done: bool) -> None:
        state = self.state_fn()
        if not dist.is_main_process():
            return
        state.update(best_metric=self.best, best_epoch=self.best_epoch, epoch_done=epoch_done)
        for n in names:
            self.save_fn(state, self.dir / n)

    def after_step(self) -> None:
        t = self.trainer
        if self.every_iters and t.iter % self.every_iters == 0 and t.batch_in_epoch < t.iters_per_epoch:
            self._save(["last.pth"], epoch_done=False)

    def after_epoch(self) -> None:
        t = self.trainer
        names = ["last.pth"]
        m = getattr(t, "metrics", {}).get("map50")
        if m is not None and m > self.best:
            self.best, self.best_epoch = m, t.epoch
            # best.pth first: a kill between the two writes leaves the old last.pth, so the
            # epoch is replayed and best.pth rewritten (the other order would lose the new best).
            names.insert(0, "best.pth")
        self._save(names, epoch_done=True)


class NanGuardHook(HookBase):
    """Before the optimizer step: a NaN/Inf loss stops the run naming the iteration and the term,
    so no NaN ever reaches the weights or a checkpoint. With ``skip_limit`` > 0 that many bad
    batches are skipped (no optimizer step) before it stops. One host sync per step; under DDP the
    ranks agree (MAX all-reduce of the flag) so they all skip or all stop together."""

    def __init__(self, skip_limit: int = 0) -> None:
        self.limit, self.skipped = max(0, int(skip_limit)), 0

    def after_backward(self) -> None:
        t = self.trainer
        terms = t.loss_terms
        bad = torch.tensor([0.0 if torch.isfinite(terms["total"].detach()).all() else 1.0])
        if dist.world_size() > 1:
            bad = dist.all_reduce_max(bad.to(t.device)).cpu()
        if not bad.item():
            return
        try:
            check_finite(terms, t.iter + 1)  # raises naming the term when it is this rank's loss
            raise NonFiniteLossError(f"loss is not finite at iteration {t.iter + 1} on another "
                                     "rank. The last good checkpoint is kept; lower optim.lr or "
                                     "check the data")
        except NonFiniteLossError as e:
            if self.skipped >= self.limit:
                if self.limit:
                    raise NonFiniteLossError(f"{e} (trainer.nan_skip_limit={self.limit} bad "
                                             "batches were already skipped)") from None
                raise
            self.skipped += 1
            t.skip_step = True
            log.warning("%s; skipping this batch (%d of trainer.nan_skip_limit=%d)", e,
                        self.skipped, self.limit)


class MetricsHook(HookBase):
    """Logs loss terms and LR every ``every`` iterations (each log is one host sync), mAP per epoch."""

    def __init__(self, sink: NullSink, every: int) -> None:
        self.sink, self.every = sink, max(1, every)
        self.last: dict[str, float] = {}

    def after_step(self) -> None:
        t = self.trainer
        log_now = t.iter % self.every == 0 or t.batch_in_epoch == t.iters_per_epoch
        if log_now:
            # Mean over ranks (each rank's loss is its share of the global batch): the logged
            # loss is then the same for 1 process and W processes. One small collective.
            vals = torch.stack([v.detach().float() for v in t.loss_terms.values()])
            vals = dist.all_reduce_sum(vals) / dist.world_size()
            self.last = {f"loss/{k}": float(v) for k, v in zip(t.loss_terms, vals.tolist())}
            self.last["lr"] = t.optimizer.param_groups[0]["lr"]
            self.sink.log(self.last, t.iter)

    def after_epoch(self) -> None:
        m = getattr(self.trainer, "metrics", {})
        if m:
            self.sink.log({f"val/{k}": v for k, v in m.items() if k != "images"}, self.trainer.iter)


class ProgressHook(HookBase):
    """A tqdm bar per epoch on rank 0, its postfix refreshed at log steps only."""

    def __init__(self, metrics: MetricsHook, enabled: bool) -> None:
        self.metrics = metrics
        self.enabled = enabled and dist.is_main_process()
        self.bar: Optional[Any] = None

    def before_epoch(self) -> None:
        t = self.trainer
        if self.enabled:
            from tqdm import tqdm

            self.bar = tqdm(total=t.iters_per_epoch, initial=t.batch_in_epoch, dynamic_ncols=True,
                            desc=f"epoch {t.epoch + 1}/{t.epochs}", leave=False)

    def after_step(self) -> None:
        if self.bar is not None:
            self.bar.update(1)
            if self.metrics.last and self.trainer.iter % self.metrics.every == 0:
                self.bar.set_postfix(loss=f"{self.metrics.last['loss/total']:.3f}",
                                     lr=f"{self.metrics.last['lr']:.2e}", refresh=False)

    def after_epoch(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        m = self.metrics.last
        if m:
            log.info("epoch %d/%d  loss %.4f  lr %.3g", self.trainer.epoch + 1, self.trainer.epochs,
                     m.get("loss/total", float("nan")), m.get("lr", float("nan")))

    def after_train(self) -> None:
        if self.bar is not None:  # interrupted mid-epoch: leave the terminal clean
            self.bar.close()
            self.bar = None


def sampler_epoch_hook(sampler: Any, dataset: Any) -> HookBase:
    """Before each epoch: tell the sampler/dataset the epoch and where to resume in it."""

    class _SetEpoch(HookBase):
        def before_epoch(self) -> None:
            t = self.trainer
            sampler.set_epoch(t.epoch, t.start_batch)
            dataset.set_epoch(t.epoch)

    return _SetEpoch()
