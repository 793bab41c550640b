"""What each pipeline stage switches on in the chip layers (DESIGN §1 table, §3).

``apply_stage(model, stage, chip)`` is called by the engine **after** the stage's input checkpoint
is loaded and **before** the optimizer / DDP wrapper is built (it may remove BN parameters):

| stage | BN      | quant_weight | quant_act | other                                   |
|-------|---------|--------------|-----------|-----------------------------------------|
| step1 | kept    | off          | off       |                                         |
| step2 | folded  | on           | off       |                                         |
| cal   | folded  | on           | off       | engine attaches observers (calibrate)   |
| step3 | folded  | on           | on        | caps must be calibrated (> 0)           |
| step4 | folded  | on           | on        | gain fusion once; caps are all 31       |

"Already fused" is recorded in the model itself: every ChipConv has a ``fused`` buffer (saved in
the state_dict), so a resumed step4 checkpoint is recognised and never fused twice.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

from torch import nn

from mdk.quant.bn_fold import chip_layers, fold_bn
from mdk.quant.fusion import fuse_gains, is_fused
from mdk.quant.weights import chip_bits

log = logging.getLogger(__name__)

STAGES = ("step1", "step2", "cal", "step3", "step4")


@dataclass
class StageReport:
    """What apply_stage changed, for logs and the engine (e.g. rebuild the optimizer if folded)."""
    stage: str
    folded_bn: int = 0
    fused_now: bool = False
    fused: bool = False


def apply_stage(model: nn.Module, stage: str, chip: str = "5801") -> StageReport:
    """Configure every ChipConv of ``model`` for ``stage`` on ``chip`` (see module table)."""
    if stage not in STAGES:
        raise ValueError(f"step={stage!r} is unknown; use one of {STAGES}")
    layers = chip_layers(model)
    if not layers:
        raise ValueError(f"{type(model).__name__} has no ChipConv layers to configure")
    report = StageReport(stage)
    fused = is_fused(model)
    if stage == "step1":
        if fused:
            log.warning("step1 on a gain-fused model: training it as float with integer-scaled "
                        "weights; start step1 from step0 or scratch instead")
        for layer in layers:
            layer.quant_weight = layer.quant_act = False
        report.fused = fused
        return report
    if fused and stage != "step4":
        raise ValueError(f"step={stage} got a gain-fused (step4) model; start {stage} from the "
                         "previous stage's checkpoint, not from step4")
    bits = []
    for i, layer in enumerate(layers):  # validate every layer before changing anything
        try:
            bits.append(chip_bits(chip, layer.mask_bits))
        except ValueError as e:
            raise ValueError(f"layer {i} (mask_bits={layer.mask_bits}): {e}") from None
    report.folded_bn = fold_bn(model)
    for layer, wb in zip(layers, bits):
        layer.chip_bits = wb
        layer.quant_weight = True
        layer.quant_act = stage in ("step3", "step4")
    if stage in ("step3", "step4") and not fused:
        bad = [i for i, layer in enumerate(layers) if not float(layer.cap) > 0]
        if bad:
            raise ValueError(f"step={stage} needs calibrated activation caps but layers {bad} have "
                             "cap 0; run step=cal first (it starts from the step2 checkpoint)")
    if stage == "step4" and not fused:
        fuse_gains(model)
        report.fused_now = True
    report.fused = is_fused(model)
    return report



def prepare_structure(model: nn.Module, ckpt_stage: str) -> None:
    """Give a freshly built model the structure of a ``ckpt_stage`` checkpoint before loading it.

    From step2 on checkpoints hold BN-folded weights, so BN is removed here *without* folding
    (the loaded weights replace the conv parameters). The step4 ``fused`` flag and the caps are
    buffers restored by ``load_state_dict``. ChipConv also drops BN by itself when a checkpoint
    lacks ``bn.*`` keys, so this is belt and braces, but explicit and before the optimizer exists.
    """
    if ckpt_stage in ("step0", "step1"):
        return
    if ckpt_stage not in STAGES:
        raise ValueError(f"checkpoint stage {ckpt_stage!r} is unknown; expected one of {STAGES}")
    for layer in chip_layers(model):
        layer.bn = None
