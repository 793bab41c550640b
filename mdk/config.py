"""Config checks that run before any work: one clear error naming the bad key.

Hydra already rejects unknown keys (struct mode) and unknown group choices; this adds types and
ranges. The composed config is never mutated: derived values are returned, not written back.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

STAGES = ("step1", "step2", "cal", "step3", "step4")
CHIPS = ("5801", "2801", "2803")


class ConfigError(ValueError):
    pass


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def _int(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> None:
    v = _get(cfg, key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key}={v!r} must be an integer (e.g. {key}={max(minimum, 1)})")
    if v < minimum:
        raise ConfigError(f"{key}={v} must be >= {minimum}")


def _bool(cfg: DictConfig, key: str) -> None:
    v = _get(cfg, key)
    if not isinstance(v, bool):
        raise ConfigError(f"{key}={v!r} must be true or false")


def _positive(cfg: DictConfig, key: str, optional: bool = False) -> None:
    v = _get(cfg, key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{key}={v!r} must be a number")
    if not v > 0:  # also rejects nan
        raise ConfigError(f"{key}={v} must be > 0" + (" (or null to turn it off)" if optional else ""))


def _check_dist_url(url: str) -> None:
    if url == "auto":
        return
    host, sep, port = url.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"dist.dist_url={url!r} must be host:port with a port in 1..65535 "
                          "(e.g. dist.dist_url=10.0.0.1:29500), or auto on one machine")


def validate(cfg: DictConfig) -> None:
    """Raise ConfigError naming the first bad key; returns nothing on a good config."""
    try:
        _int(cfg, "seed", 0)
        _int(cfg, "trainer.epochs", 1)
        _int(cfg, "trainer.batch_size", 1)
        _int(cfg, "trainer.limit_train_batches", 1, optional=True)
        _int(cfg, "trainer.limit_val_batches", 1, optional=True)
        _int(cfg, "trainer.num_workers", 0, optional=True)
        _int(cfg, "trainer.eval_every", 1)
        _int(cfg, "trainer.checkpoint_every_iters", 0)
        for k in ("resume", "amp", "activation_checkpointing", "progress"):
            _bool(cfg, f"trainer.{k}")
        _int(cfg, "trainer.nan_skip_limit", 0)
        _positive(cfg, "trainer.grad_clip", optional=True)
        _positive(cfg, "optim.lr")
        _int(cfg, "dist.gpus", 1)
        _int(cfg, "dist.nodes", 1)
        _int(cfg, "dist.rank", 0)
        _bool(cfg, "dist.sync_bn")
        _positive(cfg, "dist.timeout_s")
        _check_dist_url(str(cfg.dist.dist_url))
        if cfg.dist.backend not in ("auto", "gloo", "nccl"):
            raise ConfigError(f"dist.backend={cfg.dist.backend!r} must be auto, gloo or nccl")
        if cfg.dist.rank >= cfg.dist.nodes:
            raise ConfigError(f"dist.rank={cfg.dist.rank} must be < dist.nodes={cfg.dist.nodes} "
                              "(machine ranks count from 0)")
        if cfg.dist.nodes > 1 and str(cfg.dist.dist_url) == "auto":
            raise ConfigError("dist.dist_url=auto only works on one machine; with dist.nodes>1 give "
                              "machine 0's address on every machine, e.g. dist.dist_url=10.0.0.1:29500")
        world = cfg.dist.gpus * cfg.dist.nodes
        if cfg.trainer.batch_size % world:
            raise ConfigError(f"trainer.batch_size={cfg.trainer.batch_size} is the global batch and "
                              f"must divide by the world size dist.gpus*dist.nodes={world}")
        _int(cfg, "dist.exact_chunk", 1, optional=True)
        chunk = cfg.dist.get("exact_chunk")
        if chunk is not None and (cfg.trainer.batch_size // world) % chunk:
            raise ConfigError(
                f"dist.exact_chunk={chunk} must divide the per-process batch trainer.batch_size/"
                f"world = {cfg.trainer.batch_size}/{world} = {cfg.trainer.batch_size // world}; "
                f"to compare world sizes up to W use exact_chunk = batch_size/W or a divisor of it")
        running = list(cfg.pipeline) or [cfg.step.name]  # the stages this command runs
        if chunk is not None and cfg.model.net.get("batch_norm", False) and "step1" in running:
            raise ConfigError(
                f"dist.exact_chunk={chunk} cannot train step1 with BatchNorm "
                "(model.net.batch_norm=true): each chunk would normalise with its own statistics. "
                "Add model.net.batch_norm=false, or use exact_chunk from step2 on (BN is folded "
                "there), or dist.exact_chunk=null")
        threads = cfg.dist.get("cpu_threads", "auto")
        if threads != "auto" and (isinstance(threads, bool) or not isinstance(threads, int)
                                  or threads < 1):
            raise ConfigError(f"dist.cpu_threads={threads!r} must be auto or an integer >= 1 "
                              "(e.g. dist.cpu_threads=1)")
        if cfg.trainer.device not in ("auto", "cpu", "cuda"):
            raise ConfigError(f"trainer.device={cfg.trainer.device!r} must be auto, cpu or cuda")
        if cfg.step.name not in STAGES:
            raise ConfigError(f"step.name={cfg.step.name!r} must be one of {', '.join(STAGES)}")
        for s in cfg.pipeline:
            if s not in STAGES:
                raise ConfigError(f"pipeline entry {s!r} is not a stage; use some of {list(STAGES)}")
        for s in cfg.get("stages") or {}:
            if s not in STAGES:
                raise ConfigError(f"stages.{s} is not a stage; use one of {', '.join(STAGES)}")
            if s not in running:
                raise ConfigError(f"stages.{s}.* is set but {s} does not run in this command "
                                  f"(stages: {', '.join(running)}); add it to pipeline=[...] or "
                                  "drop the override")
        if str(cfg.chip) not in CHIPS:
            raise ConfigError(f"chip={cfg.chip} is not a supported chip; use one of {', '.join(CHIPS)}")
        names = list(cfg.dataset.class_names)
        if cfg.dataset.num_classes != len(names):
            raise ConfigError(f"dataset.num_classes={cfg.dataset.num_classes} but dataset.class_names "
                              f"has {len(names)} names; make them agree")
        _int(cfg, "model.image_size", 32)
        if cfg.logger.log_every < 1:
            raise ConfigError(f"logger.log_every={cfg.logger.log_every} must be >= 1")
    except ConfigError:
        raise
    except Exception as e:  # a missing mandatory value (???) or an interpolation that fails
        raise ConfigError(f"bad configuration: {e}") from e


def stage_schedule(step: DictConfig, stage: str) -> tuple[Optional[int], float]:
    """(epochs or None for trainer.epochs, lr factor) of a stage's conf/step node, checked."""
    epochs, scale = step.get("epochs"), step.get("lr_scale", 1.0)
    if epochs is not None and (isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1):
        raise ConfigError(f"step.epochs={epochs!r} ({stage}) must be an integer >= 1, or null for "
                          "trainer.epochs")
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not scale > 0:
        raise ConfigError(f"step.lr_scale={scale!r} ({stage}) must be a number > 0")
    return epochs, float(scale)


