"""Every config check, once per run, before any rank or worker starts: one error naming the bad
key. Only a dispatcher: each config group's owner checks its own keys (ranges, checks across keys;
Hydra's schemas already refuse unknown keys and wrong types). The config is never mutated.
"""
from __future__ import annotations

from typing import Optional

from omegaconf import DictConfig

from mdk.config_keys import check_added_keys
from mdk.data.config import check_dataset
from mdk.dist_config import check_dist
from mdk.trainer_config import check_optim, check_trainer
from mdk.errors import ConfigError, UserError
from mdk.eval.config import check_eval
from mdk.models.config import check_loss, check_model
from mdk.quant.chips import check_chip
from mdk.sched.base import check_config as check_scheduler_node
from mdk.sinks.config import check_logger
from mdk.stage import check_pipeline, config_for_stage
from mdk.stage_config import StageConf, running_stages


def check_schedulers(cfg: DictConfig) -> None:
    """The ``scheduler`` node as each training stage builds it (its ``epochs`` reach T_max)."""
    for s in running_stages(cfg):
        scfg = config_for_stage(cfg, s)
        if StageConf.from_node(scfg.step).trains:
            check_scheduler_node(scfg.scheduler, int(scfg.trainer.epochs))


def validate(cfg: DictConfig, world_size: Optional[int] = None) -> None:
    """Raise a user error naming the first bad key. ``world_size``: the real number of processes
    when something else started them (torchrun, SLURM); default ``dist.gpus * dist.nodes``."""
    try:
        check_added_keys(cfg)  # a +key no schema or consumer reads: before it is ignored
        check_trainer(cfg)
        check_optim(cfg)
        check_dist(cfg, world_size)
        for check in (check_pipeline, check_chip, check_dataset, check_model, check_eval,
                      check_logger, check_loss, check_schedulers):
            check(cfg)
    except UserError:
        raise
    except Exception as e:  # a missing mandatory value (???) or an interpolation that fails
        raise ConfigError(f"bad configuration: {e}") from e
