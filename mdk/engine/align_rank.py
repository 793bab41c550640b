"""One rank of an alignment run (``python -m launchers.align``, whose docstring says what is made
equal and why): the same global batches trained a few iterations, the final state saved.
"""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Optional

import torch
from omegaconf import DictConfig, OmegaConf

from mdk import dist
from mdk.engine import build
from mdk.engine.hooks import LRSchedulerHook, sampler_epoch_hook
from mdk.engine.loop import HookBase, Trainer
from mdk.models.build import build_model
from mdk.world import World

log = logging.getLogger(__name__)


def alignment_config(cfg: DictConfig, batch_size: int, iters: int, dtype: str,
                     out: Path, exact_chunk: Optional[int] = None) -> DictConfig:
    """A new config with what alignment needs switched on/off. ``exact_chunk``: world-size-invariant
    gradients in chunks of that many images, one CPU thread per process."""
    net: dict[str, Any] = {}
    dist: dict[str, Any] = {"nodes": 1, "rank": 0, "dist_url": "auto", "sync_bn": False,
                            "exact_chunk": exact_chunk,
                            "cpu_threads": 1 if exact_chunk else cfg.dist.get("cpu_threads", "auto")}
    if cfg.model.net.get("batch_norm", False):
        if not exact_chunk and cfg.dist.sync_bn:
            dist["sync_bn"] = True
            log.info("the model has BatchNorm and dist.sync_bn=true: normalising over the global "
                     "batch (torch's SyncBatchNorm on CUDA, mdk.sync_bn on CPU)")
        else:
            net["batch_norm"] = False
            log.info("the model has BatchNorm: aligning its BN-free variant "
                     "(model.net.batch_norm=false)%s", "" if exact_chunk else
                     "; add dist.sync_bn=true to align the BN model itself")
    return OmegaConf.merge(cfg, {
        # Only iters x batch images are read: decoding them beats caching the split in every rank.
        "model": {"net": net}, "dist": dist, "dataset": {"cache_images": False},
        "trainer": {"batch_size": batch_size, "limit_train_batches": None, "amp": False,
                    "num_workers": 0, "progress": False, "resume": False},
        "align": {"iters": iters, "dtype": dtype, "out": str(out)}})


def _double_inputs(model: torch.nn.Module) -> None:
    """float64 mode: the model's input quantizer emits float32; cast each conv layer's input to
    its weight dtype so the whole forward runs in float64."""
    def pre(mod: torch.nn.Module, args: tuple) -> tuple:
        w = next(mod.parameters())
        return tuple(a.to(w.dtype) if torch.is_tensor(a) and a.is_floating_point() else a
                     for a in args)

    for m in model.modules():
        if any(isinstance(c, torch.nn.Conv2d) for c in m.children()):
            m.register_forward_pre_hook(pre)


def train_rank(cfg: DictConfig, run_dir: Path, world: World) -> dict[str, Any]:
    """One rank of one alignment run (a launcher's stage function): train ``align.iters`` steps."""
    iters, device = int(cfg.align.iters), world.device
    build.seed_everything(cfg.seed + world.rank)
    model = build_model(cfg)
    tag = str(cfg.align.get("tag", ""))
    model.load_state_dict(torch.load(Path(cfg.align.out) / f"init{tag}.pth", weights_only=True))
    if cfg.align.dtype == "float64":
        model.double()
        _double_inputs(model)
    model.to(device)
    if world.distributed and cfg.dist.sync_bn:
        model = dist.convert_sync_bn(model, device)
    net = model
    if world.distributed:
        net = torch.nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None)
    train_ds, _ = build.build_data(cfg, model.grid, world)
    loader, sampler = build.build_train_loader(cfg, train_ds, world)
    optimizer, scheduler = build.build_optim_sched(cfg, model, sampler.num_batches)
    epochs = math.ceil(iters / sampler.num_batches)
    trainer = Trainer(net, build.build_loss(cfg), optimizer, loader, device, epochs,
                      sampler.num_batches, grad_clip=cfg.trainer.grad_clip,
                      exact_chunk=cfg.dist.get("exact_chunk"), world_size=world.size)

    class StopAfter(HookBase):
        def after_step(self) -> None:
            self.trainer.stop = self.trainer.iter >= iters

    trainer.register_hooks([sampler_epoch_hook(sampler, train_ds), LRSchedulerHook(scheduler),
                            StopAfter()])
    trainer.train()
    path = Path(cfg.align.out) / f"world{world.size}{tag}.pth"
    if world.is_main:
        torch.save({"model": model.state_dict()}, path)
    return {"path": str(path), "iters": trainer.iter, "loss": float(trainer.loss_terms["total"].detach())}


def perturb(state: dict[str, torch.Tensor], rel: float, seed: int = 1) -> dict[str, torch.Tensor]:
    """Every floating tensor times (1 + rel * N(0, 1)) elementwise (a seeded copy)."""
    g = torch.Generator().manual_seed(seed)
    return {k: v * (1 + rel * torch.randn(v.shape, generator=g, dtype=v.dtype))
            if v.is_floating_point() else v.clone() for k, v in state.items()}
