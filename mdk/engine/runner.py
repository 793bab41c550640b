"""Run one stage of the pipeline: initialise, train or calibrate, checkpoint, export.

What a stage does is config (conf/step/*.yaml): ``train``, ``calibrate``, ``export`` and where its
weights come from (``init_from``). Init order: this stage's last.pth (``trainer.resume``) >
``<checkpoints>/<init_from>/best.pth`` > random (only where ``init_required`` is false).
"""
from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from mdk import dist
from mdk import faults
from mdk.checkpoint import (find_resume, input_advice, load_checkpoint, load_model_weights,
                            save_checkpoint)
from mdk.config import to_container
from mdk.engine import build
from mdk.engine.hooks import (CheckpointHook, EvalHook, LRSchedulerHook, MetricsHook, NanGuardHook,
                              ProgressHook, sampler_epoch_hook)
from mdk.engine.loop import Trainer
from mdk.engine.stop import StopOnRequestHook
from mdk.engine.stage_setup import apply_stage, find_init, prepare_for_checkpoint
from mdk.evaluation import evaluate
from mdk.models.loss import YoloLoss
from mdk.sinks import build_sinks

log = logging.getLogger(__name__)


def run_stage(cfg: DictConfig, run_dir: Path) -> dict[str, Any]:
    """Run ``cfg.step`` in this process (already part of the process group if distributed)."""
    t_start = time.perf_counter()
    stage = cfg.step.name
    build.seed_everything(cfg.seed + dist.get_rank())
    device = build.pick_device(cfg)
    model = build.build_model(cfg)
    train_ds, val_ds = build.build_data(cfg, model.grid)
    out_dir = build.stage_dir(cfg, stage)
    loss_fn = YoloLoss(cfg.dataset.num_classes, cfg.model.net.boxes_per_cell)

    resume, resume_path = None, out_dir / "last.pth"
    if cfg.trainer.resume:
        # Rank 0 first: it may move an unreadable file aside; the others then see a clean dir.
        if dist.is_main_process():
            resume, resume_path = find_resume(out_dir)
        dist.barrier()
        if not dist.is_main_process():
            resume, resume_path = find_resume(out_dir)
    if resume is not None and resume.get("finished") and not cfg.step.train:
        log.info("%s already done (%s); delete it to run it again", stage, resume_path)
    if resume is not None:
        prepare_for_checkpoint(model, resume.get("stage", stage))
        load_model_weights(model, resume["model"], resume_path)
        log.info("resuming %s from %s (iteration %d)", stage, resume_path, resume["iter"])
    else:
        init = find_init(cfg, stage)
        if init is not None:
            ck = load_checkpoint(init, advice=input_advice(stage, str(cfg.step.init_from)))
            prepare_for_checkpoint(model, ck.get("stage", "step1"))
            strict = ck.get("stage") is not None  # step0 pretrained files may lack extra buffers
            load_model_weights(model, ck["model"], init, strict=strict)
            log.info("%s starts from %s", stage, init)
    apply_stage(model, stage, cfg)
    model.to(device)

    world = dist.world_size()
    if world > 1 and cfg.dist.sync_bn:
        model = dist.convert_sync_bn(model, device)
    net = model
    if world > 1 and any(p.requires_grad for p in model.parameters()) and cfg.step.train:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)

    local_bs = cfg.trainer.batch_size // world
    eval_fn = faults.wrap("eval", lambda: evaluate(  # MDK_FAULT=kill:eval:N hook (tests)
        model, val_ds, local_bs, device, cfg.trainer.conf_thresh, cfg.trainer.nms_iou,
        cfg.trainer.limit_val_batches, loss_fn=loss_fn, progress=cfg.trainer.progress))
    summary: dict[str, Any] = {"stage": stage, "checkpoints": str(out_dir)}

    if cfg.step.calibrate:
        from mdk.engine.calibration import run_calibration

        summary.update(run_calibration(cfg, model, train_ds, device, out_dir, eval_fn))
    elif cfg.step.train:
        summary.update(_train(cfg, model, net, loss_fn, train_ds, device, out_dir, run_dir,
                              resume, eval_fn))
    if cfg.step.export and dist.is_main_process():
        from mdk.engine.export_stage import export_best

        summary["export"] = str(export_best(cfg, out_dir, val_ds))
    summary["time_s"] = round(time.perf_counter() - t_start, 1)
    return summary


