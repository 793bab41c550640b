"""Checks that run in the launching process before any worker is spawned or any data is built.

Everything a user can get wrong that is cheap to detect up front, beyond the config itself
(``mdk.config.validate``, run once before this): the machine (``check_environment``), a dataset root that does not exist, a checkpoint folder that
cannot be written, a stage whose input checkpoint is missing, unreadable or from another model.
Each raises the same error type the engine would raise later, so the message is the same; only
it comes seconds after the command instead of after spawning N processes.
"""
from __future__ import annotations

import logging
import os
from omegaconf import DictConfig

from mdk.checkpoint import CheckpointError, load_checkpoint
from mdk.config import check_environment, check_writable
from mdk.data.voc import DataError
from mdk.errors import ConfigError
from mdk.models.build import build_model
from mdk.paths import resolve_path
from mdk.stage import StageSpec
from mdk.stage_checkpoint import RESUME_NAMES, StageCheckpointer, input_advice, load_into
from mdk.stage_config import KINDS

log = logging.getLogger(__name__)


def _check_dataset(cfg: DictConfig) -> None:
    from mdk.data.build import check_dataset_files

    # The config, then the files of both splits through the dataset's reader (any format).
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


def _check_scheduler(cfg: DictConfig) -> None:
    """The scheduler's arguments, checked by building it on a throw-away optimizer (its own
    checks name the key): a config error now, not a traceback in every rank later."""
    import torch
    from hydra.utils import instantiate

    if not StageSpec.from_node(cfg.step).trains:
        return
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    try:
        instantiate(cfg.scheduler)(optimizer=opt, iters_per_epoch=1)
    except ValueError as e:
        msg = str(e)
        raise ConfigError(msg if msg.startswith("scheduler.") else f"scheduler: {msg}") from None


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
    _check_scheduler(cfg)
    _check_dataset(cfg)
    _check_input(cfg)
