"""The five main schedules (torch's names), each with warmup (the rule: :mod:`mdk.sched.base`).
``t`` is the main clock; in the default mode it runs from iteration 0 (warmup counts toward it)."""
from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from typing import Any

from torch.optim import Optimizer

from mdk.checks import BadValue, integer, number
from mdk.sched.base import WarmupScheduler


class WarmupStepLR(WarmupScheduler):
    """StepLR with warmup: ``main_lr(t) = base_lr * gamma ** (t // step_size)``."""

    main_keys = ("step_size", "gamma")

    def __init__(
        self,
        optimizer: Optimizer,
        iters_per_epoch: int,
        warmup: Mapping[str, Any] | None = None,
        interval: str = "epoch",
        step_size: int = 5,
        gamma: float = 0.1,
    ) -> None:
        self.step_size = integer("scheduler.step_size", step_size, 1)
        self.gamma = number("scheduler.gamma", gamma, 0.0, low_open=True)
        super().__init__(optimizer, iters_per_epoch, warmup, interval)

    def _main_lr(self, base_lr: float, t: int) -> float:
        return base_lr * self.gamma ** (t // self.step_size)


class WarmupMultiStepLR(WarmupScheduler):
    """MultiStepLR with warmup: ``main_lr(t) = base_lr * gamma ** #{m in milestones : m <= t}``."""

    main_keys = ("milestones", "gamma")

    def __init__(
        self,
        optimizer: Optimizer,
        iters_per_epoch: int,
        warmup: Mapping[str, Any] | None = None,
        interval: str = "epoch",
        milestones: Sequence[int] = (8, 11),
        gamma: float = 0.1,
    ) -> None:
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence):
            raise BadValue.of("scheduler.milestones", milestones, "must be a list of increasing integers")
        ms = [integer(f"scheduler.milestones[{i}]", m, 1) for i, m in enumerate(milestones)]
        if any(b <= a for a, b in zip(ms, ms[1:])):
            raise BadValue.of("scheduler.milestones", ms, "must be strictly increasing")
        self.milestones = ms
        self.gamma = number("scheduler.gamma", gamma, 0.0, low_open=True)
        super().__init__(optimizer, iters_per_epoch, warmup, interval)

    def _main_lr(self, base_lr: float, t: int) -> float:
        return base_lr * self.gamma ** bisect.bisect_right(self.milestones, t)


class _StageLong(WarmupScheduler):
    """A main schedule whose length (``length_key``) may be the whole stage: None takes the
    stage's epochs (its iterations with ``interval: iter``) and follows a re-plan of them."""

    length_key = ""
    min_length = 1

    def _set_length(self, value: int | None, stage_epochs: int | None, iters_per_epoch: int,
                    interval: str) -> None:
        key = self.length_key
        self.follows_stage = value is None  # the whole stage, however long it turns out to be
        if value is None:
            if stage_epochs is None:
                raise BadValue.of(f"scheduler.{key}", value, f"(the whole stage) needs the stage's "
                                  f"length; give {key} in epochs (iterations with interval: iter)")
            value = int(stage_epochs) * (int(iters_per_epoch) if interval == "iter" else 1)
        setattr(self, key, integer(f"scheduler.{key}", value, self.min_length))

    def restage(self, epochs: int) -> None:
        if self.follows_stage:
            length = int(epochs) * (self.iters_per_epoch if self.interval == "iter" else 1)
            setattr(self, self.length_key, max(self.min_length, length))
            self._apply()


class WarmupCosineAnnealingLR(_StageLong):
    """CosineAnnealingLR with warmup; unlike torch's (periodic) one, it stays at ``eta_min`` (an
    absolute lr) after ``T_max``. ``T_max`` None: the whole stage, ``stage_epochs`` (the engine
    passes the stage's length; in iterations with ``interval: iter``)."""

    main_keys = ("T_max", "eta_min")
    length_key = "T_max"

    def __init__(
        self,
        optimizer: Optimizer,
        iters_per_epoch: int,
        warmup: Mapping[str, Any] | None = None,
        interval: str = "epoch",
        T_max: int | None = None,  # noqa: N803 - torch's name, so configs read like the torch docs
        eta_min: float = 0.0,
        stage_epochs: int | None = None,
    ) -> None:
        self.eta_min = number("scheduler.eta_min", eta_min, 0.0)
        self._set_length(T_max, stage_epochs, iters_per_epoch, interval)
        super().__init__(optimizer, iters_per_epoch, warmup, interval)

    def _main_lr(self, base_lr: float, t: int) -> float:
        t = min(t, self.T_max)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t / self.T_max)) / 2


