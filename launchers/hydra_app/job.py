"""Running one job of ``python run.py``: a single run, or one job of a sweep (``-m``), where a
job that raises becomes a ``failed`` result (docs/cluster.md, "Sweeps").
"""
from __future__ import annotations

import logging
from typing import Any, Callable

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from launchers.reports.sweep_results import failure_record

log = logging.getLogger(__name__)


def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_guarded(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """``fn(cfg)``; in a multirun an Exception or a SystemExit with a message becomes a result.
    A SystemExit with a code (submitit's requeue), KeyboardInterrupt and StopRequested still end
    the process."""
    try:
        return fn(cfg)
    except (Exception, SystemExit) as e:
        if not is_multirun() or isinstance(e, SystemExit) and not isinstance(e.code, str):
            raise
        log.error("job failed: %s", e, exc_info=True)
        return failure_record(e)
