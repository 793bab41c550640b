"""Exponential moving average (EMA) of a model's weights, and the hook that keeps it.

After optimizer step ``n`` (counting the EMA's own updates, 1, 2, ...)::

    d_n = decay * (1 - exp(-n / tau))          (tau = 0: d_n = decay)
    ema <- ema + (1 - d_n) * (w - ema)          (torch.lerp; = d_n * ema + (1 - d_n) * w)

The warm-up ``1 - exp(-n / tau)`` (the YOLOv5 form) makes early updates follow the weights
closely, so an EMA started from random weights is useful within a few ``tau`` steps instead of
``1 / (1 - decay)``. ``lerp`` leaves an entry that does not change bit-identical (its difference
is 0), so frozen weights and constant buffers (activation caps, ``out_scale``) stay exact.

What is averaged: every floating-point entry of the model's ``state_dict`` (parameters and
buffers such as BatchNorm running statistics), kept in ``dtype`` (float32 or float64) on the
model's device. Integer/bool entries (``num_batches_tracked``, ``fused``) are copied, not
averaged. Quantized stages (step2, step3) train float weights that the forward pass quantizes;
the EMA averages those float weights, and an EMA model is quantized the same way when evaluated
or exported.

DDP: after each optimizer step every rank holds identical parameters, so each rank updates its
own EMA with no collective and the EMAs agree. Buffers are the exception: with DDP's default
``broadcast_buffers`` the model's BatchNorm running statistics are rank 0's at each forward but
then updated locally, so the EMA buffers drift apart per rank. ``EMAHook`` therefore broadcasts
the EMA *buffers* (not parameters) from rank 0 after each epoch, before evaluation (register it
before the evaluation hook); rank 0's EMA, the one saved, is never changed by it, so a resumed
run continues bit-identically. With fp16 AMP, a step the GradScaler skips (inf gradients) still
counts as an EMA update (the weights did not move, so it only decays towards them once more);
steps the NaN guard skips (``trainer.skip_step``) are not counted.

Stages:
- The EMA is per stage: it starts from the weights the stage starts from, after the stage's
  structure change (BN folding from step2 on, gain fusion at step4), and is saved in the stage's
  checkpoints; it never crosses from one stage to the next (the next stage starts from the
  weights its ``init_from`` checkpoint holds).
- ``cal`` does not train: no optimizer step, so no EMA. It calibrates the weights it is given
  (step2's best.pth: the EMA weights if step2 chose and saved its best by the EMA).
- ``step4`` fusion rescales weights and caps: an EMA of pre-fusion weights is in another
  parametrisation, so step4's EMA starts fresh from the fused weights (it is built after
  ``apply_stage``); carrying step3's EMA over would need the same fusion applied to it.
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
        self.shadow: dict[str, torch.Tensor] = {}
        self.model_dtypes: dict[str, torch.dtype] = {}
        with torch.no_grad():
            for k, v in m.state_dict().items():
                self.model_dtypes[k] = v.dtype
                self.shadow[k] = v.detach().to(dtype).clone() if v.is_floating_point() \
                    else v.detach().clone()

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
        """Within the block ``model`` holds the EMA weights (cast to its dtypes); on exit its own
        weights are put back bit for bit (a copy is kept meanwhile). Yields the unwrapped
        module. The optimizer still refers to the same parameter objects throughout."""
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
        """The EMA weights as a ``model.state_dict()`` (the model's dtypes, CPU copies): what to
        save as the EMA model (e.g. best.pth's weights when the EMA is what was evaluated)."""
        return {k: v.detach().to(self.model_dtypes[k]).cpu().clone()
                for k, v in self.shadow.items()}

    def state_dict(self) -> dict[str, Any]:
        """Everything a resumed run needs to continue bit-identically."""
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
    def sync_buffers(self, src: int = 0) -> None:
        """Broadcast the EMA buffers (BN statistics) from rank ``src`` (a collective)."""
        for k in sorted(self.buffer_names & self.shadow.keys()):  # same order on every rank
            if self.shadow[k].is_floating_point():  # integer counters agree already
                tdist.broadcast(self.shadow[k], src)


def ema_from_config(node: Any, model: nn.Module) -> Optional[ModelEMA]:
    """``trainer.ema`` (``{enabled, decay, tau, dtype}``) -> a ModelEMA of ``model`` built now
    (after the stage's structure change and ``model.to(device)``), or None when the node is
    absent or ``enabled`` is false."""
    if node is None or not node.get("enabled", False):
        return None
    decay, tau = float(node.get("decay", 0.9999)), float(node.get("tau", 2000.0))
    name = str(node.get("dtype", "float32"))
    check_ema(decay, tau, name)
    return ModelEMA(model, decay=decay, tau=tau, dtype=getattr(torch, name))


class EMAHook(HookBase):
    """Updates ``ema`` after every optimizer step that happened (not when ``trainer.skip_step``);
    after each epoch of a ``distributed`` World it makes the EMA buffers rank 0's (see the module
    docstring). Register it before the evaluation hook so an evaluation at the epoch end sees the
    synced EMA."""

    def __init__(self, ema: ModelEMA, distributed: bool = False) -> None:
        self.ema, self.sync = ema, distributed

    def after_step(self) -> None:
        if not self.trainer.skip_step:
            self.ema.update(self.trainer.model)

    def after_epoch(self) -> None:
        if self.sync:
            self.ema.sync_buffers()
