"""Build the model from the ``model`` config group (``model.net`` has a ``_target_``)."""
from __future__ import annotations

import fnmatch
import logging
from typing import Any, Optional

import torch
from omegaconf import DictConfig

from mdk.errors import ConfigError
from mdk.targets import build
from mdk.models.heads import YoloV1Head

log = logging.getLogger(__name__)


def build_head(cfg: DictConfig) -> Any:
    """The model's head (``model.net.head``); a saved config without one means GNetDet's YOLOv1
    layout with ``model.net.boxes_per_cell``."""
    node = cfg.model.net.get("head")
    if node is None:
        return YoloV1Head(int(cfg.model.net.num_classes), int(cfg.model.net.boxes_per_cell))
    return build(node, "head")


def head_kind(node: Any) -> Optional[str]:
    """The ``kind`` of the head a config node builds (its conf/head/ option name), or None."""
    try:
        return getattr(build(node, "head"), "kind", None)
    except ConfigError:  # a head of a package this machine lacks: keep the command's
        return None


def build_model(cfg: DictConfig) -> torch.nn.Module:
    """``model.net`` instantiated, with ``trainer.activation_checkpointing`` and ``model.freeze``
    applied."""
    model = build(cfg.model.net, "model.net")  # a bad value: one config line
    if cfg.trainer.get("activation_checkpointing"):
        if not hasattr(model, "activation_checkpointing"):
            raise ValueError(f"trainer.activation_checkpointing=true but {type(model).__name__} "
                             "does not support it; set it to false")
        model.activation_checkpointing = True
        # Deterministic mode: recompute whole batches (a conv on a batch slice may pick another
        # kernel, which changes the last bits of the losses).
        if cfg.trainer.get("deterministic") and hasattr(model, "checkpoint_slices"):
            model.checkpoint_slices = 1
    patterns = list(cfg.model.get("freeze") or [])
    if patterns:
        n = 0
        for name, p in model.named_parameters():
            if any(fnmatch.fnmatch(name, pat) for pat in patterns):
                p.requires_grad_(False)
                n += p.numel()
        if n == 0:
            raise ValueError(f"model.freeze={patterns} matched no parameter; names look like "
                             f"{[k for k, _ in model.named_parameters()][:3]}")
        log.info("froze %d parameters matching %s", n, patterns)
    return model
