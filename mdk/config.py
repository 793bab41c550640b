"""Every config check, once per run, before any rank or worker starts: one clear error naming
the bad key. This module only dispatches: each config group's owner checks its own keys and owns
its word lists, beside its typed schema (mdk/schema.py lists the schemas).

Hydra rejects unknown keys (struct mode), unknown group choices and, through the typed schemas,
values of the wrong type, at compose time. The checks below add ranges and the checks that look
at several keys at once. The composed config is never mutated: derived values are returned, not
written back. Checks of the machine and the files (CUDA present, a checkpoint folder that can be
written, dataset files, input checkpoints) are mdk/preflight.py's.
"""
from __future__ import annotations

from typing import Callable, Optional

from omegaconf import DictConfig

from mdk.data.config import check_dataset
from mdk.dist_config import check_dist
from mdk.trainer_config import check_optim, check_trainer
from mdk.errors import ConfigError, UserError
from mdk.eval.config import check_eval
from mdk.models.config import check_loss, check_model
from mdk.quant.chips import check_chip
from mdk.sched.base import check_config as check_scheduler_node
from mdk.sinks.config import check_logger
from mdk.stage import StageSpec, check_pipeline, stage_config
from mdk.stage_config import running_stages


def check_schedulers(cfg: DictConfig) -> None:
    """The ``scheduler`` node as each training stage of the command will build it (a stage's
    own ``epochs`` reaches e.g. the cosine ``T_max``)."""
    for s in running_stages(cfg):
        scfg = stage_config(cfg, s)
        if StageSpec.from_node(scfg.step).trains:
            check_scheduler_node(scfg.scheduler)


# Owner by owner (after trainer and dist, which need the world size): what runs, on which chip,
# with which data and model, how it is measured and logged, the loss and the LR schedule.
CHECKS: tuple[Callable[[DictConfig], None], ...] = (
    check_pipeline, check_chip, check_dataset, check_model, check_eval, check_logger, check_loss,
    check_schedulers)


def validate(cfg: DictConfig, world_size: Optional[int] = None) -> None:
    """Raise a user error naming the first bad key; returns nothing on a good config.

    ``world_size``: the real number of processes when something else started them (torchrun,
    SLURM); by default ``dist.gpus * dist.nodes``."""
    try:
        check_trainer(cfg)
        check_optim(cfg)
        check_dist(cfg, world_size)
        for check in CHECKS:
            check(cfg)
    except UserError:
        raise
    except Exception as e:  # a missing mandatory value (???) or an interpolation that fails
        raise ConfigError(f"bad configuration: {e}") from e