class WarmupCosineAnnealingWarmRestarts(WarmupScheduler):
    """CosineAnnealingWarmRestarts with warmup (SGDR): cycle ``i`` lasts ``T_0 * T_mult**i``;
    inside a cycle ``main_lr = eta_min + (base_lr - eta_min) * (1 + cos(pi * T_cur / T_i)) / 2``."""

    main_keys = ("T_0", "T_mult", "eta_min")

    def __init__(
        self,
        optimizer: Optimizer,
        iters_per_epoch: int,
        warmup: Mapping[str, Any] | None = None,
        interval: str = "epoch",
        T_0: int = 5,  # noqa: N803 - torch's names
        T_mult: int = 2,  # noqa: N803
        eta_min: float = 0.0,
    ) -> None:
        self.T_0 = integer("scheduler.T_0", T_0, 1)
        self.T_mult = integer("scheduler.T_mult", T_mult, 1)
        self.eta_min = number("scheduler.eta_min", eta_min, 0.0)
        super().__init__(optimizer, iters_per_epoch, warmup, interval)

    def cycle(self, t: int) -> tuple[int, int]:
        """``(T_cur, T_i)`` at main-clock time ``t``; integer arithmetic, so no log() rounding."""
        if self.T_mult == 1:  # constant cycles: O(1), t can be millions of iterations
            return t % self.T_0, self.T_0
        t_i = self.T_0
        while t >= t_i:  # cycles grow geometrically: O(log t) passes
            t -= t_i
            t_i *= self.T_mult
        return t, t_i

    def _main_lr(self, base_lr: float, t: int) -> float:
        t_cur, t_i = self.cycle(t)
        return self.eta_min + (base_lr - self.eta_min) * (1 + math.cos(math.pi * t_cur / t_i)) / 2


class WarmupOneCycleLR(_StageLong):
    """OneCycleLR (torch's two-phase form, cosine annealing, no momentum cycling): up from
    ``base_lr / div_factor`` to the base lr (torch's ``max_lr``) over ``pct_start`` of
    ``total_steps``, then down to ``base_lr / (div_factor * final_div_factor)``. ``total_steps``
    None: the whole stage, in the interval's unit, however long the stage turns out to be."""

    main_keys = ("total_steps", "pct_start", "div_factor", "final_div_factor")
    length_key, min_length = "total_steps", 2

    def __init__(
        self,
        optimizer: Optimizer,
        iters_per_epoch: int,
        warmup: Mapping[str, Any] | None = None,
        interval: str = "iter",
        total_steps: int | None = None,
        pct_start: float = 0.3,
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        stage_epochs: int | None = None,
    ) -> None:
        self.pct_start = number("scheduler.pct_start", pct_start, 0.0, 1.0, low_open=True)
        self.div_factor = number("scheduler.div_factor", div_factor, 0.0, low_open=True)
        self.final_div_factor = number("scheduler.final_div_factor", final_div_factor, 0.0,
                                       low_open=True)
        self._set_length(total_steps, stage_epochs, iters_per_epoch, interval)
        super().__init__(optimizer, iters_per_epoch, warmup, interval)

    def _main_lr(self, base_lr: float, t: int) -> float:
        low = base_lr / self.div_factor
        peak_end = self.pct_start * self.total_steps - 1  # torch's phase boundary (a float)
        if t <= peak_end:
            start, end, frac = low, base_lr, t / peak_end if peak_end > 0 else 1.0
        else:  # after total_steps - 1 it stays at the floor
            start, end = base_lr, low / self.final_div_factor
            fall = self.total_steps - 1 - peak_end  # 0 with pct_start 1: no fall, the floor at once
            frac = min(1.0, (t - peak_end) / fall) if fall > 0 else 1.0
        return end + (start - end) * (1 + math.cos(math.pi * frac)) / 2
