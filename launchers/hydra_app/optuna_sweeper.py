"""``hydra/sweeper=mdk_optuna``: an Optuna study on the ask-and-tell API, each trial one job of
the configured launcher (keys and behaviour: docs/cluster.md, "Searches"). Trial N is job N, so
its job dir is never another trial's; a thread per running job waits on the launcher.
"""
from __future__ import annotations

import logging
import math
import threading
from concurrent.futures import FIRST_COMPLETED, Future, wait
from pathlib import Path
from typing import Any, Optional

from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from launchers.hydra_app.hydra_internals import BasicLauncher
from launchers.hydra_app.job_ends import JobsEndedError
from launchers.hydra_app.objective import PRUNED, StageResults
from launchers.hydra_app.optuna_space import SearchSpace, search_space, value_text
from launchers.hydra_app.optuna_study import (JOB_DIR, claim_sweep_dir, directions, fail_stale_trials,
                                              finished, group_node, make_pruner,
                                              open_storage, record_in_job, storage_url,
                                              write_best)
from launchers.reports.stop_line import SEARCH_RERUN
from launchers.reports.sweep_results import RESULT
from mdk.targets import build
from mdk.errors import ConfigError
from mdk.stop import StopRequested

log = logging.getLogger(__name__)


class SearchConfigError(SystemExit):
    """A search's config is wrong (a SystemExit: one line, not Hydra's traceback)."""


class SearchFailedError(SystemExit):
    """More trials failed than ``max_failure_rate`` allows; the study stopped asking for more."""


