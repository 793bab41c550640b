"""The ``train`` kind of work: the training loop with its hooks, for any training stage."""
from __future__ import annotations

import logging
from typing import Any

import torch

from mdk import dist, faults
from mdk.config import to_container
from mdk.engine import build, precision
from mdk.engine.hooks import (CheckpointHook, EvalHook, FaultHook, LRSchedulerHook, MetricsHook,
                              NanGuardHook, ProgressHook, sampler_epoch_hook)
from mdk.engine.loop import Trainer
from mdk.engine.runner import StageContext
from mdk.engine.stop import StopOnRequestHook
from mdk.sinks import build_sinks

log = logging.getLogger(__name__)


def _wrap_ddp(ctx: StageContext) -> torch.nn.Module:
    model, world, cfg = ctx.model, ctx.world, ctx.cfg
    if not world.distributed:
        return model
    if cfg.dist.sync_bn:
        model = ctx.model = dist.convert_sync_bn(model, world.device)
    if not any(p.requires_grad for p in model.parameters()):
        return model
    return torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[world.device.index] if world.device.type == "cuda" else None)


def train_stage(ctx: StageContext) -> dict[str, Any]:
    cfg, world, model = ctx.cfg, ctx.world, ctx.model
    net = _wrap_ddp(ctx)
    model = ctx.model
    loader, sampler = build.build_train_loader(cfg, ctx.train_ds, world)
    optimizer, scheduler = build.build_optim_sched(cfg, model, sampler.num_batches)
    trainer = Trainer(net, ctx.loss_fn, optimizer, loader, world.device, cfg.trainer.epochs,
                      sampler.num_batches, grad_clip=cfg.trainer.grad_clip,
                      exact_chunk=cfg.dist.get("exact_chunk"),
                      amp_dtype=precision.amp_dtype(cfg.trainer, world.device))
    best, best_epoch = float("-inf"), -1
    resume = ctx.start.resume
    if resume is not None:
        optimizer.load_state_dict(resume["optimizer"])
        scheduler.load_state_dict(resume["scheduler"])
        trainer.iter = resume["iter"]
        best, best_epoch = resume.get("best_metric", best), resume.get("best_epoch", -1)
        if trainer.scaler is not None and resume.get("scaler"):
            trainer.scaler.load_state_dict(resume["scaler"])
        rng = resume.get("rng", {}).get(world.rank)
        if rng is not None:
            build.set_rng_state(rng)

    def state_fn() -> dict[str, Any]:
        return ctx.checkpoints.contents(
            model, optimizer=optimizer.state_dict(), scheduler=scheduler.state_dict(),
            epoch=trainer.epoch, iter=trainer.iter, metric=getattr(trainer, "metrics", {}),
            rng=dict(enumerate(dist.all_gather_object(build.rng_state()))),
            scaler=trainer.scaler.state_dict() if trainer.scaler else None,
            world_size=world.size)

    sink = build_sinks(cfg.logger, ctx.run_dir, to_container(cfg), world.is_main)
    metrics = MetricsHook(sink, cfg.logger.log_every)
    guard = NanGuardHook(cfg.trainer.get("nan_skip_limit", 0), cfg.logger.log_every)
    ckpt = CheckpointHook(state_fn, ctx.checkpoints.save, cfg.trainer.checkpoint_every_iters,
                          best, best_epoch, before_save=guard.check)
    # Order matters: the guard sees a bad loss before anything reads or saves it; metrics read
    # the LR before it steps; checkpoints see the evaluated metric. The fault hook exists only
    # when MDK_FAULT is set (kill/NaN injection for the tests).
    trainer.register_hooks([FaultHook() if faults.enabled() else None,
                            sampler_epoch_hook(sampler, ctx.train_ds), guard, metrics,
                            LRSchedulerHook(scheduler), ProgressHook(metrics, cfg.trainer.progress),
                            EvalHook(ctx.evaluate, cfg.trainer.eval_every), ckpt,
                            # after ckpt: a stop request (preemption signal, launchers/requeue.py)
                            # writes last.pth at the next step and leaves the loop
                            StopOnRequestHook(ckpt.save_last)])
    if world.is_main and resume is None:
        from mdk.sched.curve import plot_lr_curve
        try:
            plot_lr_curve(cfg.scheduler, sampler.num_batches, cfg.trainer.epochs,
                          ctx.run_dir / f"lr_{ctx.spec.name}.png", base_lr=cfg.optim.lr)
        except Exception as e:  # a plot must never stop training
            log.warning("could not draw the LR curve: %s", e)
    try:
        trainer.train()
    finally:
        sink.close()
    return {"best_map50": ckpt.best if ckpt.best_epoch >= 0 else None,
            "best_epoch": ckpt.best_epoch + 1 if ckpt.best_epoch >= 0 else None,
            "final_loss": metrics.last.get("loss/total"), "iterations": trainer.iter}
