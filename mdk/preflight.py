"""Checks that run in the launching process before any worker is spawned or any data is built.

Everything a user can get wrong that is cheap to detect up front beyond the config itself
(``mdk.config.validate`` checked that, once, before this): the machine (``check_environment``),
dataset files that are missing or too few, a checkpoint folder that cannot be written, a stage
whose input checkpoint is missing, unreadable, from another model or of another meaning.
Each raises the same error type the engine would raise later, so the message is the same; only
it comes seconds after the command instead of after spawning N processes.
"""
from __future__ import annotations

import logging
import os
import tempfile
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from mdk.checkpoint import load_checkpoint
from mdk.checkpoint_meaning import check_input, check_resume
from mdk.data.build import check_dataset_files
from mdk.errors import CheckpointError, ConfigError, DataError
from mdk.models.build import build_model
from mdk.paths import resolve_path
from mdk.stage import StageSpec
from mdk.stage_checkpoint import RESUME_NAMES, StageCheckpointer, input_advice, load_into
from mdk.stage_config import KINDS
from mdk.world import backend_for, check_local_size

log = logging.getLogger(__name__)


def check_environment(cfg: DictConfig, cuda_available: Optional[bool] = None,
                      device_count: Optional[int] = None) -> None:
    """Checks against this machine (before any process is spawned): CUDA asked for but absent,
    more processes per node than GPUs, NCCL without CUDA. Arguments override detection (tests)."""
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


def _check_dataset(cfg: DictConfig) -> None:
    # The files of both splits through the dataset's reader (any format).
    base = os.getcwd()
    n_train = check_dataset_files(cfg.dataset, base, resolve_path(cfg.paths.data, base))
    generated = bool(cfg.dataset.get("generate"))
    batch = int(cfg.trainer.batch_size)
    if n_train and n_train < batch and StageSpec.from_node(cfg.step).kind in KINDS:
        where = ("dataset.generate.num_train" if generated
                 else f"the {cfg.dataset.train_split!r} split of {cfg.dataset.root}")
        raise DataError(f"{where} has {n_train} images, fewer than one global batch "
                        f"(trainer.batch_size={batch}); the last partial batch of an epoch is "
                        "dropped, so nothing would train: lower trainer.batch_size or add images")


def _check_input(cfg: DictConfig) -> None:
    """The first stage's starting point: resumable files, else its input checkpoint, must fit."""
    spec = StageSpec.from_node(cfg.step)
    checkpoints = StageCheckpointer(cfg, spec)
    if cfg.trainer.resume and any((checkpoints.dir / n).is_file() for n in RESUME_NAMES):
        for n in RESUME_NAMES:
            try:
                ck = load_checkpoint(checkpoints.dir / n)
            except CheckpointError:
                continue  # the engine falls back from an unreadable file with a warning
            _check_fits(build_model(cfg), ck, checkpoints.dir / n, load_into,
                        f"it is {spec.name}'s own checkpoint from an earlier run: use another "
                        "paths.checkpoints, or trainer.resume=false to start this stage over")
            return
        return
    init = checkpoints.input_path()  # MissingStageInput names the stage to run first
    if init is None:
        return
    ck = load_checkpoint(init, advice=input_advice(spec))
    _check_fits(build_model(cfg), ck, init, load_into,
                f"it is the input of {spec.name}: run step={spec.init_from} again with the same "
                "model/dataset, or point paths.checkpoints at the matching run",
                strict=ck.get("stage") is not None)


def _check_meaning(cfg: DictConfig) -> None:
    """The first stage's starting point means what this config means (class names in their
    order, input size, model, stage, chip), and a done stage is not rerun with changed
    hyper-parameters (mdk/checkpoint_meaning.py). Runs before ``_check_input``, so a changed class
    list is named as such rather than as the shape mismatch it may also cause; a missing or
    unreadable file is ``_check_input``'s to report."""
    spec = StageSpec.from_node(cfg.step)
    checkpoints = StageCheckpointer(cfg, spec)
    own = [checkpoints.dir / n for n in RESUME_NAMES if (checkpoints.dir / n).is_file()]
    if cfg.trainer.resume and own:
        ck, path = next(((c, p) for p in own if (c := _readable(p)) is not None), (None, None))
        if ck is not None:
            check_resume(ck, path, cfg, spec)
        return
    init = checkpoints.input_path() if spec.init_from is not None else None
    ck = _readable(init) if init is not None else None
    if ck is not None:
        check_input(ck, init, cfg, spec)


def _readable(path: Path) -> Optional[dict]:
    try:
        return load_checkpoint(path)
    except CheckpointError:
        return None


def _check_fits(model, ck, path, load, advice: str, strict: bool = True) -> None:
    try:
        load(model, ck, path, strict=strict)
    except CheckpointError as e:
        raise CheckpointError(f"{e} ({advice})") from None


def preflight(cfg: DictConfig) -> None:
    """Raise ConfigError / DataError / CheckpointError / MissingStageInput before any work.

    ``cfg`` is the resolved config of the first stage to run (later stages of a pipeline get
    their input from it), already validated (mdk.config.validate, once per run)."""
    check_environment(cfg)
    check_writable(cfg, os.getcwd())
    _check_dataset(cfg)
    _check_meaning(cfg)
    _check_input(cfg)
