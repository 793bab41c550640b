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
from mdk.engine.runner import run_stages
from mdk.folder_lock import one_run
from mdk.paths import register_resolvers
from mdk.preflight import preflight, train_images
from mdk.stage import config_for_stage
from mdk.checkpoint.layout import checkpoint_root
from mdk.stage_config import running_stages
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
        group = Path(str(HydraConfig.get().sweep.dir)).name if is_multirun() else None
        results: list[StageResult] = []
        for part in same_world(configs):  # one start of the ranks for all the stages of a world
            if results and results[-1].extra.get("stop_reason"):  # e.g. a search's pruner
                break
            if results and stop_requested() is not None:  # asked in the last stage's last epoch
                raise StopRequested(str(stop_requested()), stage=results[-1].stage)
            run = partial(run_stages, stages=[OmegaConf.to_container(configs[i]) for i in part],
                          step_offset=sum(r.iterations for r in results), group=group)
            try:
                out = run_ranks(configs[part[0]], run_dir, run)
            except StopRequested as e:
                e.stage = e.stage or stages[part[0]]
                raise
            # (a machine other than 0 has no results: one placeholder per stage)
            results += [StageResult.from_dict(d) for d in out.get("stages") or
                        [{**out, "stage": stages[i]} for i in part]]
        if env.rank == 0:  # under torchrun/SLURM every rank gets here with rank 0's results
            print_summary(results, cfg, run_dir)
        return results


def same_world(configs: list[DictConfig]) -> list[list[int]]:
    """The stages (indices) in runs of consecutive stages that run in one world: the same
    ``dist`` settings and device. Each run starts the ranks once; a stage whose world differs from
    the one before (its own ``dist.gpus``, say) needs ranks of its own, started after."""
    parts: list[list[int]] = []
    keys: list[str] = []
    for i, c in enumerate(configs):
        key = OmegaConf.to_yaml({"dist": c.dist, "device": c.trainer.device})
        if keys and keys[-1] == key:
            parts[-1].append(i)
        else:
            parts.append([i])
            keys.append(key)
    return parts
