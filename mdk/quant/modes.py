"""The switches a stage's record turns on (``quant:`` in conf/step/<stage>.yaml; the stages:
docs/pipeline.md). This module knows the switches, not the stages:

| switch       | effect on every ChipConv                                              |
|--------------|-----------------------------------------------------------------------|
| fold_bn      | BatchNorm folded into the conv (once; the chip has no BN)             |
| weights      | conv weight/bias through the chip weight quantizer (STE)              |
| activations  | ReLU replaced by clamp(0, cap) + 5-bit rounding; caps must be > 0     |
| fuse_gains   | gain fusion once (all caps become 31), recorded in the ``fused`` buffer |

``apply_mode`` runs after the stage's input checkpoint is loaded and before the optimizer / DDP
wrapper is built (folding removes BN parameters). "Fused" is model state, so a resumed step4
checkpoint is never fused twice.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from torch import nn

from mdk.quant.bn_fold import chip_layers, fold_bn
from mdk.quant.fusion import fuse_gains, is_fused
from mdk.quant.chips import chip_bits
from mdk.stage_config import QuantMode

log = logging.getLogger(__name__)


@dataclass
class ModeReport:
    folded_bn: int = 0
    fused_now: bool = False
    fused: bool = False


def apply_mode(model: nn.Module, mode: QuantMode, chip: str = "5801",
               stage: str = "") -> ModeReport:
    """Configure every ChipConv for ``mode`` on ``chip``; ``stage`` names it in messages."""
    layers = chip_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no ChipConv layers to configure")
    fused = is_fused(model)
    if mode.is_float:
        if fused:
            log.warning("%s on a gain-fused model: training it as float with integer-scaled "
                        "weights; start it from step0 or scratch instead", stage or "float mode")
        for layer in layers:
            layer.quant_weight = layer.quant_act = False
        return ModeReport(fused=fused)
    if fused and not mode.fuse_gains:
        raise ValueError(f"step={stage} got a gain-fused (step4) model; start {stage} from the "
                         "previous stage's checkpoint, not from step4")
    bits = []
    for i, layer in enumerate(layers):  # validate every layer before changing anything
        try:
            bits.append(chip_bits(chip, layer.mask_bits))
        except ValueError as e:
            raise ValueError(f"layer {i} (mask_bits={layer.mask_bits}): {e}") from None
    folded = fold_bn(model) if mode.fold_bn else 0
    for layer, wb in zip(layers, bits):
        layer.chip_bits = wb
        layer.quant_weight = mode.weights
        layer.quant_act = mode.activations
    if mode.activations and not fused:
        bad = [i for i, layer in enumerate(layers) if not float(layer.cap) > 0]
        if bad:
            raise ValueError(f"step={stage} needs calibrated activation caps but layers {bad} "
                             "have cap 0; run step=cal first (it starts from the step2 checkpoint)")
    fuse_now = mode.fuse_gains and not fused
    if fuse_now:
        fuse_gains(model)
    return ModeReport(folded, fuse_now, fused or fuse_now)


def drop_bn(model: nn.Module) -> None:
    """Remove BN without folding, to load a BN-folded checkpoint (whose weights replace the
    convs') into a fresh model before the optimizer exists."""
    for layer in chip_layers(model):
        layer.bn = None
