"""Build the objects of a run from the composed config (``_target_`` nodes: mdk.targets.build)."""
from __future__ import annotations

import ctypes
import logging
import os
import random
import signal
import sys
from typing import Any, Optional

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from mdk import dist
from mdk.targets import build
from mdk.data.build import build_datasets
from mdk.data.loader import SafeLoader
from mdk.data.samplers import EpochTagged, GlobalBatchSampler
from mdk.models.build import build_head
from mdk.paths import resolve_path
from mdk.sched.base import stage_length
from mdk.world import World, alone

log = logging.getLogger(__name__)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def build_loss(cfg: DictConfig) -> torch.nn.Module:
    """The training loss (``loss`` group: conf/loss/*.yaml; also reported on the val split)."""
    return build(cfg.loss, "loss")


def build_data(cfg: DictConfig, grid: int, world: Optional[World] = None, train: bool = True
               ) -> tuple[Any, Any]:
    """Datasets; rank 0 generates/indexes the data first, the others wait and reuse it.
    ``world`` None: this process alone. ``train=False``: (None, val)."""
    world = alone(world)
    cache_root = resolve_path(cfg.paths.data, os.getcwd())
    ds_cfg = OmegaConf.to_container(cfg.dataset, resolve=True)
    ds_cfg["root"] = str(resolve_path(cfg.dataset.root, os.getcwd()))
    # Only rank 0 may draw the image check's bar (the others find its cache).
    args = (ds_cfg, cfg.model.image_size, grid, build_head(cfg), cfg.seed, cache_root,
            cfg.trainer.progress if world.is_main else False, train)
    if world.is_main:
        out = build_datasets(*args)
        dist.barrier()
    else:
        dist.barrier()
        out = build_datasets(*args)
    return out


def init_loader_worker(worker_id: int) -> None:
    """DataLoader worker init: leave stop signals to the trainer, and die with it (docs/errors.md,
    "Stop signals"). A worker a signal ended would fail the next batch fetch before last.pth is
    written; one outliving a killed rank would hold its gloo sockets, so the peers would wait for
    the collective timeout instead of failing at once."""
    for s in (signal.SIGTERM, signal.SIGINT, getattr(signal, "SIGUSR1", None),
              getattr(signal, "SIGUSR2", None)):
        if s is not None:
            signal.signal(s, signal.SIG_IGN)
    die_with_parent()


def die_with_parent() -> None:
    """Linux: SIGKILL this process when its parent dies (no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(1, signal.SIGKILL, 0, 0, 0) != 0:  # 1 = PR_SET_PDEATHSIG
        log.debug("prctl(PR_SET_PDEATHSIG) failed: errno %d", ctypes.get_errno())
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def build_train_loader(cfg: DictConfig, train_ds: Any, world: Optional[World] = None,
                       persistent: bool = True) -> tuple[SafeLoader, GlobalBatchSampler]:
    """The training split's loader and its sampler. ``persistent``: workers that live across
    epochs (training); a single pass (calibration) gets plain indices and per-pass workers."""
    world = alone(world)
    sampler = GlobalBatchSampler(len(train_ds), cfg.trainer.batch_size, world.rank, world.size,
                                 cfg.seed, shuffle=True,
                                 limit_batches=cfg.trainer.limit_train_batches)
    nw = loader_workers(cfg, world)
    # Persistent workers (starting them each epoch costs much of a GPU epoch) get the epoch with
    # every index (EpochTagged). Own generator: each iter() draws a worker base seed, which from
    # the global RNG would make a resumed run's RNG drift. fork: spawn (the default in spawned
    # ranks) would pickle the in-memory image cache into every worker.
    ctx = "fork" if nw > 0 and sys.platform == "linux" else None
    persistent = persistent and nw > 0
    loader = SafeLoader(train_ds, batch_sampler=EpochTagged(sampler) if persistent else sampler,
                        num_workers=nw, multiprocessing_context=ctx, persistent_workers=persistent,
                        worker_init_fn=init_loader_worker if nw > 0 else None,
                        pin_memory=world.device.type == "cuda",
                        generator=torch.Generator().manual_seed(int(cfg.seed)))
    return loader, sampler


def loader_workers(cfg: DictConfig, world: World) -> int:
    """``trainer.num_workers`` (null: the dataset's); ``auto``: the cores per process minus the
    training one, 1 to 8 (more only add memory: each holds a prefetched batch)."""
    nw = cfg.trainer.num_workers
    nw = cfg.dataset.get("num_workers", 0) if nw is None else nw
    if nw == "auto":
        return max(1, min(8, (os.cpu_count() or 1) // world.local_size - 1))
    return int(nw)


def build_optim_sched(cfg: DictConfig, model: torch.nn.Module, iters_per_epoch: int,
                      epochs: Optional[int] = None):
    """The optimizer over the trained parameters (and those ``model.freeze_epochs`` releases
    later: without a gradient the optimizer skips them, decay included) and its scheduler, for a
    stage of ``epochs`` (None: ``trainer.epochs``)."""
    later = cfg.model.get("freeze_epochs") is not None
    params = [p for p in model.parameters() if p.requires_grad or later]
    optimizer = build(cfg.optim, "optim", params)
    scheduler = build(cfg.scheduler, "scheduler", optimizer=optimizer,
                      iters_per_epoch=iters_per_epoch,
                      **stage_length(cfg.scheduler, cfg.trainer.epochs if epochs is None else epochs))
    return optimizer, scheduler