def check_environment(cfg: DictConfig, cuda_available: Optional[bool] = None,
                      device_count: Optional[int] = None) -> None:
    """Checks against this machine (before any process is spawned): CUDA asked for but absent,
    more processes per node than GPUs, NCCL without CUDA. Arguments override detection (tests)."""
    import torch

    cuda = torch.cuda.is_available() if cuda_available is None else cuda_available
    n = (torch.cuda.device_count() if cuda else 0) if device_count is None else device_count
    device, gpus, backend = cfg.trainer.device, cfg.dist.gpus, cfg.dist.backend
    if device == "cuda" and not cuda:
        raise ConfigError("trainer.device=cuda but this machine has no usable CUDA GPU; use "
                          "trainer.device=auto (CPU here) or run on a GPU machine")
    if backend == "nccl" and (not cuda or device == "cpu"):
        raise ConfigError("dist.backend=nccl needs CUDA GPUs; use dist.backend=auto (gloo on CPU)")
    if cuda and device != "cpu" and gpus > n:
        raise ConfigError(f"dist.gpus={gpus} but this machine has {n} GPU(s); use dist.gpus<={n}, "
                          "or trainer.device=cpu to run CPU worker processes")


def check_writable(cfg: DictConfig, root: str | Path) -> None:
    """paths.checkpoints must be (or be creatable as) a writable folder: fail now, not after the
    first epoch when the first checkpoint is written."""
    p = resolve_path(cfg.paths.checkpoints, root)
    q = p
    while not q.exists() and q != q.parent:
        q = q.parent
    if not q.is_dir():
        raise ConfigError(f"paths.checkpoints={str(p)!r}: {q} is a file, not a folder; choose "
                          "another paths.checkpoints")
    if not os.access(q, os.W_OK | os.X_OK):
        raise ConfigError(f"paths.checkpoints={str(p)!r}: {q} is not writable; choose a folder "
                          "you can write to")


def resolve_path(p: str | Path, root: str | Path) -> Path:
    """Absolute paths as given; relative ones under the repository root (cwd is never changed)."""
    p = Path(str(p)).expanduser()
    return p if p.is_absolute() else Path(root) / p


def to_container(cfg: DictConfig) -> dict:
    return OmegaConf.to_container(cfg, resolve=True)  # type: ignore[return-value]


def _ckpt_root(single_run_default: str) -> str:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        hc = HydraConfig.get()
        if hc.mode == RunMode.MULTIRUN:
            return str(Path(hc.runtime.output_dir) / "checkpoints")
    except (ImportError, ValueError):  # no Hydra run (compose API in tests, tools)
        pass
    return single_run_default


def register_resolvers() -> None:
    """Idempotent: called by every entry point before the config is read."""
    if not OmegaConf.has_resolver("mdk_ckpt"):
        OmegaConf.register_new_resolver("mdk_ckpt", _ckpt_root)
