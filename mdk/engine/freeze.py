"""``model.freeze_epochs``: the layers of ``model.freeze`` train from that epoch of a training
stage on (a starting point's early layers kept while the new output layer settles; the recipe:
docs/pipeline.md, "Start from weights").

The optimizer holds the frozen parameters from the start (without a gradient it skips them), so a
resume restores one optimizer whatever the epoch. DDP reduces only the parameters that needed a
gradient when it was built, so the training net is built again once they do.
"""
from __future__ import annotations

import fnmatch
import logging
from typing import Callable, Sequence

import torch

from mdk.engine.loop import HookBase

log = logging.getLogger(__name__)


class ReleaseFrozenHook(HookBase):
    """Before epoch ``at`` (0-based: the epochs before it are frozen), the parameters matching
    ``patterns`` get gradients again and ``rewrap()`` gives the loop its new training net."""

    def __init__(self, model: torch.nn.Module, patterns: Sequence[str], at: int,
                 rewrap: Callable[[], torch.nn.Module], is_main: bool = True) -> None:
        self.model, self.patterns, self.at = model, list(patterns), int(at)
        self.rewrap, self.is_main = rewrap, is_main
        self.released = False

    def before_epoch(self) -> None:
        if self.released or self.trainer.epoch < self.at:
            return
        n = 0
        for name, p in self.model.named_parameters():
            if any(fnmatch.fnmatch(name, pat) for pat in self.patterns) and not p.requires_grad:
                p.requires_grad_(True)
                n += p.numel()
        self.trainer.model = self.rewrap()
        self.released = True
        if self.is_main:
            log.info("epoch %d: model.freeze released (%s): %d parameters train from here",
                     self.trainer.epoch + 1, ", ".join(self.patterns), n)
