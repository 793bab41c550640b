"""The ``calibrate`` kind of work (the cal stage): one pass over the training split, no gradient.

The statistics are taken on the global batch (mdk/quant/calibrate.py), so W processes calibrate
like one, bit for bit. The result is saved as the stage's checkpoints, marked finished (a rerun
reports it instead of calibrating again), and as a readable caps.json.
"""
from __future__ import annotations

import logging
from typing import Any

import torch

from mdk import dist
from mdk.engine.build import build_train_loader
from mdk.engine.context import StageContext
from mdk.engine.reports import maybe_reporter
from mdk.progress import progress_bar
from mdk.quant import calibrate
from mdk.calibration_config import calibration_node, observers
from mdk.sinks.base import NullSink
from mdk.stage import apply_stage

log = logging.getLogger(__name__)


@torch.no_grad()
def calibrate_stage(ctx: StageContext) -> dict[str, Any]:
    """Calibrate; returns StageResult fields (the val mAP at the new caps, the caps)."""
    cfg, model, train_ds, world = ctx.cfg, ctx.model, ctx.train_ds, ctx.world
    c = calibration_node(cfg.step.calibration)  # config_for_stage's node (any spelling reads)
    train_ds.set_epoch(0)
    aug = getattr(train_ds, "augment", False)
    train_ds.augment = False  # calibrate on the images as the chip will see them
    loader, sampler = build_train_loader(cfg, train_ds, world, persistent=False)
    sampler.shuffle = False
    model.eval()
    bar = progress_bar(loader, setting=cfg.trainer.progress, is_main=world.is_main,
                       desc=ctx.spec.name)
    with calibrate.observing(model, observers(c, rank=world.rank, world=world.size)):
        n = 0
        try:
            for images, _, _ in bar:
                model(images.to(world.device, non_blocking=True))
                n += 1
        finally:
            loader.close()  # its persistent workers
        caps = calibrate.finalize_caps(model)
    train_ds.augment = aug
    log.info("calibrated %d layers on %d batches (%s): caps %s", len(caps), n, c["_target_"],
             ", ".join(f"{x:.3g}" for x in caps))
    # What the next stage starts from: the record's evaluation mode (5-bit activations at these
    # caps), then back to the stage's own mode.
    apply_stage(model, ctx.spec, str(cfg.chip), evaluate=True)
    reporter = maybe_reporter(cfg, ctx.run_dir, ctx.spec.name, ctx.val_ds, NullSink(), world.is_main)
    metrics = ctx.evaluate(keep=reporter.keep if reporter else None)
    if reporter:  # the PR curves and detections of what the next stage starts from
        reporter.after_eval(ctx.step_offset, best=True)
        reporter.write_best(ctx.step_offset)
    apply_stage(model, ctx.spec, str(cfg.chip))
    log.info("with 5-bit activations at these caps: val mAP@0.5 %.4f", metrics["map50"])
    summary = {"best_map50": metrics["map50"], "final_loss": metrics.get("loss"), "caps": caps,
               "metric": metrics.get("metric"), "ap": metrics.get("ap")}
    if world.is_main:
        ctx.checkpoints.save_done(ctx.checkpoints.contents(
            model, caps=caps, metric=metrics, summary=summary))
        settings = {k: v for k, v in c.items() if k != "_target_"}
        calibrate.save_caps(model, ctx.checkpoints.dir / "caps.json",
                            meta={"method": c["_target_"], **settings, "batches": n,
                                  "world_size": world.size})
    dist.barrier()
    return summary
