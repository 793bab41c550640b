"""What `python run.py` does once Hydra has composed the config."""
from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from launchers.hydra_app.job import is_multirun, run_guarded
from launchers.hydra_app.objective import with_objective
from launchers.hydra_app.optuna_trial import HOOK, is_trial, trial_hook
from launchers.hydra_app.user_error_line import user_error_line
from launchers.processes.env import detect
from launchers.processes.malloc import tune_malloc
from launchers.processes.rank_ends import RankFailedError
from launchers.processes.spawn import run_ranks
from launchers.reports.run_summary import print_summary
from launchers.reports.stop_line import SEARCH_RERUN, stop_line, sweep_rerun
from mdk import faults
from mdk.config import validate
from mdk.data.class_names import fill_class_names
from mdk.engine.result import StageResult
from mdk.engine.runner import stage_on_rank
from mdk.folder_lock import one_run
from mdk.paths import register_resolvers
from mdk.preflight import preflight, train_images
from mdk.stage import config_for_stage
from mdk.checkpoint.layout import checkpoint_root
from mdk.stage_config import StageConf, running_stages
from mdk.stop import StopRequested, stop_requested

log = logging.getLogger(__name__)


def run(cfg: DictConfig) -> Any:
    """Run the stages; a user error becomes one line on stderr and exit status 1 instead of a
    traceback (unless HYDRA_FULL_ERROR=1)."""
    tune_malloc()  # again here: submitit/SLURM jobs reach run() without run.py's top level
    try:
        return with_objective(cfg, run_guarded(_run, cfg))
    except StopRequested as e:  # a stop signal: the command ends with this line (cli.py)
        multirun = is_multirun()
        rerun = sweep_rerun(str(HydraConfig.get().sweep.dir)) if multirun else None
        e.line = stop_line(e, SEARCH_RERUN if multirun and is_trial() else rerun)
        log.warning("%s", e.line)
        raise
    except Exception as e:
        line = user_error_line(e)
        full = os.environ.get("HYDRA_FULL_ERROR") == "1"
        if full or not (line or isinstance(e, RankFailedError)):
            raise
        # A failed rank's message is its own traceback (the parent's frames would only bury it):
        # the run log gets its headline (rank*.log has it all), stderr all of it, status 1.
        text = line or str(e)
        log.error("%s", line or text.splitlines()[0])
        raise SystemExit(text) from None


def _run(cfg: DictConfig) -> list[StageResult]:
    register_resolvers()
    env = detect()
    fill_class_names(cfg)  # a class list left out is read from the data, before any check
    validate(cfg, env.world_size if env.external else None)  # the real world under torchrun/SLURM
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    stages = running_stages(cfg)
    # Resolved here, once per stage: spawned workers have no Hydra resolvers, and each stage's
    # epochs/lr_scale must be in place before interpolations resolve.
    n_train = train_images(cfg) if any(config_for_stage(cfg, s).step.get("min_iters")
                                       for s in stages) else None
    configs = [OmegaConf.create(OmegaConf.to_container(config_for_stage(cfg, s, n_train),
                                                      resolve=True)) for s in stages]
    trial = trial_hook(cfg, stages)
    if trial is not None and trial[0] in stages:
        configs[stages.index(trial[0])].trainer.hooks[HOOK] = trial[1]
    preflight(configs[0], run_dir)
    # The lock on paths.checkpoints (mdk/folder_lock.py), held by the process that hosts rank 0,
    # which writes the checkpoints; under torchrun or SLURM by rank 0's task only, so the run's
    # other tasks do not compete for it (when it refuses, they stop at the rendezvous).
    holds_lock = (env.rank if env.external else int(cfg.dist.rank)) == 0
    with one_run(checkpoint_root(configs[0]), str(run_dir)) if holds_lock else nullcontext():
        faults.at("start")
        results: list[StageResult] = []
        offset = 0  # metric sinks: one global step continuing across the stages of a pipeline
        group = Path(str(HydraConfig.get().sweep.dir)).name if is_multirun() else None
        for s, scfg in zip(stages, configs):
            if StageConf.from_node(scfg.step).trains:
                length = (f"trainer.time={scfg.trainer.time}" if scfg.trainer.get("time")
                          else f"{scfg.trainer.epochs} epochs")
                log.info("=== %s ===  %s, lr %g", s, length, scfg.optim.lr)
            else:
                log.info("=== %s ===  one pass, no training", s)
            try:
                res = StageResult.from_dict(run_ranks(
                    scfg, run_dir, partial(stage_on_rank, step_offset=offset, group=group)))
            except StopRequested as e:
                e.stage = e.stage or s
                raise
            offset += res.iterations
            results.append(res)
            if stop_requested() is not None and s != stages[-1]:  # asked in its last epoch
                raise StopRequested(str(stop_requested()), stage=s)
            if res.extra.get("stop_reason"):  # e.g. a search's pruner
                log.warning("%s ended after epoch %s of %d (%s); the stages after it do not run",
                            s, res.extra.get("stopped_epoch"), scfg.trainer.epochs,
                            res.extra["stop_reason"])
                break
        if env.rank == 0:  # under torchrun/SLURM every rank gets here with rank 0's results
            print_summary(results, cfg, run_dir)
        return results
