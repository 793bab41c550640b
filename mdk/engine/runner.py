"""Run the stages of a pipeline in this process, one after another (docs/architecture.md, "The path
of a run"): a stage's work is a function of a ``StageContext`` (``WORK``, or the ``pkg.module.fn``
its record's ``kind`` names), so a new kind of stage needs no change here.
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from mdk import dist, faults
from mdk.engine import build, precision
from mdk.models.build import build_model
from mdk.engine.calibration import calibrate_stage
from mdk.engine.context import StageContext
from mdk import targets
from mdk.engine.export_stage import export_best
from mdk.engine.result import StageResult
from mdk.engine.train import train_stage
from mdk.eval.distributed import evaluate
from mdk.stage import apply_stage
from mdk.stage_config import StageConf
from mdk.checkpoint.layout import StageCheckpointer
from mdk.stop import StopRequested, is_armed, stop_requested
from mdk.world import World, alone

log = logging.getLogger(__name__)

WORK: dict[str, Callable[[StageContext], Mapping[str, Any]]] = {
    "train": train_stage, "calibrate": calibrate_stage}


def run_stage(cfg: DictConfig, run_dir: Path, world: Optional[World] = None, *,
              step_offset: int = 0, group: Optional[str] = None) -> StageResult:
    """Run ``cfg.step`` in this process: a rank of ``world`` (process group joined), or alone when
    ``world`` is None. ``step_offset``: the optimizer steps of the pipeline's earlier stages
    (metrics continue one global step); ``group``: the sweep's name."""
    t_start = time.perf_counter()
    world = alone(world, cfg.trainer.device)
    faults.set_rank(world.rank)
    spec = StageConf.from_node(cfg.step)
    precision.configure(cfg.trainer, world.device)
    build.seed_everything(cfg.seed + world.rank)
    model = build_model(cfg)
    train_ds, val_ds = build.build_data(cfg, model.grid, world)
    checkpoints = StageCheckpointer(cfg, spec, world)
    start = checkpoints.start(model)
    apply_stage(model, spec, str(cfg.chip))
    model.to(world.device)
    loss_fn = build.build_loss(cfg).to(world.device)  # (a loss may hold state: GtiLoss.nu)
    local_bs = cfg.trainer.batch_size // world.size
    ev = cfg.get("eval") or {}
    eval_fn = faults.wrap("eval", lambda keep=None: evaluate(  # MDK_FAULT=kill:eval:N (tests)
        model, val_ds, local_bs, world.device, cfg.trainer.conf_thresh, cfg.trainer.nms_iou,
        cfg.trainer.limit_val_batches, loss_fn=loss_fn, progress=cfg.trainer.progress,
        metric=str(ev.get("metric", "voc07")), keep=keep, world=world,
        box_rule=str(ev.get("box_rule", "devkit"))))
    ctx = StageContext(cfg, run_dir, world, spec, model, train_ds, val_ds, checkpoints, start,
                       loss_fn, eval_fn, step_offset, group, t_start)
    if start.finished and not spec.trains:
        done = start.resume.get("summary") or {}  # done before: report, do not redo
        result = StageResult.from_dict({**done, "stage": spec.name})
    else:
        # a built-in kind, or the function a stage record's ``kind: pkg.module.fn`` names
        work = WORK.get(spec.kind) or targets.build(
            spec.kind, "step.kind", check=True, hint="name a function as package.module.function")
        result = StageResult.from_work(spec.name, work(ctx))
    # a stage that saves nothing (the quantization report) names no folder
    result.checkpoints = str(checkpoints.dir) if checkpoints.dir.is_dir() else None
    result.next, result.bar = spec.next, spec.bar
    if spec.export and world.is_main:
        result.export = str(export_best(cfg, checkpoints, val_ds))
    result.time_s = round(time.perf_counter() - t_start, 1)
    return result


def stage_on_rank(cfg: DictConfig, run_dir: Path, world: World, **kw: Any) -> dict[str, Any]:
    """``run_stage`` for a launcher's ranks: the result as plain data (it may cross processes)."""
    return run_stage(cfg, run_dir, world, **kw).to_dict()


def run_stages(cfg: DictConfig, run_dir: Path, world: Optional[World] = None, *,
               stages: Sequence[Mapping[str, Any]], step_offset: int = 0,
               group: Optional[str] = None) -> dict[str, Any]:
    """``run_stage`` for each of ``stages`` (their configs, composed and checked by the launcher,
    as plain data; ``cfg``: the first one's, which started this rank), one after another on this
    rank. Returns ``{"stages": [result, ...]}``, as plain data. A stop asked for after a stage's
    last check (in its last epoch) ends the pipeline before the next one; a stage whose work
    stopped early (a search's pruner) ends it too."""
    results: list[dict[str, Any]] = []
    offset = step_offset  # metric sinks: one global step continuing across the stages
    for plain in stages:
        scfg = OmegaConf.create(plain)
        name = str(scfg.step.name)
        if results and _stop_agreed(world):  # asked in the previous stage's last epoch
            raise StopRequested(stop_requested() or "another rank was asked to stop",
                                stage=results[-1]["stage"])
        if StageConf.from_node(scfg.step).trains:
            length = (f"trainer.time={scfg.trainer.time}" if scfg.trainer.get("time")
                      else f"{scfg.trainer.epochs} epochs")
            log.info("=== %s ===  %s, lr %g", name, length, scfg.optim.lr)
        else:
            log.info("=== %s ===  one pass, no training", name)
        try:
            res = run_stage(scfg, run_dir, world, step_offset=offset, group=group)
        except StopRequested as e:
            e.stage = e.stage or name
            raise
        offset += res.iterations
        results.append(res.to_dict())
        if res.extra.get("stop_reason"):
            log.warning("%s ended after epoch %s of %d (%s); the stages after it do not run",
                        name, res.extra.get("stopped_epoch"), scfg.trainer.epochs,
                        res.extra["stop_reason"])
            break
    return {"stages": results}


def _stop_agreed(world: Optional[World]) -> bool:
    """Whether a stop was asked of this process, or (ranks with stop handlers) of any rank: every
    rank then ends the pipeline at the same stage."""
    if world is None or world.size == 1 or not is_armed():
        return stop_requested() is not None
    return dist.max_flag_started(float(stop_requested() is not None))() > 0
