"""Warmup + closed-form main schedule: the base class of :mod:`mdk.sched` (the rule and both
warmup modes: docs/schedulers.md).

The scheduler counts optimizer steps ``it`` (``last_epoch``, stepped after each
``optimizer.step()``); the lr is a pure function of it, so a resume needs only ``it``, exactly.
"""
from __future__ import annotations

import inspect
import logging
from collections.abc import Mapping
from typing import Any

import torch
from omegaconf import DictConfig
from torch.optim import Optimizer
from torch.optim.lr_scheduler import LRScheduler

from mdk.checks import BadValue, integer, number, one_of
from mdk.targets import build

log = logging.getLogger(__name__)

__all__ = ["WarmupScheduler"]

_WARMUP_KEYS = ("iters", "start_factor", "method", "mode", "epochs")


class WarmupScheduler(LRScheduler):
    """Warmup and a closed-form main schedule; subclasses give :meth:`_main_lr`. ``warmup`` and
    ``interval``: the ``scheduler.*`` keys of docs/schedulers.md (``warmup=None``: no warmup); each
    param group's lr at construction is its base lr."""

    main_keys: tuple[str, ...] = ()  # a subclass's main-schedule parameters (in the state)

    def __init__(
        self,
        optimizer: Optimizer,
        iters_per_epoch: int,
        warmup: Mapping[str, Any] | None = None,
        interval: str = "epoch",
    ) -> None:
        self.iters_per_epoch = integer("scheduler.iters_per_epoch", iters_per_epoch, 1)
        self.interval = one_of("scheduler.interval", interval, ("epoch", "iter"))
        warmup = {} if warmup is None else warmup
        if not isinstance(warmup, Mapping):
            raise BadValue.of("scheduler.warmup", warmup, "must be a mapping {iters, start_factor, method}")
        unknown = sorted(set(warmup) - set(_WARMUP_KEYS))
        if unknown:
            raise BadValue.of("scheduler.warmup", dict(warmup),
                           f"has unknown keys {unknown} (allowed: {list(_WARMUP_KEYS)})")
        self.warmup_epochs = integer("scheduler.warmup.epochs", warmup.get("epochs", 0), 0)
        iters = integer("scheduler.warmup.iters", warmup.get("iters", 0), 0)
        if self.warmup_epochs and iters:
            raise BadValue.of("scheduler.warmup.epochs", self.warmup_epochs,
                           f"and scheduler.warmup.iters={iters} are both set; give the warmup length "
                           "once (set scheduler.warmup.iters=0 to warm up in epochs)")
        # Warmup length in iterations, whichever unit it was given in.
        self.warmup_iters = self.warmup_epochs * self.iters_per_epoch if self.warmup_epochs else iters
        self.warmup_start_factor = number("scheduler.warmup.start_factor",
                                          warmup.get("start_factor", 1.0), 0.0, 1.0, low_open=True)
        self.warmup_method = one_of("scheduler.warmup.method", warmup.get("method", "linear"),
                                    ("linear", "constant"))
        self.warmup_mode = one_of("scheduler.warmup.mode", warmup.get("mode", "mdk"), ("mdk", "gti"))
        super().__init__(optimizer)

    # --- the closed form -------------------------------------------------------------------
    def warmup_factor(self, it: int) -> float:
        """Multiplier applied on top of the main schedule at iteration ``it``."""
        if it >= self.warmup_iters:
            return 1.0
        if self.warmup_method == "constant":
            return self.warmup_start_factor
        if self.warmup_epochs:  # stepped once per epoch
            alpha = (it // self.iters_per_epoch) / self.warmup_epochs
        else:
            alpha = it / self.warmup_iters
        return self.warmup_start_factor + (1.0 - self.warmup_start_factor) * alpha

    def main_clock(self, it: int) -> int:
        """The main schedule's time at iteration ``it`` (in ``gti`` mode from the end of warmup)."""
        if self.warmup_mode == "gti":
            it = max(0, it - self.warmup_iters)
        return it // self.iters_per_epoch if self.interval == "epoch" else it

    def _main_lr(self, base_lr: float, t: int) -> float:
        raise NotImplementedError

    def lr_at(self, it: int) -> list[float]:
        """Learning rate of every param group used by optimizer step ``it`` (0-based)."""
        if it < 0:
            raise ValueError(f"iteration must be >= 0, got {it}")
        w, t = self.warmup_factor(it), self.main_clock(it)
        if self.warmup_mode == "gti" and it < self.warmup_iters:
            return [w * float(b) for b in self.base_lrs]  # ramps toward the base lr itself
        return [w * self._main_lr(float(b), t) for b in self.base_lrs]

    def get_lr(self) -> list[float]:  # type: ignore[override]
        # Closed form, never torch's chained recurrence: a resumed scheduler is bit-identical.
        return self.lr_at(self.last_epoch)

    _get_closed_form_lr = get_lr

    def restage(self, epochs: int) -> None:
        """The stage now runs ``epochs``: a schedule made for the stage's length follows it
        (``trainer.time`` re-planned it), from the next step on. Others do not depend on it."""

    def _apply(self) -> None:
        """Set every param group's lr for the next step from the closed form."""
        lrs = self.lr_at(self.last_epoch)
        for group, lr in zip(self.optimizer.param_groups, lrs, strict=True):
            group["lr"] = lr
        self._last_lr = list(lrs)

    # --- state -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Plain-python state: the iteration counter plus the schedule it was computed with."""
        return {
            "last_epoch": self.last_epoch,
            "_step_count": self._step_count,
            "base_lrs": [float(b) for b in self.base_lrs],
            "_last_lr": [float(v) for v in self._last_lr],
            "schedule": self._schedule_params(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the iteration counter and re-apply the closed-form lr to the optimizer. This
        config's schedule and base lrs win (docs/pipeline.md, changed hyper-parameters on resume):
        a mismatch is only logged at info here, as mdk/checkpoint/meaning.py warns once."""
        saved = state_dict.get("schedule")
        if saved is not None and saved != self._schedule_params():
            log.info(
                "scheduler config differs from the checkpoint's (%s vs %s); using the current one",
                self._schedule_params(), saved,
            )
        saved_lrs = [float(b) for b in state_dict["base_lrs"]]
        if saved_lrs != [float(b) for b in self.base_lrs]:
            log.info("base lr %s differs from the checkpoint's %s; using the current one",
                        self.base_lrs, saved_lrs)
        self.last_epoch = int(state_dict["last_epoch"])
        self._step_count = int(state_dict.get("_step_count", self.last_epoch + 1))
        # So resume does not depend on whether the optimizer state is loaded before or after this.
        self._apply()

    def _schedule_params(self) -> dict[str, Any]:
        warmup: dict[str, Any] = {
            "iters": self.warmup_iters,
            "start_factor": self.warmup_start_factor,
            "method": self.warmup_method,
        }
        # Only when not the defaults: older checkpoints, without these keys, still compare equal.
        if self.warmup_mode != "mdk":
            warmup["mode"] = self.warmup_mode
        if self.warmup_epochs:
            warmup["epochs"] = self.warmup_epochs
        return {
            "class": type(self).__name__,
            "iters_per_epoch": self.iters_per_epoch,
            "interval": self.interval,
            "warmup": warmup,
            **self._main_params(),
        }

    def _main_params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.main_keys}


def stage_length(node: Any, epochs: int) -> dict[str, int]:
    """``{"stage_epochs": epochs}`` for a scheduler class that takes the stage's length (an mdk
    cosine with ``T_max: null``), else nothing: a scheduler of your own keeps its signature."""
    target = node.get("_target_") if isinstance(node, Mapping) else None
    try:
        cls = build(target, "scheduler", check=True) if target else None
        takes = cls is not None and "stage_epochs" in inspect.signature(cls).parameters
    except Exception:  # the scheduler's own build names what is wrong
        takes = False
    return {"stage_epochs": int(epochs)} if takes else {}


def check_config(node: DictConfig, epochs: int = 1) -> None:
    """The ``scheduler`` node, checked by building it on a throw-away optimizer (the classes'
    own checks name the key): a config error before any work, not a traceback in every rank."""
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    build(node, "scheduler", optimizer=opt, iters_per_epoch=1, **stage_length(node, epochs))
