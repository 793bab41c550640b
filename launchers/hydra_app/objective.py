"""What a run returns to a hyperparameter search: one number, read from the stage results.

``python run.py -m hparams_search=<name>`` runs an Optuna study through hydra-optuna-sweeper
(conf/hparams_search/). The sweeper takes ``float(job return value)`` as the trial's value, so a
run returns its stage results as a ``StageResults``: the list of ``StageResult`` records that the
sweep table reads (launchers/reports/sweep_results.py), and ``float()`` of it is the
objective, ``objective.metric`` of stage ``objective.stage`` (null: the last stage that reports
the metric, e.g. step3 in ``pipeline=[step1,step2,cal,step3]``).

Failed trials, measured with hydra-optuna-sweeper 1.3.0 and optuna 2.10.1:

* a value ``float()`` rejects (TypeError/ValueError) is told to the study as FAIL and the study
  goes on; that is what a failed run returns here (``FailedRun``: the failure record the table
  shows) and what a run without a usable metric raises;
* NaN must never reach the sweeper: ``study.tell(nan)`` raises, the sweeper then tells FAIL *with*
  the value, which raises again ("Values cannot be specified when state is FAIL") and ends the
  whole study with the trial left RUNNING. So a NaN or infinite metric raises ValueError here;
* a job that raises (its JobReturn holds the exception) is also FAIL, but then the sweeper
  re-raises it once the failures of a batch exceed ``max_failure_rate``: our runs never raise in a
  sweep (``run_guarded``), and the shipped configs set ``max_failure_rate: 1.0``.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence

from omegaconf import DictConfig

from mdk.engine.result import StageResult


class StageResults(list):
    """The StageResults of a run; ``float()`` gives the search objective."""

    def __init__(self, results: Sequence[StageResult], stages: Sequence[str], metric: str,
                 stage: Optional[str] = None) -> None:
        super().__init__(results)
        self.stages, self.metric, self.stage = list(stages), metric, stage

    def objective(self) -> float:
        """The metric of the chosen stage; ValueError (the trial fails) if missing or not finite."""
        pairs = [(r.stage, r) for r in self]
        if self.stage is not None:
            if self.stage not in self.stages:
                raise ValueError(f"objective.stage={self.stage} did not run (stages: "
                                 f"{', '.join(self.stages)}); pick one of them or null")
            pairs = [(s, r) for s, r in pairs if s == self.stage]
        scored = [(s, r.value(self.metric)) for s, r in pairs if r.value(self.metric) is not None]
        if not scored:
            where = f"stage {self.stage}" if self.stage else f"stages {', '.join(self.stages)}"
            raise ValueError(f"objective.metric={self.metric}: no value in the results of {where}")
        stage, value = scored[-1]
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"objective.metric={self.metric} of {stage} is {value}")
        return value

    def __float__(self) -> float:
        return self.objective()


class FailedRun(dict):
    """A failed run's record (``run_guarded``); ``float()`` refuses it, so the trial is FAIL."""

    def __str__(self) -> str:  # the sweeper logs the value it could not use: keep it one line
        return f"run failed: {str(self.get('error', '')).splitlines()[0] if self.get('error') else '?'}"


def with_objective(cfg: DictConfig, result: Any) -> Any:
    """What ``launchers.hydra_app.entry.run`` returns: ``result`` with the objective attached when
    the config has an ``objective`` node (conf/config.yaml), else ``result`` itself."""
    obj = cfg.get("objective")
    if obj is None:
        return result
    if isinstance(result, dict) and result.get("status") == "failed":
        return FailedRun(result)
    if not isinstance(result, (list, tuple)):
        return result
    stages = list(cfg.pipeline) or [cfg.step.name]
    return StageResults(result, stages, str(obj.metric), obj.get("stage"))
