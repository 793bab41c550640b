"""Which stages a checkpoint folder holds, in chain order, and their models as the report
measures them. No stage is named here: the order, the evaluation modes and the subject follow
from the stage records (conf/step/*.yaml, mdk/stage.py).

* a stage is *present* when ``<paths.checkpoints>/<stage>/best.pth`` exists; the exporting
  stage's chip model (``<stage>/chip_model/``) adds the integer reference's row;
* the *subject* of the per-layer part is the latest present stage evaluated with 5-bit
  activations at calibrated caps and not gain-fused (step3's best.pth, else cal's).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig
from torch import nn

from mdk.checkpoint import load_checkpoint
from mdk.engine.export_stage import CHIP_MODEL_DIR
from mdk.errors import ConfigError, MissingStageInput
from mdk.quant.bn_fold import chip_layers
from mdk.saved_models import ChipModelNet, with_checkpoint_model
from mdk.stage import StageSpec, chain, stage_names, stage_spec
from mdk.stage_checkpoint import BEST, checkpoint_root, load_model_for

INTEGER = "integer"  # the waterfall's row of the exported chip model under the integer reference


@dataclass(frozen=True)
class Present:
    """One row of the waterfall: a stage's best.pth, or (``chip_model``) its exported model."""
    stage: str
    path: Path
    mode: str              # how it is evaluated, in words

    @property
    def is_chip_model(self) -> bool:
        return self.stage == INTEGER


def mode_words(spec: StageSpec) -> str:
    q = spec.eval_quant
    if q.fuse_gains:
        return "chip model (fused, integer activations)"
    parts = [w for w, on in (("weights", q.weights), ("5-bit activations", q.activations)) if on]
    return " + ".join(parts) + " quantized" if parts else "float"


def present_stages(cfg: DictConfig, exclude: str) -> list[Present]:
    """The stages with a best.pth under ``paths.checkpoints``, first stage of the chain first,
    then the integer reference of an exported chip model; ``exclude``: the report's own stage."""
    root = checkpoint_root(cfg)
    names = [s for s in stage_names() if s != exclude and (root / s / BEST).is_file()]
    rows = [Present(s, root / s / BEST, mode_words(stage_spec(s)))
            for s in sorted(names, key=lambda s: (len(chain(s)), s))]
    for s in names:
        if stage_spec(s).export and (root / s / CHIP_MODEL_DIR).is_dir():
            rows.append(Present(INTEGER, root / s / CHIP_MODEL_DIR,
                                f"{s}'s exported chip model, integer reference"))
            break
    if not rows:
        ends = [s for s in stage_names() if s != exclude and stage_spec(s).export]
        whole = max((chain(s) for s in ends or stage_names()), key=len)
        raise MissingStageInput(
            f"paths.checkpoints={root} holds no stage checkpoint (<stage>/{BEST}) to report on; "
            f"train the chain first with the same model/dataset/paths overrides, e.g. `python "
            f"run.py pipeline=[{','.join(whole)}]`, or give paths.checkpoints=<its folder>")
    return rows


def subject_of(rows: list[Present]) -> Optional[Present]:
    """The latest present stage with calibrated caps and no gain fusion (None: no such stage)."""
    found = None
    for r in rows:
        if not r.is_chip_model:
            q = stage_spec(r.stage).eval_quant
            if q.activations and not q.fuse_gains:
                found = r
    return found


def load_row(cfg: DictConfig, row: Present, grid: int) -> nn.Module:
    """The model of a waterfall row in its evaluation mode (eval(), on the CPU)."""
    if row.is_chip_model:
        net = ChipModelNet(row.path, INTEGER)
        size = int(net.cm.meta.get("image_size", cfg.model.image_size))
        _same_geometry(row.path, size, int(net.cm.meta.get("grid", grid)), cfg, grid)
        return net.eval()
    ck = load_checkpoint(row.path, advice="run its stage again to rebuild it, or restore it")
    model_cfg = with_checkpoint_model(cfg, ck, ())
    model, _ = load_model_for(model_cfg, row.path, mode="eval")
    _same_geometry(row.path, int(model_cfg.model.image_size), int(model.grid), cfg, grid)
    return model


def load_subject(cfg: DictConfig, row: Present, grid: int) -> nn.Module:
    """The subject's weights (BN folded, caps) with every chip layer float: its float reference."""
    model = load_row(cfg, row, grid)
    for layer in chip_layers(model):
        layer.quant_weight = layer.quant_act = False
    return model


def _same_geometry(path: Path, size: int, grid: int, cfg: DictConfig, run_grid: int) -> None:
    if size != int(cfg.model.image_size) or grid != run_grid:
        raise ConfigError(
            f"{path} was made for model.image_size={size} (grid {grid}) but this run composes "
            f"model.image_size={cfg.model.image_size} (grid {run_grid}); give the report the "
            "model overrides the chain was trained with")
