"""Config checks that run before any work: one clear error naming the bad key.

Hydra rejects unknown keys (struct mode), unknown group choices and, through the typed schemas of
mdk/schema.py, values of the wrong type, at compose time. ``validate`` adds ranges and the checks
that look at several keys at once. The composed config is never mutated: derived values are
returned, not written back.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from mdk.errors import ConfigError
from mdk.paths import resolve_path
from mdk.stage import check_pipeline

CHIPS = ("5801", "2801", "2803")
AMP_DTYPES = ("auto", "float16", "bfloat16")


def _get(cfg: DictConfig, key: str) -> Any:
    return OmegaConf.select(cfg, key, throw_on_missing=True)


def _min(cfg: DictConfig, key: str, minimum: int, optional: bool = False) -> None:
    """An integer >= minimum (also type-checked here: validate runs on plain configs too)."""
    v = _get(cfg, key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise ConfigError(f"{key}={v!r} must be an integer (e.g. {key}={max(minimum, 1)})")
    if v < minimum:
        raise ConfigError(f"{key}={v} must be >= {minimum}")


def _positive(cfg: DictConfig, key: str, optional: bool = False) -> None:
    v = _get(cfg, key)
    if v is None and optional:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{key}={v!r} must be a number")
    if not v > 0:  # also rejects nan
        raise ConfigError(f"{key}={v} must be > 0" + (" (or null to turn it off)" if optional else ""))


def _one_of(cfg: DictConfig, key: str, allowed: tuple[str, ...]) -> None:
    v = _get(cfg, key)
    if str(v) not in allowed:
        raise ConfigError(f"{key}={v!r} must be {', '.join(allowed[:-1])} or {allowed[-1]}")


def _true_false_auto(cfg: DictConfig, key: str, auto_means: str) -> None:
    """A switch whose ``auto`` is resolved per device and stage (mdk/engine/precision.py)."""
    v = _get(cfg, key)
    if v not in (True, False, "auto"):
        raise ConfigError(f"{key}={v!r} must be true, false or auto (auto: {auto_means})")


def _check_dist_url(url: str) -> None:
    if url == "auto":
        return
    host, sep, port = url.removeprefix("tcp://").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"dist.dist_url={url!r} must be host:port with a port in 1..65535 "
                          "(e.g. dist.dist_url=10.0.0.1:29500), or auto on one machine")


def check_world(cfg: DictConfig, world_size: Optional[int] = None) -> None:
    """The checks that depend on the world size: the real one when the launcher knows it (torchrun
    or SLURM decide it, not ``dist.gpus * dist.nodes``), else the configured one."""
    world = int(world_size or cfg.dist.gpus * cfg.dist.nodes)
    where = ("the world size dist.gpus*dist.nodes" if world_size is None
             else "the world size (processes started by the launcher)")
    if cfg.trainer.batch_size % world:
        raise ConfigError(f"trainer.batch_size={cfg.trainer.batch_size} is the global batch and "
                          f"must divide by {where}={world}")
    chunk = cfg.dist.get("exact_chunk")
    if chunk is not None and (cfg.trainer.batch_size // world) % chunk:
        raise ConfigError(
            f"dist.exact_chunk={chunk} must divide the per-process batch trainer.batch_size/"
            f"world = {cfg.trainer.batch_size}/{world} = {cfg.trainer.batch_size // world}; "
            f"to compare world sizes up to W use exact_chunk = batch_size/W or a divisor of it")


def _check_trainer(cfg: DictConfig) -> None:
    _min(cfg, "seed", 0)
    for key, lo in (("epochs", 1), ("batch_size", 1), ("eval_every", 1),
                    ("checkpoint_every_iters", 0), ("nan_skip_limit", 0)):
        _min(cfg, f"trainer.{key}", lo)
    for key in ("limit_train_batches", "limit_val_batches"):
        _min(cfg, f"trainer.{key}", 1, optional=True)
    if _get(cfg, "trainer.num_workers") != "auto":
        _min(cfg, "trainer.num_workers", 0, optional=True)
    _positive(cfg, "trainer.grad_clip", optional=True)
    _positive(cfg, "optim.lr")
    _one_of(cfg, "trainer.device", ("auto", "cpu", "cuda"))
    _one_of(cfg, "trainer.amp_dtype", AMP_DTYPES)
    _true_false_auto(cfg, "trainer.amp", "bfloat16 autocast for float stages trained on the CPU")
    _true_false_auto(cfg, "trainer.channels_last", "on the CPU, and on CUDA with trainer.amp")
    if cfg.trainer.get("compile") and cfg.trainer.activation_checkpointing:
        raise ConfigError("trainer.compile=true with trainer.activation_checkpointing=true is not "
                          "supported (the checkpointed slices do not compile); choose one")


def _check_dist(cfg: DictConfig, world_size: Optional[int]) -> None:
    for key, lo in (("gpus", 1), ("nodes", 1), ("rank", 0)):
        _min(cfg, f"dist.{key}", lo)
    _positive(cfg, "dist.timeout_s")
    _check_dist_url(str(cfg.dist.dist_url))
    _one_of(cfg, "dist.backend", ("auto", "gloo", "nccl"))
    if cfg.dist.rank >= cfg.dist.nodes:
        raise ConfigError(f"dist.rank={cfg.dist.rank} must be < dist.nodes={cfg.dist.nodes} "
                          "(machine ranks count from 0)")
    if cfg.dist.nodes > 1 and str(cfg.dist.dist_url) == "auto":
        raise ConfigError("dist.dist_url=auto only works on one machine; with dist.nodes>1 give "
                          "machine 0's address on every machine, e.g. dist.dist_url=10.0.0.1:29500")
    _min(cfg, "dist.exact_chunk", 1, optional=True)
    check_world(cfg, world_size)
    threads = cfg.dist.get("cpu_threads", "auto")
    if threads != "auto" and (isinstance(threads, bool) or not isinstance(threads, int)
                              or threads < 1):
        raise ConfigError(f"dist.cpu_threads={threads!r} must be auto or an integer >= 1 "
                          "(e.g. dist.cpu_threads=1)")


def _check_loss(cfg: DictConfig) -> None:
    """The loss group's own checks (its constructor names the ``loss.<key>``), run here so a bad
    weight is one config line before any data is built, not a Hydra error from the run."""
    if cfg.get("loss") is None:
        return
    from hydra.errors import InstantiationException
    from hydra.utils import instantiate

    try:
        instantiate(cfg.loss)  # a few floats and a buffer: no data, no device
    except InstantiationException as e:
        if not isinstance(e.__cause__, ValueError):
            raise
        raise ConfigError(str(e.__cause__)) from e.__cause__


def validate(cfg: DictConfig, world_size: Optional[int] = None) -> None:
    """Raise ConfigError naming the first bad key; returns nothing on a good config.

    ``world_size``: the real number of processes when something else started them (torchrun,
    SLURM); by default ``dist.gpus * dist.nodes``."""
    try:
        _check_trainer(cfg)
        _check_dist(cfg, world_size)
        check_pipeline(cfg)
        if str(cfg.chip) not in CHIPS:
            raise ConfigError(f"chip={cfg.chip} is not a supported chip; use one of {', '.join(CHIPS)}")
        names = list(cfg.dataset.class_names)
        if cfg.dataset.num_classes != len(names):
            raise ConfigError(f"dataset.num_classes={cfg.dataset.num_classes} but dataset.class_names "
                              f"has {len(names)} names; make them agree")
        _min(cfg, "model.image_size", 32)
        _one_of(cfg, "eval.metric", ("voc07", "voc12", "coco"))
        _min(cfg, "eval.grid_images", 0)
        ema = cfg.trainer.get("ema")
        if ema is not None and ema.enabled:
            if not 0 < float(ema.decay) < 1:
                raise ConfigError(f"trainer.ema.decay={ema.decay} must be in (0, 1), e.g. 0.9999")
            if float(ema.tau) < 0:
                raise ConfigError(f"trainer.ema.tau={ema.tau} must be >= 0 (0: constant decay)")
            _one_of(cfg, "trainer.ema.dtype", ("float32", "float64"))
        _min(cfg, "logger.log_every", 1)
        _check_loss(cfg)
    except ConfigError:
        raise
    except Exception as e:  # a missing mandatory value (???) or an interpolation that fails
        raise ConfigError(f"bad configuration: {e}") from e


def check_environment(cfg: DictConfig, cuda_available: Optional[bool] = None,
                      device_count: Optional[int] = None) -> None:
    """Checks against this machine (before any process is spawned): CUDA asked for but absent,
    more processes per node than GPUs, NCCL without CUDA. Arguments override detection (tests)."""
    from mdk.world import backend_for, check_local_size

    backend_for(cfg.trainer.device, cfg.dist.backend, cuda_available)
    check_local_size(cfg.trainer.device, int(cfg.dist.gpus), cuda_available, device_count)


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
    # A real write, not os.access: root passes access() on read-only mounts and /proc.
    try:
        with tempfile.TemporaryFile(dir=q, prefix=".mdk-write-probe-"):
            pass
    except OSError as e:
        raise ConfigError(f"paths.checkpoints={str(p)!r}: {q} is not writable (creating a file there failed: {e.strerror}); "
                          "choose a folder you can write to") from None
