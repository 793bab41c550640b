"""The ``train`` kind of work: the training loop with its hooks, for any training stage.

With ``trainer.ema.enabled`` the averaged weights are evaluated, choose best.pth and are what the
next stage, the tools and the export load (the run state's ``ema`` in the checkpoint, beside the
raw ``model`` weights a resume continues from; mdk.checkpoint.sources.weights_of reads them).
"""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator

import torch

from omegaconf import OmegaConf

from mdk import dist, faults
from mdk.checkpoint.meaning import unfit_parts
from mdk.data.augment import BatchAugment
from mdk.engine import build, precision
from mdk.engine.context import StageContext
from mdk.engine.ema import EMAHook, ema_from_config
from mdk.engine.extra_hooks import build_extra_hooks
from mdk.engine.freeze import ReleaseFrozenHook
from mdk.engine.hooks import (CheckpointHook, EvalHook, FaultHook, LRSchedulerHook, MetricsHook,
                              ProgressHook, sampler_epoch_hook)
from mdk.engine.nan_guard import NanGuardHook
from mdk.engine.loop import Trainer
from mdk.engine.reports import ReportHook, maybe_reporter
from mdk.engine.run_state import ConfiguredOptimizer, HookStates, RankRNG, RunState
from mdk.engine.stage_length import plan_stage
from mdk.engine.stop_hook import StopOnRequestHook
from mdk.engine.time_left import TimeLeftHook
from mdk.sched.curve import plot_lr_curve
from mdk.sinks.build import build_sinks
from mdk.checkpoint.layout import BEST, iteration

log = logging.getLogger(__name__)


def _training_net(ctx: StageContext, channels_last: bool) -> torch.nn.Module:
    """The module the loop calls: the stage's model in its memory layout, DDP-wrapped when
    distributed, compiled with ``trainer.compile``. Checkpoints and evaluation use ctx.model."""
    model, world, cfg = ctx.model, ctx.world, ctx.cfg
    if channels_last:
        model.to(memory_format=torch.channels_last)
    if world.distributed and cfg.dist.sync_bn:
        ctx.model = dist.convert_sync_bn(model, world.device)
    return _wrapped(ctx, log_compile=True)


def _wrapped(ctx: StageContext, log_compile: bool = False) -> torch.nn.Module:
    """``ctx.model`` DDP-wrapped over the parameters that need a gradient now, and compiled."""
    model, world, cfg = ctx.model, ctx.world, ctx.cfg
    net = model
    if world.distributed and any(p.requires_grad for p in model.parameters()):
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[world.device.index] if world.device.type == "cuda" else None)
    if cfg.trainer.get("compile"):
        if log_compile:
            log.info("trainer.compile=true: the first iterations compile the model")
        net = torch.compile(net)
    return net


@contextlib.contextmanager
def _standard_layout(model: torch.nn.Module, channels_last: bool) -> Iterator[None]:
    """Evaluate in the standard (NCHW) layout: a float sum in NHWC can differ in its last bit, and
    best.pth's numbers must be what ``mdk.tools.evaluate`` gives for that file."""
    if channels_last:
        model.to(memory_format=torch.contiguous_format)
    try:
        yield
    finally:
        if channels_last:
            model.to(memory_format=torch.channels_last)


def _batch_transform(ctx: StageContext) -> Any:
    """Augment images on the training device (``dataset.augment_on``; auto: with CUDA)."""
    where = str(ctx.cfg.dataset.get("augment_on", "auto"))
    ds = ctx.train_ds
    if not getattr(ds, "augment", False) or where == "loader" or (
            where == "auto" and ctx.world.device.type != "cuda"):
        return None
    return BatchAugment(ds)  # it sets ds.defer_images: before the loader's workers fork


