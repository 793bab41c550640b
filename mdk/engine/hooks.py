"""Hooks of the training loop: LR stepping, evaluation, checkpoints, metrics, progress, NaN guard."""
from __future__ import annotations

import logging
import time
from typing import Any, Callable, Optional

import torch

from mdk import dist, faults
from mdk.engine.device_io import DeferredRead
from mdk.engine.loop import HookBase
from mdk.progress import bars_on, progress_bar
from mdk.checkpoint.layout import BEST, LAST
from mdk.sinks.base import NullSink

log = logging.getLogger(__name__)


class LRSchedulerHook(HookBase):
    """One scheduler step per optimizer step: warmup is counted in iterations (docs/schedulers.md)."""

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
        # trainer.time's budget ended the epoch early: its weights are the stage's last
        if evaluates(t.epoch, self.every, t.epochs) or getattr(t, "budget_spent", False):
            t0 = time.perf_counter()
            t.metrics = self.eval_fn()
            t.last_eval_s = time.perf_counter() - t0
            log.info("epoch %d/%d  val mAP@0.5 %.4f  val loss %.4f  (%s, %.1fs)", t.epoch + 1,
                     t.epochs, t.metrics["map50"], t.metrics.get("loss", float("nan")),
                     t.metrics.get("metric", "mAP@0.5"), time.perf_counter() - t0)
        else:
            t.metrics = {}


def evaluates(epoch: int, every: int, epochs: int) -> bool:
    """Whether epoch ``epoch`` (0-based) ends with an evaluation (every ``every``, and the last)."""
    return (epoch + 1) % max(1, every) == 0 or epoch + 1 == epochs


class CheckpointHook(HookBase):
    """Writes last.pth every epoch (and every ``every_iters``), best.pth when mAP improves.

    ``state_fn`` builds the checkpoint on every rank (the RNG gather is a collective); only rank 0
    writes it, through ``save_fn(state, name)``."""

    def __init__(self, state_fn: Callable[[bool], dict], save_fn: Callable[..., None],
                 is_main: bool, every_iters: int = 0,
                 before_save: Optional[Callable[[], None]] = None) -> None:
        self.state_fn, self.save_fn, self.is_main = state_fn, save_fn, is_main
        self.every_iters = every_iters
        self.best, self.best_epoch = float("-inf"), -1
        self.before_save = before_save  # the NaN guard's check: never save after a bad step
        self.best_metrics: dict[str, Any] = {}  # the evaluation that chose best.pth

    def state_dict(self) -> dict[str, Any]:
        return {"best_metric": self.best, "best_epoch": self.best_epoch,
                "best_metrics": self.best_metrics}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.best, self.best_epoch = state["best_metric"], state["best_epoch"]
        self.best_metrics = state.get("best_metrics") or {}

    def save_last(self, *names: str, epoch_done: bool = False) -> None:
        """Write last.pth (with ``names``: those files before it)."""
        if self.before_save is not None:
            self.before_save()
        state = self.state_fn(epoch_done)
        if self.is_main:
            self.save_fn(state, *names, LAST)

    def after_step(self) -> None:
        t = self.trainer
        if self.every_iters and t.iter % self.every_iters == 0 and t.batch_in_epoch < t.iters_per_epoch:
            self.save_last()

    def after_epoch(self) -> None:
        t = self.trainer
        m = getattr(t, "metrics", {}).get("map50")
        best = m is not None and m > self.best
        if best:
            self.best, self.best_epoch = m, t.epoch
            self.best_metrics = dict(t.metrics)
        # best.pth first: a kill between the two writes leaves the old last.pth, so the epoch is
        # replayed and best.pth rewritten (the other order would lose the new best).
        self.save_last(*([BEST] if best else []), epoch_done=True)


class FaultHook(HookBase):
    """Fault injection for the tests (``MDK_FAULT``, mdk/faults.py); registered only when set."""

    def after_backward(self) -> None:
        faults.poison_loss(self.trainer)

    def after_step(self) -> None:
        faults.at("iter", self.trainer.iter)


