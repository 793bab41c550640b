"""The cal stage: one pass over the training split, no gradient, no optimizer step.

Each rank observes its share of every global batch; caps are MAX-all-reduced (finalize_caps), so
W processes calibrate exactly like one. The result is saved as the stage's best.pth/last.pth
(step2 weights + caps) and as a human-readable caps.json.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable

import torch
from omegaconf import DictConfig

from mdk import dist
from mdk.checkpoint import atomic_save
from mdk.config import to_container
from mdk.engine.build import build_train_loader
from mdk.quant import calibrate
from mdk.quant.stages import apply_stage

log = logging.getLogger(__name__)


@torch.no_grad()
def run_calibration(cfg: DictConfig, model: torch.nn.Module, train_ds: Any, device: torch.device,
                    out_dir: Path, eval_fn: Callable[[], dict]) -> dict[str, Any]:
    c = cfg.step.calibration
    train_ds.set_epoch(0)
    aug = getattr(train_ds, "augment", False)
    train_ds.augment = False  # calibrate on the images as the chip will see them
    loader, sampler = build_train_loader(cfg, train_ds)
    sampler.shuffle = False
    model.eval()
    bar = loader
    if cfg.trainer.progress and dist.is_main_process():
        from tqdm import tqdm
        bar = tqdm(loader, desc="cal", dynamic_ncols=True, leave=False)
    with calibrate.observing(model, method=str(c.method), percentile=float(c.percentile),
                             mse_candidates=int(c.get("mse_candidates", 64)),
                             max_values=c.get("max_values", calibrate.DEFAULT_MAX_VALUES)):
        n = 0
        for images, _, _ in bar:
            model(images.to(device, non_blocking=True))
            n += 1
        caps = calibrate.finalize_caps(model)
    train_ds.augment = aug
    log.info("calibrated %d layers on %d batches (%s): caps %s", len(caps), n, c.method,
             ", ".join(f"{x:.3g}" for x in caps))
    # What step3 starts from: the same weights with activations quantized to these caps.
    apply_stage(model, "step3", str(cfg.chip))
    metrics = eval_fn()
    apply_stage(model, "cal", str(cfg.chip))
    log.info("with 5-bit activations at these caps: val mAP@0.5 %.4f", metrics["map50"])
    if dist.is_main_process():
        state = {"model": model.state_dict(), "stage": "cal", "iter": 0, "epoch": 0,
                 "caps": caps, "metric": metrics, "best_metric": metrics["map50"],
                 "config": to_container(cfg), "finished": True}
        atomic_save(state, out_dir / "best.pth")
        atomic_save(state, out_dir / "last.pth")
        calibrate.save_caps(model, out_dir / "caps.json",
                            meta={"method": str(c.method), "percentile": float(c.percentile),
                                  "batches": n, "world_size": dist.world_size()})
    dist.barrier()
    return {"best_map50": metrics["map50"], "final_loss": metrics.get("loss"), "caps": caps}
