"""What `python run.py` does once Hydra has composed the config."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mdk.config import register_resolvers, validate

log = logging.getLogger(__name__)


def stage_config(cfg: DictConfig, stage: str) -> DictConfig:
    """A new config whose `step` group is conf/step/<stage>.yaml (cfg itself is not mutated)."""
    if cfg.step.name == stage:
        return cfg
    step = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "step" / f"{stage}.yaml")
    new = OmegaConf.merge(cfg, {"step": None})
    new.step = step
    return new


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Run the stages; a user error (bad config/data/checkpoint, NaN loss) becomes one line on
    stderr and exit status 1 instead of a traceback (HYDRA_FULL_ERROR=1 shows the traceback)."""
    from launchers.errors import user_error_line
    from launchers.malloc import tune_malloc
    from launchers.sweep_summary import run_guarded

    tune_malloc()  # again here: submitit/SLURM jobs reach run() without run.py's top level
    try:
        # Multirun: a failing job returns a "failed" result instead of raising, so the other jobs
        # still run and the sweep table shows it (launchers/sweep_summary.py).
        return run_guarded(_run, cfg)
    except Exception as e:
        line = user_error_line(e)
        if line is None or os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        log.error("%s", line)
        raise SystemExit(line) from None


def _run(cfg: DictConfig) -> list[dict[str, Any]]:
    from hydra.core.hydra_config import HydraConfig

    from launchers.spawn import run_ranks
    from launchers.summary import print_summary
    from mdk.engine.runner import run_stage
    from mdk.preflight import preflight

    register_resolvers()
    validate(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # Resolve once, here: workers get plain values (no Hydra resolvers in spawned processes).
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    stages = list(cfg.pipeline) or [cfg.step.name]
    preflight(stage_config(resolved, stages[0]))  # before any process is spawned
    results = []
    for s in stages:
        scfg = stage_config(resolved, s)
        log.info("=== %s ===", s)
        results.append(run_ranks(scfg, run_dir, run_stage))
    from launchers.env import detect

    if detect().rank == 0:  # under torchrun/SLURM every rank gets here with rank 0's results
        print_summary(results, cfg, run_dir)
    return results
