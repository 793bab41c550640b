"""What `python run.py` does once Hydra has composed the config."""
from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mdk.config import ConfigError, register_resolvers, validate

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
    from hydra.core.hydra_config import HydraConfig

    from launchers.spawn import run_ranks
    from launchers.summary import print_summary
    from mdk.engine.runner import run_stage

    register_resolvers()
    try:
        validate(cfg)
    except ConfigError as e:
        log.error("%s", e)
        raise SystemExit(f"config error: {e}") from None
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    # Resolve once, here: workers get plain values (no Hydra resolvers in spawned processes).
    resolved = OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))
    stages = list(cfg.pipeline) or [cfg.step.name]
    results = []
    for s in stages:
        scfg = stage_config(resolved, s)
        log.info("=== %s ===", s)
        results.append(run_ranks(scfg, run_dir, run_stage))
    print_summary(results, cfg, run_dir)
    return results
