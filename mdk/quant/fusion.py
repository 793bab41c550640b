"""Step4 gain fusion ("edit gain"): move every activation cap into the weights (the formula:
docs/pipeline.md, the chip quantization contract).

Each layer's output grows ``31 / c_i`` times, so with cap 31 it emits its level ``k_i`` itself:
``R(clamp(y', 0, 31)) = R(clamp(y, 0, c_i) * 31 / c_i)``. Max-pooling commutes with a positive
scale, so pooled layers need nothing special.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from mdk.quant.activation import LEVELS
from mdk.quant.bn_fold import chip_layers

log = logging.getLogger(__name__)


def is_fused(model: nn.Module) -> bool:
    flags = {bool(layer.fused) for layer in chip_layers(model)}
    if len(flags) > 1:
        raise ValueError("model is half fused (some ChipConv.fused buffers are True, some False); "
                         "the checkpoint is inconsistent - rerun step4 from the step3 checkpoint")
    return flags == {True}


@torch.no_grad()
def fuse_gains(model: nn.Module) -> list[float]:
    """Apply gain fusion in place; returns the caps that were fused. Errors if already fused."""
    layers = chip_layers(model)
    if is_fused(model):
        raise ValueError("model is already gain-fused (step4); fusing twice would scale it again")
    caps = [float(layer.cap) for layer in layers]
    for i, (layer, c) in enumerate(zip(layers, caps)):
        if layer.bn is not None:
            raise ValueError(f"layer {i} still has BatchNorm; fold it (mdk.quant.bn_fold) first")
        if not c > 0:
            raise ValueError(f"layer {i} has cap {c}: the model is not calibrated; run step=cal "
                             "before step4")
    prev = float(LEVELS)
    for layer, c in zip(layers, caps):
        layer.conv.weight.mul_(prev / c)
        layer.conv.bias.mul_(LEVELS / c)
        layer.cap.fill_(float(LEVELS))
        layer.fused.fill_(True)
        prev = c
    core = model if hasattr(model, "out_scale") else getattr(model, "module", model)
    if not hasattr(core, "out_scale"):
        raise ValueError(f"{type(model).__name__} has no out_scale buffer to carry c_last/31")
    core.out_scale.fill_(caps[-1] / LEVELS)
    log.info("gain fusion applied to %d layers; out_scale=%.6g", len(layers), caps[-1] / LEVELS)
    return caps
