"""What `python run.py` does once Hydra has composed the config."""
from __future__ import annotations

import logging
import os
from functools import partial
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from launchers.hydra_app.job import is_multirun, run_guarded
from launchers.hydra_app.objective import with_objective
from launchers.hydra_app.one_run import folder_lock
from launchers.hydra_app.optuna_trial import HOOK, is_trial, trial_hook
from launchers.hydra_app.user_error_line import user_error_line
from launchers.processes.env import ProcessEnv, detect
from launchers.processes.malloc import tune_malloc
from launchers.processes.rank_ends import RankFailedError
from launchers.processes.spawn import run_ranks
from launchers.reports.run_summary import print_summary
from launchers.reports.stop_line import SEARCH_RERUN, stop_line, sweep_rerun
from mdk import faults
from mdk.config import validate
from mdk.engine.result import StageResult
from mdk.engine.runner import stage_on_rank
from mdk.paths import register_resolvers
from mdk.preflight import preflight, train_images
from mdk.stage import StageSpec, stage_config
from mdk.stage_config import running_stages
from mdk.stop import StopRequested, stop_requested

log = logging.getLogger(__name__)


def _resolved(cfg: DictConfig) -> DictConfig:
    return OmegaConf.create(OmegaConf.to_container(cfg, resolve=True))


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
        if os.environ.get("HYDRA_FULL_ERROR") == "1":
            raise
        if line is None and isinstance(e, RankFailedError):
            # Its message is the rank's own traceback; the parent's frames would only bury it.
            text = str(e)
            log.error("%s", text.splitlines()[0])  # the run log gets the headline; rank*.log has it all
            raise SystemExit(text) from None  # stderr, status 1
        if line is None:
            raise
        log.error("%s", line)
        raise SystemExit(line) from None


def _sweep_name() -> str | None:
    """The sweep dir's name of a multirun job, for grouping metric sinks."""
    if not is_multirun():
        return None
    return Path(str(HydraConfig.get().sweep.dir)).name


def _run(cfg: DictConfig) -> list[StageResult]:
    register_resolvers()
    env = detect()
    validate(cfg, env.world_size if env.external else None)  # the real world under torchrun/SLURM
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    stages = running_stages(cfg)
    # Resolved here, once per stage: spawned workers have no Hydra resolvers, and each stage's
    # epochs/lr_scale must be in place before interpolations resolve.
    n_train = train_images(cfg) if any(stage_config(cfg, s).step.get("min_iters")
                                       for s in stages) else None
    configs = [_resolved(stage_config(cfg, s, n_train)) for s in stages]
    trial = trial_hook(cfg, stages)
    if trial is not None and trial[0] in stages:
        configs[stages.index(trial[0])].trainer.hooks[HOOK] = trial[1]
    preflight(configs[0], run_dir)
    with folder_lock(configs[0], env, run_dir):
        return _run_stages(cfg, env, run_dir, stages, configs)


def _run_stages(cfg: DictConfig, env: ProcessEnv, run_dir: Path, stages: list[str],
                configs: list[DictConfig]) -> list[StageResult]:
    faults.at("start")
    results: list[StageResult] = []
    offset = 0  # metric sinks: one global step continuing across the stages of a pipeline
    group = _sweep_name()
    for s, scfg in zip(stages, configs):
        if StageSpec.from_node(scfg.step).trains:
            log.info("=== %s ===  %d epochs, lr %g", s, scfg.trainer.epochs, scfg.optim.lr)
        else:
            log.info("=== %s ===  one pass, no training", s)
        try:
            res = StageResult.from_dict(
                run_ranks(scfg, run_dir, partial(stage_on_rank, step_offset=offset, group=group)))
        except StopRequested as e:
            e.stage = e.stage or s
            raise
        offset += res.iterations
        results.append(res)
        if stop_requested() is not None and s != stages[-1]:  # asked in the stage's last epoch
            raise StopRequested(str(stop_requested()), stage=s)
        if res.extra.get("stop_reason"):  # e.g. a search's pruner
            log.warning("%s ended after epoch %s of %d (%s); the stages after it do not run", s,
                        res.extra.get("stopped_epoch"), scfg.trainer.epochs,
                        res.extra["stop_reason"])
            break
    if env.rank == 0:  # under torchrun/SLURM every rank gets here with rank 0's results
        print_summary(results, cfg, run_dir)
    return results
