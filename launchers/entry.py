"""What `python run.py` does once Hydra has composed the config."""
from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from mdk.config import ConfigError, register_resolvers, stage_schedule, validate

log = logging.getLogger(__name__)


def stage_config(cfg: DictConfig, stage: str) -> DictConfig:
    """A new config whose `step` group is conf/step/<stage>.yaml (cfg itself is not mutated).

    ``stages.<stage>`` (e.g. ``+stages.step3.epochs=12``) is merged into that stage's node first.
    The stage's own ``epochs`` (when not null) replaces ``trainer.epochs`` and ``lr_scale``
    multiplies ``optim.lr``: the fine-tuning stages after step1 are short and need their own
    length. Call it on the unresolved config so ``${trainer.epochs}`` (e.g. the cosine T_max)
    follows the stage's value."""
    if cfg.step.name == stage:
        new = cfg
    else:
        step = OmegaConf.load(Path(__file__).resolve().parents[1] / "conf" / "step" / f"{stage}.yaml")
        new = OmegaConf.merge(cfg, {"step": None})
        new.step = step
    extra = (cfg.get("stages") or {}).get(stage)
    if extra:  # +stages.<stage>.<key>=value from the command line
        unknown = sorted(set(extra) - set(new.step))
        if unknown:
            raise ConfigError(f"stages.{stage}.{unknown[0]} is not a key of conf/step/{stage}.yaml; "
                              f"use one of {sorted(k for k in new.step if k != 'name')}")
        if "name" in extra and extra.name != stage:
            raise ConfigError(f"stages.{stage}.name={extra.name} cannot rename the stage")
        new = OmegaConf.merge(new, {"step": extra})
    epochs, scale = stage_schedule(new.step, stage)
    if epochs is None and scale == 1.0:
        return new
    if new is cfg:
        new = OmegaConf.merge(cfg, {})  # a copy (keeps interpolations and the struct flag)
    if epochs is not None:
        new.trainer.epochs = epochs
    new.optim.lr = float(cfg.optim.lr) * scale
    return new


def _resolved(cfg: DictConfig) -> DictConfig:
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


def run(cfg: DictConfig) -> list[dict[str, Any]]:
    """Run the stages; a user error (bad config/data/checkpoint, NaN loss) becomes one line on
    stderr and exit status 1 instead of a traceback (HYDRA_FULL_ERROR=1 shows the traceback)."""
    from launchers.errors import user_error_line
    from launchers.malloc import tune_malloc
    from launchers.objective import with_objective
    from launchers.sweep_summary import run_guarded

    tune_malloc()  # again here: submitit/SLURM jobs reach run() without run.py's top level
    try:
        # Multirun: a failing job returns a "failed" result instead of raising, so the other jobs
        # still run and the sweep table shows it (launchers/sweep_summary.py).
        # With an `objective` (searches): float() of the result is the metric (launchers/objective.py).
        return with_objective(cfg, run_guarded(_run, cfg))
    except Exception as e:
        from launchers.spawn import RankFailedError

        line = user_error_line(e)
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if line is None and isinstance(e, RankFailedError):
            # Its message is the failing rank's own traceback (or how it died); the parent's
            # frames (run_ranks waiting on the workers) would only bury it.
            text = str(e)
            log.error("%s", text.splitlines()[0])  # the run log gets the headline; rank*.log has it all
            raise SystemExit(text) from None  # stderr, status 1
        if line is None:
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
    stages = list(cfg.pipeline) or [cfg.step.name]
    # Resolve once per stage, here: workers get plain values (no Hydra resolvers in spawned
    # processes), and each stage's epochs/lr_scale are in place before interpolations resolve.
    configs = [_resolved(stage_config(cfg, s)) for s in stages]
    preflight(configs[0])  # before any process is spawned
    results = []
    for s, scfg in zip(stages, configs):
        if scfg.step.train:
            log.info("=== %s ===  %d epochs, lr %g", s, scfg.trainer.epochs, scfg.optim.lr)
        else:
            log.info("=== %s ===  one pass, no training", s)
        results.append(run_ranks(scfg, run_dir, run_stage))
    from launchers.env import detect

    if detect().rank == 0:  # under torchrun/SLURM every rank gets here with rank 0's results
        print_summary(results, cfg, run_dir)
    return results