def _train(cfg: DictConfig, model: torch.nn.Module, net: torch.nn.Module, loss_fn: YoloLoss,
           train_ds: Any, device: torch.device, out_dir: Path, run_dir: Path,
           resume: dict | None, eval_fn: Any) -> dict[str, Any]:
    loader, sampler = build.build_train_loader(cfg, train_ds)
    optimizer, scheduler = build.build_optim_sched(cfg, model, sampler.num_batches)
    trainer = Trainer(net, loss_fn, optimizer, loader, device, cfg.trainer.epochs,
                      sampler.num_batches, amp=cfg.trainer.amp, grad_clip=cfg.trainer.grad_clip,
                      exact_chunk=cfg.dist.get("exact_chunk"))
    best, best_epoch = float("-inf"), -1
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        trainer.iter = resume["iter"]
        best, best_epoch = resume.get("best_metric", best), resume.get("best_epoch", -1)
        if trainer.scaler is not None and resume.get("scaler"):
            trainer.scaler.load_state_dict(resume["scaler"])
        rng = resume.get("rng", {}).get(dist.get_rank())
        if rng is not None:
            build.set_rng_state(rng)
    config = to_container(cfg)

    def state_fn() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "scheduler": scheduler.state_dict(), "epoch": trainer.epoch, "iter": trainer.iter,
                "stage": cfg.step.name, "metric": getattr(trainer, "metrics", {}),
                "rng": dict(enumerate(dist.all_gather_object(build.rng_state()))), "config": config,
                "scaler": trainer.scaler.state_dict() if trainer.scaler else None,
                "world_size": dist.world_size()}

    sink = build_sinks(cfg.logger, run_dir, config, dist.is_main_process())
    metrics = MetricsHook(sink, cfg.logger.log_every)
    ckpt = CheckpointHook(out_dir, state_fn, save_checkpoint, cfg.trainer.checkpoint_every_iters,
                          best, best_epoch)
    # Order matters: metrics read the LR before it steps; checkpoints see the evaluated metric.
    # faults.make_hook() is None unless MDK_FAULT is set (kill/NaN injection for the tests).
    trainer.register_hooks([faults.make_hook(), sampler_epoch_hook(sampler, train_ds),
                            NanGuardHook(cfg.trainer.get("nan_skip_limit", 0)), metrics,
                            LRSchedulerHook(scheduler),
                            ProgressHook(metrics, cfg.trainer.progress),
                            EvalHook(eval_fn, cfg.trainer.eval_every), ckpt,
                            # after ckpt: a stop request (preemption signal, launchers/requeue.py)
                            # writes last.pth at the next step and leaves the loop
                            StopOnRequestHook(ckpt.save_last)])
    if dist.is_main_process() and resume is None:
        from mdk.tools.plot_lr import plot_lr_curve
        try:
            plot_lr_curve(cfg.scheduler, sampler.num_batches, cfg.trainer.epochs,
                          run_dir / f"lr_{cfg.step.name}.png", base_lr=cfg.optim.lr)
        except Exception as e:  # a plot must never stop training
            log.warning("could not draw the LR curve: %s", e)
    try:
        trainer.train()
    finally:
        sink.close()
    return {"best_map50": ckpt.best if ckpt.best_epoch >= 0 else None,
            "best_epoch": ckpt.best_epoch + 1 if ckpt.best_epoch >= 0 else None,
            "final_loss": metrics.last.get("loss/total"), "iterations": trainer.iter}
