"""After step4: export the best step4 checkpoint as a chip model and prove it bit-exact."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from mdk.checkpoint import load_checkpoint, load_model_weights
from mdk.engine.build import build_model
from mdk.quant.export import export_chip_model
from mdk.quant.integer_ref import count_mismatches
from mdk.quant.stages import apply_stage, prepare_structure

log = logging.getLogger(__name__)


def load_stage_model(cfg: DictConfig, path: Path) -> torch.nn.Module:
    """A model in the mode of the checkpoint's stage, weights loaded (eval/export tools use it)."""
    ck = load_checkpoint(path)
    stage = ck.get("stage", "step1")
    model = build_model(cfg)
    if stage not in ("step0", "step1"):
        prepare_structure(model, stage)
    load_model_weights(model, ck["model"], path)
    apply_stage(model, "step2" if stage == "cal" else stage, str(cfg.chip))
    return model.eval()


def export_best(cfg: DictConfig, stage_dir: Path, val_ds: Any, check_images: int = 32) -> Path:
    src = stage_dir / "best.pth"
    if not src.is_file():
        src = stage_dir / "last.pth"
    model = load_stage_model(cfg, src)
    out = stage_dir / "chip_model"
    cm = export_chip_model(model, out, str(cfg.chip), onnx=True)
    n = min(check_images, len(val_ds))
    images = torch.stack([val_ds[i][0] for i in range(n)])
    bad = count_mismatches(model, cm, images)
    total = sum(bad)
    if total:
        raise RuntimeError(f"exported chip model in {out} disagrees with the step4 model on "
                           f"{total} activations (per layer {bad}); please report this")
    log.info("chip model %s: integer reference == fake-quant forward on %d val images "
             "(0 mismatching activations)", out, n)
    return out
