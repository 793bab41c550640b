"""Exponential moving average (EMA) of a model's weights, and the hook that keeps it.

After optimizer step ``n`` (counting the EMA's own updates, 1, 2, ...)::

    d_n = decay * (1 - exp(-n / tau))          (tau = 0: d_n = decay)
    ema <- ema + (1 - d_n) * (w - ema)          (torch.lerp; = d_n * ema + (1 - d_n) * w)

The warm-up ``1 - exp(-n / tau)`` (the YOLOv5 form) makes an EMA started from random weights
useful within a few ``tau`` steps. ``lerp`` leaves an unchanged entry bit-identical, so frozen
weights and constant buffers (activation caps, ``out_scale``) stay exact.

Every floating-point entry of the ``state_dict`` (parameters and buffers) is averaged in
``dtype``; integer/bool entries are copied. Quantized stages average the float weights, which
are quantized the same way when the EMA is evaluated or exported.

DDP: every rank holds the same parameters after a step, so each updates its own EMA without a
collective. BatchNorm buffers, though, are updated locally and drift apart per rank, so
``EMAHook`` broadcasts the EMA buffers from rank 0 after each epoch, before evaluation (rank 0's
EMA, the one saved, is unchanged: resume stays bit-identical). A step the fp16 GradScaler skips
still counts as an update; steps the NaN guard skips (``trainer.skip_step``) do not.

The EMA is per stage: built after the stage's structure change, saved in its checkpoints, never
carried to the next stage. step4's starts fresh from the fused weights (an EMA of pre-fusion
weights is in another parametrisation); cal has no optimizer step, so no EMA.
"""
from __future__ import annotations

import logging
import math
from contextlib import contextmanager
from typing import Any, Iterator, Optional

import torch
import torch.distributed as tdist
from torch import nn

from mdk.engine.loop import HookBase
from mdk.trainer_config import check_ema

log = logging.getLogger(__name__)


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside DistributedDataParallel / DataParallel."""
    if isinstance(model, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
        return model.module
    return model


class ModelEMA:
    """EMA copies of ``model``'s state (see the module docstring for the rule)."""

    def __init__(self, model: nn.Module, decay: float = 0.9999, tau: float = 2000.0,
                 dtype: torch.dtype = torch.float32) -> None:
        check_ema(decay, tau, str(dtype).removeprefix("torch."))
        self.decay, self.tau, self.dtype = float(decay), float(tau), dtype
        self.updates = 0
        m = unwrap(model)
        self.buffer_names = {n for n, _ in m.named_buffers()}
        sd = m.state_dict()
        self.model_dtypes = {k: v.dtype for k, v in sd.items()}
        self.shadow = {k: (v.detach().to(dtype) if v.is_floating_point() else v.detach()).clone()
                       for k, v in sd.items()}

    def decay_at(self, n: int) -> float:
        """The decay of update number ``n`` (1-based)."""
        if self.tau == 0:
            return self.decay
        return self.decay * (1.0 - math.exp(-n / self.tau))

    def _model_state(self, model: nn.Module) -> dict[str, torch.Tensor]:
        sd = unwrap(model).state_dict()
        if sd.keys() != self.shadow.keys():
            missing, extra = self.shadow.keys() - sd.keys(), sd.keys() - self.shadow.keys()
            raise RuntimeError(f"the model's state no longer matches its EMA (missing "
                               f"{sorted(missing)[:5]}, new {sorted(extra)[:5]}): the EMA must be "
                               "built after the stage changes the model's structure")
        return sd

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """One EMA step towards ``model``'s current weights (DDP-wrapped or not). No host sync."""
        self.updates += 1
        weight = 1.0 - self.decay_at(self.updates)
        sd = self._model_state(model)
        ema, cur = [], []
        for k, v in sd.items():
            if v.is_floating_point():
                ema.append(self.shadow[k])
                cur.append(v.to(self.dtype))
            else:
                self.shadow[k].copy_(v)
        if ema:
            torch._foreach_lerp_(ema, cur, weight)

    @contextmanager
    def swapped(self, model: nn.Module) -> Iterator[nn.Module]:
        """Within the block ``model`` holds the EMA weights; on exit its own are put back bit for
        bit. Yields the unwrapped module; the parameter objects (the optimizer's) stay the same."""
        sd = self._model_state(model)
        with torch.no_grad():
            raw = {k: v.detach().clone() for k, v in sd.items()}
            for k, v in sd.items():
                v.copy_(self.shadow[k])
        try:
            yield unwrap(model)
        finally:
            with torch.no_grad():
                for k, v in sd.items():
                    v.copy_(raw[k])

    def model_state_dict(self) -> dict[str, torch.Tensor]:
        """The EMA weights as a ``model.state_dict()`` (the model's dtypes, CPU copies)."""
        return {k: v.detach().to(self.model_dtypes[k]).cpu().clone()
                for k, v in self.shadow.items()}

    def state_dict(self) -> dict[str, Any]:
        return {"decay": self.decay, "tau": self.tau, "updates": self.updates,
                "dtype": str(self.dtype).replace("torch.", ""),
                "shadow": {k: v.detach().clone() for k, v in self.shadow.items()}}

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, Any]) -> None:
        shadow = state["shadow"]
        if shadow.keys() != self.shadow.keys():
            raise RuntimeError("the checkpoint's EMA does not match this model (different "
                               "entries); resume it with the model structure it was saved from")
        saved_dtype = state.get("dtype")
        if saved_dtype != str(self.dtype).replace("torch.", ""):
            log.warning("EMA saved in %s is continued in %s: the resume is not bit-identical",
                        saved_dtype, self.dtype)
        if (state.get("decay"), state.get("tau")) != (self.decay, self.tau):
            log.warning("EMA decay/tau changed on resume: %s/%s -> %s/%s", state.get("decay"),
                        state.get("tau"), self.decay, self.tau)
        for k, v in shadow.items():
            self.shadow[k].copy_(v)
        self.updates = int(state["updates"])

    @torch.no_grad()
    def sync_buffers(self) -> None:
        """Broadcast the EMA buffers (BN statistics) from rank 0 (a collective)."""
        for k in sorted(self.buffer_names & self.shadow.keys()):  # same order on every rank
            if self.shadow[k].is_floating_point():  # integer counters agree already
                tdist.broadcast(self.shadow[k], 0)


def ema_from_config(node: Any, model: nn.Module) -> Optional[ModelEMA]:
    """``trainer.ema`` -> a ModelEMA of ``model`` (call after the stage's structure change and
    ``model.to(device)``), or None when it is absent or not enabled."""
    if node is None or not node.get("enabled", False):
        return None
    decay, tau = float(node.get("decay", 0.9999)), float(node.get("tau", 2000.0))
    name = str(node.get("dtype", "float32"))
    check_ema(decay, tau, name)
    return ModelEMA(model, decay=decay, tau=tau, dtype=getattr(torch, name))


class EMAHook(HookBase):
    """Updates ``ema`` after every optimizer step taken; after each epoch of a ``distributed``
    World it makes the EMA buffers rank 0's. Register it before the evaluation hook."""

    def __init__(self, ema: ModelEMA, distributed: bool = False) -> None:
        self.ema, self.sync = ema, distributed

    def after_step(self) -> None:
        if not self.trainer.skip_step:
            self.ema.update(self.trainer.model)

    def after_epoch(self) -> None:
        if self.sync:
            self.ema.sync_buffers()
