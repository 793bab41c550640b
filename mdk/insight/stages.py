"""Which stages a checkpoint folder holds, in chain order, and their models as the report
measures them. No stage is named here: everything follows from the stage records (mdk/stage.py).
A stage is *present* when ``<paths.checkpoints>/<stage>/best.pth`` exists; the exporting stage's
chip model adds the integer reference's row. The *subject* (whose widths and caps) and the *float
stage* (whose weights) of the per-layer part: docs/pipeline.md, "Finding where accuracy goes".
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch
from omegaconf import DictConfig
from torch import nn

from mdk.engine.export_stage import CHIP_MODEL_DIR
from mdk.errors import ConfigError, MissingStageInput
from mdk.quant.bn_fold import chip_layers, fold_bn
from mdk.checkpoint.meaning import with_checkpoint_model
from mdk.quant.chip_model_net import ChipModelNet
from mdk.stage import chain, stage_conf, stage_names
from mdk.stage_config import StageConf
from mdk.checkpoint.layout import BEST, checkpoint_root
from mdk.checkpoint.weights_file import evaluation_model, read_weights

INTEGER = "integer"  # the waterfall's row of the exported chip model under the integer reference
NOT_A_STAGE = ("the report reads the stages' own best.pth: run the stage again to rebuild it, or "
               "give paths.checkpoints=<a chain's folder>")


@dataclass(frozen=True)
class Present:
    """One row of the waterfall: a stage's best.pth, or (``chip_model``) its exported model."""
    stage: str
    path: Path
    mode: str              # how it is evaluated, in words

    @property
    def is_chip_model(self) -> bool:
        return self.stage == INTEGER


def mode_words(spec: StageConf) -> str:
    q = spec.eval_mode
    if q.fuse_gains:
        return "chip model (fused, integer activations)"
    parts = [w for w, on in (("weights", q.weights), ("5-bit activations", q.activations)) if on]
    return " + ".join(parts) + " quantized" if parts else "float"


def present_stages(cfg: DictConfig, exclude: str) -> list[Present]:
    """The present stages in chain order, then the integer reference; ``exclude``: the report's
    own stage."""
    root = checkpoint_root(cfg)
    names = [s for s in stage_names() if s != exclude and (root / s / BEST).is_file()]
    rows = [Present(s, root / s / BEST, mode_words(stage_conf(s)))
            for s in sorted(names, key=lambda s: (len(chain(s)), s))]
    for s in names:
        if stage_conf(s).export and (root / s / CHIP_MODEL_DIR).is_dir():
            rows.append(Present(INTEGER, root / s / CHIP_MODEL_DIR,
                                f"{s}'s exported chip model, integer reference"))
            break
    if not rows:
        ends = [s for s in stage_names() if s != exclude and stage_conf(s).export]
        whole = max((chain(s) for s in ends or stage_names()), key=len)
        raise MissingStageInput(
            f"paths.checkpoints={root} holds no stage checkpoint (<stage>/{BEST}) to report on; "
            f"train the chain first with the same model/dataset/paths overrides, e.g. `python "
            f"run.py pipeline=[{','.join(whole)}]`, or give paths.checkpoints=<its folder>")
    return rows


@dataclass(frozen=True)
class PerLayer:
    """``weights``' float model at ``subject``'s widths and caps (None: ``missing`` says why)."""
    weights: Optional[Present]
    subject: Optional[Present]

    @property
    def missing(self) -> Optional[str]:
        if self.subject is None:
            return "no stage with calibrated caps (run the calibration stage first)"
        if self.weights is None:
            return ("no float stage checkpoint (step1's best.pth): the per-layer part quantizes "
                    "its weights")
        return None


def per_layer_of(rows: list[Present]) -> PerLayer:
    """The subject and the float stage among ``rows`` (the latest of each)."""
    subject = weights = None
    for r in rows:
        if not r.is_chip_model:
            q = stage_conf(r.stage).eval_mode
            if q.activations and not q.fuse_gains:
                subject = r
            if q.is_float:
                weights = r
    return PerLayer(weights, subject)


def load_row(cfg: DictConfig, row: Present, grid: int) -> nn.Module:
    """The model of a waterfall row in its evaluation mode (eval(), on the CPU)."""
    if row.is_chip_model:
        net = ChipModelNet(row.path, INTEGER)
        size = int(net.cm.meta.get("image_size", cfg.model.image_size))
        _same_geometry(row.path, size, int(net.cm.meta.get("grid", grid)), cfg, grid)
        return net.eval()
    f = read_weights(row.path, advice="run its stage again to rebuild it, or restore it")
    model_cfg = with_checkpoint_model(cfg, f.stage_checkpoint(NOT_A_STAGE), ())
    model, _, _ = evaluation_model(f, model_cfg)
    _same_geometry(row.path, int(model_cfg.model.image_size), int(model.grid), cfg, grid)
    return model


def load_analysed(cfg: DictConfig, part: PerLayer, grid: int) -> nn.Module:
    """The float stage's model, BN folded, at the subject's widths and caps, every layer float."""
    assert part.weights is not None and part.subject is not None, part.missing
    model = load_row(cfg, part.weights, grid)
    fold_bn(model)  # the chip has no BN; folding changes the float model by rounding only
    mine, theirs = chip_layers(model), chip_layers(load_row(cfg, part.subject, grid))
    shapes = [tuple(x.conv.weight.shape) for x in mine]
    if shapes != [tuple(x.conv.weight.shape) for x in theirs]:
        raise ConfigError(
            f"{part.weights.path} and {part.subject.path} are different networks (conv shapes "
            f"{shapes} against {[tuple(x.conv.weight.shape) for x in theirs]}): paths.checkpoints "
            "mixes two chains; give the report one chain's folder")
    with torch.no_grad():
        for a, b in zip(mine, theirs):
            a.cap.copy_(b.cap)
            a.mask_bits, a.chip_bits = b.mask_bits, b.chip_bits
            a.quant_weight = a.quant_act = False
    return model


def _same_geometry(path: Path, size: int, grid: int, cfg: DictConfig, run_grid: int) -> None:
    if size != int(cfg.model.image_size) or grid != run_grid:
        raise ConfigError(
            f"{path} was made for model.image_size={size} (grid {grid}) but this run composes "
            f"model.image_size={cfg.model.image_size} (grid {run_grid}); give the report the "
            "model overrides the chain was trained with")
