"""Where a stage's weights come from and how the model is switched into the stage's mode.

The model's structure changes along the pipeline (BN folded from step2 on, gains fused at step4),
so a checkpoint is loaded into a model first brought to the *checkpoint's* stage structure, then
switched to the stage being run.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig

from mdk.engine.build import stage_dir

log = logging.getLogger(__name__)

ORDER = ("step1", "step2", "cal", "step3", "step4")


class MissingStageInput(FileNotFoundError):
    pass


def find_init(cfg: DictConfig, stage: str) -> Optional[Path]:
    """The checkpoint this stage starts from, or None (random init, allowed for step1 only)."""
    src = cfg.step.init_from
    if src is None:
        return None
    d = stage_dir(cfg, src)
    if src == "step0":  # pretrained weights: best.pth, else the newest *.pth in step0/
        cands = [d / "best.pth"] if (d / "best.pth").is_file() else sorted(
            d.glob("*.pth"), key=lambda p: p.stat().st_mtime, reverse=True)
        if cands:
            return cands[0]
        log.info("no pretrained weights in %s: %s starts from random weights", d, stage)
        return None
    path = d / "best.pth"
    if not path.is_file():
        if cfg.step.init_required:
            raise MissingStageInput(
                f"{stage} starts from {src}'s result but {path} does not exist. Run "
                f"`python run.py step={src}` first (with the same model/dataset/paths), or the "
                f"whole chain with `python run.py pipeline=[{','.join(ORDER[:ORDER.index(stage) + 1])}]`")
        return None
    return path


def prepare_for_checkpoint(model: torch.nn.Module, ckpt_stage: str) -> None:
    """Give the model the structure the checkpoint was saved with (BN folded, fused)."""
    if ckpt_stage in ("step1", "step0"):
        return
    from mdk.quant.stages import prepare_structure

    prepare_structure(model, ckpt_stage)


def apply_stage(model: torch.nn.Module, stage: str, cfg: DictConfig) -> None:
    """Switch quantization on/off for ``stage`` (folding or fusing on the way when needed)."""
    if stage == "step1":
        return
    from mdk.quant.stages import apply_stage as quant_apply

    quant_apply(model, stage, str(cfg.chip))