class SearchSweeper(Sweeper):
    """Declared for Hydra in launchers/plugins/hydra_plugins/mdk_optuna.py."""

    def __init__(self, sampler: Any = None, pruner: Any = None, direction: Any = "maximize",
                 study_name: Optional[str] = None, storage: Optional[str] = None,
                 n_trials: int = 20, n_jobs: int = 1, params: Any = None,
                 max_failure_rate: float = 1.0) -> None:
        self.sampler_node, self.pruner_node, self.direction = sampler, pruner, direction
        self.study_name, self.storage = study_name, storage
        self.n_trials, self.n_jobs, self.params = int(n_trials), int(n_jobs), params
        self.max_failure_rate = float(max_failure_rate)

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction,
              config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        try:
            return self._sweep(arguments)
        except ConfigError as e:
            raise SearchConfigError(f"config error: {e}") from None
        except SearchFailedError:
            context = getattr(self, "hydra_context", None)
            if context is not None:  # the table first: Hydra prints it only after a sweep returns
                context.callbacks.on_multirun_end(config=self.config)
            raise
        except StopRequested as e:  # a stop signal: the trials left RUNNING run again on a rerun
            e.line = getattr(e, "line", None) or (
                f"stopped by {e.reason} while the study's trials ran; trial jobs that did not get "
                f"the signal run on (on SLURM: squeue, scancel); {SEARCH_RERUN}")
            raise

    # --- the study ---------------------------------------------------------------------------
    def _sweep(self, arguments: list[str]) -> list[JobReturn]:
        import optuna  # optuna: only when searching (Hydra imports this plugin at every start)

        sweep_dir = Path(str(self.config.hydra.sweep.dir)).absolute()
        with read_write(self.config.hydra.sweep), open_dict(self.config.hydra.sweep):
            self.config.hydra.sweep.dir = str(sweep_dir)  # jobs on other nodes/cwds: absolute
        space = search_space(_plain(self.params), arguments)
        dirs = directions(_plain(self.direction))
        pruner = make_pruner(self.pruner_node)
        metric = _plain(OmegaConf.select(self.config, "objective.metric"))
        n_metrics = 1 if isinstance(metric, str) else len(metric or [])
        if metric is not None and n_metrics != len(dirs):  # before any trial trains
            raise ConfigError(f"objective.metric={metric} gives {n_metrics} value(s) for the "
                              f"{len(dirs)} of hydra.sweeper.direction={dirs}; give one metric "
                              "per direction")
        if len(dirs) > 1 and not isinstance(pruner, optuna.pruners.NopPruner):
            raise ConfigError("hydra.sweeper.pruner: Optuna cannot prune a study of several "
                              "objectives; use hydra/sweeper/pruner=none with a direction list")
        name = str(self.study_name or self.config.hydra.job.name)
        url = storage_url(self.storage, sweep_dir)
        claim_sweep_dir(sweep_dir, name, url)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        study = optuna.create_study(study_name=name, storage=open_storage(url),
                                    sampler=self._sampler(space), pruner=pruner,
                                    directions=dirs, load_if_exists=True)
        if [d.name.lower() for d in study.directions] != dirs:
            raise ConfigError(f"hydra.sweeper.direction={dirs} but study {name!r} in {url} was "
                              f"made with {[d.name.lower() for d in study.directions]}; give "
                              "another study_name or hydra.sweep.dir")
        earlier = len(study.get_trials(deepcopy=False))  # a resumed study: its sampler goes on
        if earlier:
            study.sampler = self._sampler(space, earlier) or study.sampler
        for number, note in fail_stale_trials(study).items():
            record_in_job(study.get_trials(deepcopy=False)[number], note)  # numbered 0, 1, ...
        before = len(finished(study))
        log.info("study %s (%s): %d of %d trials done, %d to run, up to %d at a time", name, url,
                 before, self.n_trials, max(0, self.n_trials - before), self._slots())
        try:
            return self._run_trials(study, space, [f"hydra.sweeper.study_name={value_text(name)}",
                                                   f"hydra.sweeper.storage={value_text(url)}"])
        finally:  # also when too many failed or a signal stopped it: the best trial so far
            write_best(study, sweep_dir / "optimization_results.yaml", dirs)

    def _sampler(self, space: SearchSpace, trials_before: int = 0) -> Any:
        node = group_node(self.sampler_node, "sampler")
        if node is None or not node.get("_target_"):
            return None  # Optuna's default (TPE; NSGA-II for several objectives)
        extra: dict[str, Any] = {}
        if trials_before and node.get("seed") is not None:
            # A continued study: the same seed would draw the first trials' values again.
            extra["seed"] = int(node.seed) + trials_before
        if str(node._target_).endswith("GridSampler"):
            if len(space.choices()) != len(space.distributions):
                raise ConfigError("hydra/sweeper/sampler=grid searches choice() parameters only "
                                  f"(not: {sorted(set(space.distributions) - set(space.choices()))})")
            extra["search_space"] = space.choices()
        return build(node, "hydra.sweeper.sampler", **extra)

    def _slots(self) -> int:
        if isinstance(self.launcher, BasicLauncher):
            if self.n_jobs > 1:
                log.info("hydra.sweeper.n_jobs=%d with the basic launcher: one trial at a time in "
                         "this process (hydra/launcher=submitit_local or submitit_slurm runs them "
                         "side by side)", self.n_jobs)
            return 1
        return max(1, self.n_jobs)

    # --- the trials --------------------------------------------------------------------------
    def _run_trials(self, study: Any, space: SearchSpace, hydra_args: list[str]) -> list[JobReturn]:
        slots, returns, failed, told = self._slots(), [], 0, 0
        running: dict[Future, Any] = {}
        while True:
            done = len(finished(study))
            while (len(running) < slots and done + len(running) < self.n_trials
                   and failed <= self.max_failure_rate * max(told, 1)):
                trial = study.ask(space.distributions)
                overrides = space.overrides(trial.params) + hydra_args
                trial.set_user_attr(JOB_DIR, self._job_dir(study, trial, overrides))
                running[self._start(slots > 1, overrides, trial.number)] = trial
            if not running:
                break
            for fut in wait(running, return_when=FIRST_COMPLETED)[0]:
                trial = running.pop(fut)
                ret, state = self._tell(study, trial, fut)
                returns += [ret] if ret is not None else []
                told, failed = told + 1, failed + (state == "FAIL")
        if failed > self.max_failure_rate * max(told, 1):
            raise SearchFailedError(f"{failed} of {told} trials failed, more than "
                                    f"hydra.sweeper.max_failure_rate={self.max_failure_rate}: the "
                                    "study stopped asking for trials (see the table above)")
        return returns

    def _job_dir(self, study: Any, trial: Any, overrides: list[str]) -> str:
        """The trial's job dir, which must not hold an earlier job; a config that does not
        compose fails the trial here."""
        import optuna  # optuna: only when searching (see _sweep)

        try:
            cfg = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
            with open_dict(cfg.hydra.job):
                cfg.hydra.job.num = trial.number
            sub = OmegaConf.select(cfg, "hydra.sweep.subdir", default=str(trial.number))
        except Exception:
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            log.error("trial %d does not compose: %s", trial.number, " ".join(overrides))
            raise
        job_dir = Path(str(self.config.hydra.sweep.dir)) / str(sub)
        if (job_dir / RESULT).exists():
            study.tell(trial, state=optuna.trial.TrialState.FAIL)
            raise ConfigError(f"hydra.sweep.subdir gives trial {trial.number} the job dir "
                              f"{job_dir}, which holds an earlier job; keep ${{hydra.job.num}} in "
                              "hydra.sweep.subdir (trial N is job N)")
        return str(job_dir)

    def _start(self, aside: bool, overrides: list[str], num: int) -> Future:
        """Launch trial ``num``'s job and wait for it, in a daemon thread when ``aside`` (a stop of
        this process does not wait for jobs that run on), else in this thread."""
        fut: Future = Future()

        def launch() -> None:
            try:
                fut.set_result(self.launcher.launch([overrides], num)[0])
            except BaseException as e:  # _tell fails the trial; a stop signal: raised below
                fut.set_exception(e)

        if aside:
            threading.Thread(target=launch, name=f"trial-{num}", daemon=True).start()
            return fut
        launch()
        err = fut.exception()
        if err is not None and not isinstance(err, (Exception, JobsEndedError)):
            raise err  # a stop signal to this process (StopRequested): the sweep ends here
        return fut

    def _tell(self, study: Any, trial: Any, fut: Future) -> tuple[Optional[JobReturn], str]:
        """Tell the study how the trial's job ended, and record it in the job's result.json."""
        import optuna  # optuna: only when searching (see _sweep)

        state, values, note, ret = optuna.trial.TrialState.FAIL, None, None, None
        try:
            ret = fut.result()
        except JobsEndedError as e:  # killed, cancelled or stopped by a signal: no result
            note = "its job returned no result: " + "; ".join(
                line.split("; rerun")[0] for line in e.lines)[:300]
        except Exception as e:  # the launcher lost the job
            note = f"the job did not return: {type(e).__name__}: {str(e).splitlines()[0][:300]}"
        if ret is not None and ret.status == JobStatus.COMPLETED:
            value = ret.return_value
            stop = getattr(value, "stop_reason", None)
            if stop and stop.startswith(PRUNED):
                state = optuna.trial.TrialState.PRUNED
            elif stop:
                note = f"the run stopped early: {stop}"
            else:
                try:
                    values = _objective_values(value)
                    state = optuna.trial.TrialState.COMPLETE
                except (TypeError, ValueError) as e:
                    note = str(e) if not isinstance(value, dict) else None
        elif ret is not None:
            note = f"the job raised {type(ret._return_value).__name__}: {ret._return_value}"
        if values is not None and len(values) != len(study.directions):
            note = (f"objective.metric gives {len(values)} value(s) for "
                    f"{len(study.directions)} direction(s) of hydra.sweeper.direction")
            state, values = optuna.trial.TrialState.FAIL, None
        frozen = study.tell(trial, values=values, state=state)
        record_in_job(frozen, note)
        steps = sorted(frozen.intermediate_values)
        log.info("trial %d %s%s%s%s", trial.number, state.name, f" {values}" if values else "",
                 f" at epoch {steps[-1]}" if steps else "", f": {note}" if note else "")
        return ret, state.name


def _plain(node: Any) -> Any:
    return OmegaConf.to_container(node) if OmegaConf.is_config(node) else node


def _objective_values(value: Any) -> list[float]:
    """The trial's values: a run's objective metrics, or a plain number."""
    values = value.objectives() if isinstance(value, StageResults) else [float(value)]
    if not all(math.isfinite(v) for v in values):
        raise ValueError(f"the objective is not finite: {values}")
    return values