class MetricsHook(HookBase):
    """Loss terms averaged since the last log, and the LR, every ``every`` iterations and at each
    epoch's end; mAP per epoch. Summed on the device and read once per log (no host sync per
    step); under DDP all-reduced, so 1 and W processes log the same loss."""

    def __init__(self, sink: NullSink, every: int, step_offset: int = 0,
                 world_size: int = 1) -> None:
        self.sink, self.every, self.world_size = sink, max(1, every), world_size
        self.offset = step_offset  # earlier stages' steps: one global step across a pipeline
        self.last: dict[str, float] = {}
        self._sum: Optional[torch.Tensor] = None
        self._n = 0
        self._read = DeferredRead()  # on CUDA a log is read one interval later: no wait

    def _flush(self) -> None:
        got = self._read.pop()
        if got is not None:
            values, (keys, lr, step) = got
            self.last = {f"loss/{k}": float(v) for k, v in zip(keys, values.tolist())}
            self.last["lr"] = lr
            self.sink.log(self.last, step)

    def after_step(self) -> None:
        t = self.trainer
        vals = torch.stack([v.detach().float().reshape(()) for v in t.loss_terms.values()])
        self._sum = vals if self._sum is None else self._sum + vals
        self._n += 1
        epoch_end = t.batch_in_epoch == t.iters_per_epoch
        if t.iter % self.every == 0 or epoch_end:
            mean = dist.all_reduce_sum(self._sum) / (self._n * self.world_size)
            self._flush()
            self._read.push(mean, (list(t.loss_terms), t.optimizer.param_groups[0]["lr"],
                                   self.offset + t.iter))
            self._sum, self._n = None, 0
            if epoch_end:  # the epoch's numbers now: one wait per epoch
                self._flush()

    def after_epoch(self) -> None:
        m = getattr(self.trainer, "metrics", {})
        if m:
            self.sink.log({f"val/{k}": float(v) for k, v in m.items()
                           if k != "images" and isinstance(v, (int, float))},
                          self.offset + self.trainer.iter)


class ProgressHook(HookBase):
    """A tqdm bar per epoch on rank 0 when ``trainer.progress`` (``setting``) draws bars; with
    ``auto`` and no terminal (SLURM logs, pipes), a log line every ``LINE_EVERY_S`` seconds."""

    LINE_EVERY_S = 60.0

    def __init__(self, metrics: MetricsHook, setting: Any, is_main: bool,
                 images_per_step: int = 0) -> None:
        self.metrics, self.setting, self.is_main = metrics, setting, is_main
        self.lines = is_main and setting == "auto" and not bars_on(setting, is_main)
        self._next_line = 0.0
        self.bar: Optional[Any] = None
        self.images_per_step = images_per_step  # the global batch, for the img/s figure
        self._t0: Optional[float] = None
        self._b0, self._w0 = 0, 0.0

    def before_epoch(self) -> None:
        t = self.trainer
        self._t0, self._b0 = None, t.batch_in_epoch
        self.bar = progress_bar(setting=self.setting, is_main=self.is_main,
                                total=t.iters_per_epoch, initial=t.batch_in_epoch,
                                desc=f"epoch {t.epoch + 1}/{t.epochs}")

    def after_step(self) -> None:
        if self._t0 is None:  # from the end of the epoch's first step: loader start-up apart
            self._t0, self._b0 = time.perf_counter(), self.trainer.batch_in_epoch
            self._w0 = self.trainer.data_wait_s
        if self.lines and time.monotonic() >= self._next_line:
            t, m = self.trainer, self.metrics.last
            if self._next_line:  # not at the very first step
                log.info("epoch %d/%d  iteration %d/%d  loss %s", t.epoch + 1, t.epochs,
                         t.batch_in_epoch, t.iters_per_epoch,
                         f"{m['loss/total']:.4f}" if "loss/total" in m else "-")
            self._next_line = time.monotonic() + self.LINE_EVERY_S
        if self.bar is not None:
            self.bar.update(1)
            if self.metrics.last and self.trainer.iter % self.metrics.every == 0:
                self.bar.set_postfix(loss=f"{self.metrics.last['loss/total']:.3f}",
                                     lr=f"{self.metrics.last['lr']:.2e}", refresh=False)

    def after_epoch(self) -> None:
        self.after_train()  # closes the epoch's bar
        m, t = self.metrics.last, self.trainer
        # The epoch's last log step read values back from the device, so the clock is honest.
        steps = t.batch_in_epoch - self._b0
        rate = ""
        if self._t0 is not None and steps > 0:
            took = time.perf_counter() - self._t0
            rate = (f"  ({steps * self.images_per_step / took:.1f} train img/s, data wait "
                    f"{100 * min(1.0, (t.data_wait_s - self._w0) / max(took, 1e-9)):.1f}%)")
        if m:
            log.info("epoch %d/%d  loss %.4f  lr %.3g%s", t.epoch + 1, t.epochs,
                     m.get("loss/total", float("nan")), m.get("lr", float("nan")), rate)

    def after_train(self) -> None:
        if self.bar is not None:  # also when interrupted mid-epoch: leave the terminal clean
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
