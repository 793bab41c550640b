"""Fail a sweep before anything is queued: each job's config gets the checks a single run makes
(docs/cluster.md, "Every job is checked before any job starts").
"""
from __future__ import annotations

import logging
import time
from typing import Any, Optional, Sequence

from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from launchers.hydra_app.hydra_internals import BASIC_SWEEPER, BasicSweeper
from launchers.hydra_app.submitit_requeue import slurm_dist_url
from mdk.config import validate
from mdk.data.class_names import fill_class_names
from mdk.errors import ConfigError
from mdk.paths import register_resolvers
from mdk.stage import config_for_stage
from mdk.stage_config import running_stages

log = logging.getLogger(__name__)


class SweepConfigError(SystemExit):
    """A sweep job's config is bad (SystemExit: a callback's Exception is only a warning in Hydra)."""


def sweep_jobs(config: DictConfig) -> Optional[list[list[str]]]:
    """The overrides of every job of this sweep; None when the sweeper decides them as it runs."""
    if OmegaConf.select(config, "hydra.sweeper._target_") != BASIC_SWEEPER:
        return None
    params = OmegaConf.select(config, "hydra.sweeper.params") or {}
    args = [f"{k}={v}" for k, v in params.items()]
    args += [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task)]  # type: ignore[union-attr]
    parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
    batches = BasicSweeper.split_arguments(parser.parse_overrides(args), None)
    return [list(job) for job in batches[0]]


def check_job(cfg: DictConfig, slurm: bool = False) -> None:
    """What a single run checks before it starts anything; raises ConfigError."""
    register_resolvers()
    if slurm:  # the job fills in its first node's address; a stand-in passes the same checks
        slurm_dist_url(cfg, "slurm-node0", 29500)
    fill_class_names(cfg)
    validate(cfg)
    for stage in running_stages(cfg):
        config_for_stage(cfg, stage)


def _swept(jobs: Sequence[Sequence[str]]) -> set[str]:
    """Keys whose value differs between jobs (what names a job in a message)."""
    seen: dict[str, set[str]] = {}
    for job in jobs:
        for o in job:
            key, _, value = o.partition("=")
            seen.setdefault(key, set()).add(value)
    return {k for k, v in seen.items() if len(v) > 1}


def check_sweep(config: DictConfig, jobs: Sequence[Sequence[str]]) -> None:
    loader = GlobalHydra.instance().config_loader()
    slurm = "SlurmLauncher" in str(OmegaConf.select(config, "hydra.launcher._target_"))
    swept = _swept(jobs)
    t0 = time.perf_counter()
    for num, job in enumerate(jobs):
        try:
            check_job(loader.load_sweep_config(config, list(job)), slurm)
        except (ConfigError, HydraException, ValueError) as e:
            label = " ".join(o for o in job if o.partition("=")[0] in swept) or " ".join(job)
            line = str(e).splitlines()[0] if str(e) else type(e).__name__
            end = "" if line.endswith(("?", ".")) else "."  # a question ends the sentence itself
            raise SweepConfigError(
                f"sweep job #{num} ({label}): {line}{end} Nothing was started ({len(jobs)} jobs); "
                "fix that value or leave the combination out of the sweep") from None
    log.info("checked the configs of %d sweep jobs in %.1f s", len(jobs), time.perf_counter() - t0)


class SweepCheck(Callback):
    """Hydra callback: checks every job before the sweeper starts any."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not self.enabled:
            return
        jobs = sweep_jobs(config)
        if jobs is None:
            log.info("sweeper %s picks its jobs as it runs: each job checks its own config",
                     OmegaConf.select(config, "hydra.sweeper._target_"))
            return
        check_sweep(config, jobs)