def train_stage(ctx: StageContext) -> dict[str, Any]:
    """Train the stage; returns StageResult fields (the best evaluation, the loss at the end)."""
    cfg, world = ctx.cfg, ctx.world
    float_model = ctx.spec.quant.is_float   # trainer.amp=auto: bf16 on the CPU for float stages
    channels_last = precision.channels_last(cfg.trainer, world.device, float_model)
    net = _training_net(ctx, channels_last)
    model = ctx.model
    transform = _batch_transform(ctx)
    loader, sampler = build.build_train_loader(cfg, ctx.train_ds, world)
    amp_dtype = precision.amp_dtype(cfg.trainer, world.device, float_model)
    plan = plan_stage(ctx, sampler.num_batches, amp_dtype, channels_last)
    epochs = plan.epochs
    optimizer, scheduler = build.build_optim_sched(cfg, model, sampler.num_batches, epochs)
    plan.allow_replan(ctx, scheduler, loader, sampler.num_batches)
    trainer = Trainer(net, ctx.loss_fn, optimizer, loader, world.device, epochs,
                      sampler.num_batches, grad_clip=cfg.trainer.grad_clip,
                      exact_chunk=cfg.dist.get("exact_chunk"),
                      amp_dtype=amp_dtype,
                      batch_transform=transform,
                      channels_last=channels_last, world_size=world.size)
    if trainer.amp_dtype is not None:
        log.info("mixed precision: %s autocast in the training step (trainer.amp=%s; "
                 "trainer.amp=false trains in float32)", str(trainer.amp_dtype).replace("torch.", ""),
                 cfg.trainer.amp)
    ema = ema_from_config(cfg.trainer.get("ema"), model)
    resume = ctx.start.resume
    sink = build_sinks(cfg.logger, ctx.run_dir, OmegaConf.to_container(cfg, resolve=True),
                       world.is_main, stage=ctx.spec.name, group=ctx.group,
                       resume_step=ctx.step_offset + iteration(resume) if resume else None)
    reporter = maybe_reporter(cfg, ctx.run_dir, ctx.spec.name, ctx.val_ds, sink, world.is_main)

    def evaluate() -> dict[str, Any]:
        keep = reporter.keep if reporter is not None else None
        with _standard_layout(model, channels_last), \
                ema.swapped(model) if ema is not None else contextlib.nullcontext():
            return ctx.evaluate(keep=keep)

    metrics = MetricsHook(sink, cfg.logger.log_every, ctx.step_offset, world.size)
    progress = ProgressHook(metrics, cfg.trainer.progress, world.is_main,
                            int(cfg.trainer.batch_size))
    guard = NanGuardHook(cfg.trainer.get("nan_skip_limit", 0), cfg.logger.log_every)
    ckpt = CheckpointHook(lambda epoch_done: checkpoint(epoch_done), ctx.checkpoints.save,
                          world.is_main, cfg.trainer.checkpoint_every_iters,
                          before_save=guard.check)
    extra = build_extra_hooks(cfg.trainer.get("hooks"), stage=ctx.spec.name, run_dir=ctx.run_dir,
                              is_main=world.is_main, so_far=lambda: _so_far(ckpt, metrics))
    frozen_for = cfg.model.get("freeze_epochs")
    release = ReleaseFrozenHook(model, cfg.model.freeze, frozen_for, lambda: _wrapped(ctx),
                                world.is_main) if frozen_for is not None else None
    # Order matters: the guard sees a bad loss before anything reads or saves it; metrics read
    # the LR before it steps; the EMA is updated before the evaluation reads it; checkpoints
    # see the evaluated metric; reports know whether it was a new best.
    trainer.register_hooks([FaultHook() if faults.enabled() else None, release,
                            sampler_epoch_hook(sampler, ctx.train_ds), guard, metrics,
                            LRSchedulerHook(scheduler), progress,
                            EMAHook(ema, world.distributed) if ema is not None else None,
                            EvalHook(evaluate, cfg.trainer.eval_every), ckpt,
                            ReportHook(reporter, ckpt, ctx.step_offset,
                                       ctx.checkpoints.dir / BEST) if reporter else None,
                            *extra,  # trainer.hooks: after the epoch's checkpoints are written
                            plan.budget,  # trainer.time: ends the stage at the budget
                            # after ckpt: a stop request writes last.pth and leaves the loop
                            StopOnRequestHook(ckpt.save_last, world.distributed),
                            # last: the epoch's evaluation and checkpoints are part of its time
                            TimeLeftHook(ctx.spec.name, cfg.trainer.eval_every, world.is_main,
                                         plan.epoch_weights, plan.budget)])
    # What last.pth holds, saved and resumed by walking the same names (RNG last: restored
    # right before the loop starts drawing).
    state = RunState({"optimizer": ConfiguredOptimizer(optimizer), "scheduler": scheduler,
                      "scaler": trainer.scaler, "ema": ema, "loss": ctx.loss_fn, "trainer": trainer,
                      "hooks": HookStates(trainer.hooks), "rng": RankRNG(world)})

    def checkpoint(epoch_done: bool) -> dict[str, Any]:
        return ctx.checkpoints.contents(model, **state.state_dict(),
                                        metric=getattr(trainer, "metrics", {}),
                                        epoch_done=epoch_done)

    if resume is not None:
        fresh = unfit_parts(resume, cfg)  # an optimizer/loss of another class: its own fresh state
        state.load_state_dict({k: v for k, v in resume.items() if k not in fresh})
    elif world.is_main:
        try:
            plot_lr_curve(cfg.scheduler, sampler.num_batches, epochs,
                          ctx.run_dir / f"lr_{ctx.spec.name}.png", base_lr=cfg.optim.lr)
        except Exception as e:  # a plot must never stop training
            log.warning("could not draw the LR curve: %s", e)
    try:
        if not plan.done:  # else the budget ended this stage before: its best stands
            trainer.train()
    finally:
        sink.close()
    out = _summary(ckpt, metrics, trainer)
    if plan.budget is not None:
        out.update(time_budget_s=plan.budget.budget_s, planned_epochs=plan.epochs,
                   ended_at_budget=plan.budget.done)
    return out


def _so_far(ckpt: CheckpointHook, metrics: MetricsHook) -> dict[str, Any]:
    """The stage's numbers so far, named as in StageResult (for trainer.hooks)."""
    return {"best_map50": ckpt.best if ckpt.best_epoch >= 0 else None,
            "final_loss": metrics.last.get("loss/total")}


def _summary(ckpt: CheckpointHook, metrics: MetricsHook, trainer: Trainer) -> dict[str, Any]:
    bm: dict[str, Any] = ckpt.best_metrics or {}
    out = {**_so_far(ckpt, metrics), "iterations": trainer.iter,
           "best_epoch": ckpt.best_epoch + 1 if ckpt.best_epoch >= 0 else None}
    if bm.get("ap") is not None:
        out.update(metric=bm.get("metric"), ap=bm.get("ap"))
    if trainer.stop and trainer.stop_reason:  # a trainer.hooks hook ended training early
        out.update(stopped_epoch=trainer.epoch, stop_reason=trainer.stop_reason)
    return out
