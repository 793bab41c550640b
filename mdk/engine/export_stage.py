"""After a stage whose record says ``export: true`` (step4): export its best checkpoint as a chip
model and prove it bit-exact."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from mdk.quant.chips import allow_any_size
from mdk.quant.export import export_chip_model
from mdk.quant.integer_ref import count_mismatches
from mdk.checkpoint.layout import StageCheckpointer
from mdk.checkpoint.weights_file import evaluation_model, read_weights

log = logging.getLogger(__name__)

CHIP_MODEL_DIR = "chip_model"  # under the exporting stage's checkpoint folder


def export_best(cfg: DictConfig, checkpoints: StageCheckpointer, val_ds: Any) -> Path:
    src = checkpoints.best if checkpoints.best.is_file() else checkpoints.last
    model, _, _ = evaluation_model(read_weights(src), cfg)
    out = checkpoints.dir / CHIP_MODEL_DIR
    cm = export_chip_model(model, out, str(cfg.chip), onnx=True,
                           allow_any_size=allow_any_size(cfg))
    n = min(32, len(val_ds))  # val images the integer reference is checked on
    images = torch.stack([val_ds[i][0] for i in range(n)])
    bad = count_mismatches(model, cm, images)
    total = sum(bad)
    if total:
        raise RuntimeError(f"exported chip model in {out} disagrees with the step4 model on "
                           f"{total} activations (per layer {bad}); please report this")
    log.info("chip model %s: integer reference == fake-quant forward on %d val images "
             "(0 mismatching activations)", out, n)
    return out
