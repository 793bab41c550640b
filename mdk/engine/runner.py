"""Run one stage of the pipeline in this process: build, start, do the stage's work, export.

What a stage does is its record (conf/step/<stage>.yaml, mdk/stage.py): the chip layers' mode,
the kind of work and whether to export. Where its weights come from is the stage checkpointer's
(mdk/stage_checkpoint.py). The work itself is a function of a ``StageContext``: ``train``
(mdk/engine/train.py), ``calibrate`` (mdk/engine/calibration.py), or any ``pkg.module.fn`` named
by the record's ``work`` key, so a new kind of stage needs no change here.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Optional

import torch
from hydra.utils import get_method
from omegaconf import DictConfig

from mdk import faults
from mdk.engine import build, precision
from mdk.eval.distributed import evaluate
from mdk.stage import StageSpec, apply_stage
from mdk.stage_checkpoint import Start, StageCheckpointer
from mdk.world import World, alone

log = logging.getLogger(__name__)


@dataclass
class StageContext:
    """Everything a stage's work function gets (built once by ``run_stage``)."""
    cfg: DictConfig
    run_dir: Path
    world: World
    spec: StageSpec
    model: torch.nn.Module          # in the stage's mode, on world.device (not DDP-wrapped)
    train_ds: Any
    val_ds: Any
    checkpoints: StageCheckpointer
    start: Start
    loss_fn: torch.nn.Module
    # evaluate(keep=None): mAP etc. on the val split; ``keep`` receives the evaluator's full
    # result and the detections (for reports)
    evaluate: Callable[..., dict[str, Any]] = field(repr=False, default=dict)
    step_offset: int = 0              # optimizer steps of the pipeline's earlier stages
    group: Optional[str] = None       # the sweep this job belongs to (metric sinks group by it)


def _work(kind: str) -> Callable[[StageContext], dict[str, Any]]:
    if kind == "train":
        from mdk.engine.train import train_stage

        return train_stage
    if kind == "calibrate":
        from mdk.engine.calibration import calibrate_stage

        return calibrate_stage
    if kind == "none":
        return lambda ctx: {}
    return get_method(kind)  # a stage record's `work: pkg.module.fn`


def run_stage(cfg: DictConfig, run_dir: Path, world: Optional[World] = None, *,
              step_offset: int = 0, group: Optional[str] = None) -> dict[str, Any]:
    """Run ``cfg.step`` in this process: a rank of ``world`` (made by the launcher, process group
    joined), or alone when ``world`` is None. ``step_offset``: the optimizer steps of the earlier
    stages of a pipeline (metrics continue one global step); ``group``: the sweep's name."""
    t_start = time.perf_counter()
    world = alone(world, cfg.trainer.device)
    spec = StageSpec.from_node(cfg.step)
    precision.configure(cfg.trainer, world.device)
    build.seed_everything(cfg.seed + world.rank)
    model = build.build_model(cfg)
    train_ds, val_ds = build.build_data(cfg, model.grid, world)
    checkpoints = StageCheckpointer(cfg, spec)
    start = checkpoints.start(model)
    apply_stage(model, spec, str(cfg.chip))
    model.to(world.device)
    loss_fn = build.build_loss(cfg).to(world.device)  # (a loss may hold state: GtiLoss.nu)
    local_bs = cfg.trainer.batch_size // world.size
    metric = str((cfg.get("eval") or {}).get("metric", "voc07"))
    eval_fn = faults.wrap("eval", lambda keep=None: evaluate(  # MDK_FAULT=kill:eval:N (tests)
        model, val_ds, local_bs, world.device, cfg.trainer.conf_thresh, cfg.trainer.nms_iou,
        cfg.trainer.limit_val_batches, loss_fn=loss_fn, progress=cfg.trainer.progress,
        metric=metric, keep=keep))
    ctx = StageContext(cfg, run_dir, world, spec, model, train_ds, val_ds, checkpoints, start,
                       loss_fn, eval_fn, step_offset, group)
    summary: dict[str, Any] = {"stage": spec.name, "checkpoints": str(checkpoints.dir),
                               "next": spec.next}
    if start.finished and not spec.train:
        summary.update(start.resume.get("summary") or {})  # done before: report, do not redo
    else:
        summary.update(_work(spec.kind)(ctx))
    if spec.export and world.is_main:
        from mdk.engine.export_stage import export_best

        summary["export"] = str(export_best(cfg, checkpoints, val_ds))
    summary["time_s"] = round(time.perf_counter() - t_start, 1)
    return summary
