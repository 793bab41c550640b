"""What a run returns to a hyperparameter search: its objective, read from the stage results.

``python run.py -m hparams_search=<name>`` runs an Optuna study (``hydra/sweeper=mdk_optuna``,
launchers/hydra_app/optuna_sweeper.py; conf/hparams_search/). A run returns its stage results as
a ``StageResults``: the list of ``StageResult`` records that the sweep table reads
(launchers/reports/sweep_results.py), and ``objectives()`` are the trial's values,
``objective.metric`` (one name, or a list for a study of several directions) of stage
``objective.stage`` (null: the last stage that reports the metric, e.g. step3 in
``pipeline=[step1,step2,cal,step3]``); ``float()`` is the one value of a single objective.

What the sweeper tells the study:

* a run its trial's pruner stopped (``stop_reason`` starts with ``pruned``): PRUNED, at the last
  value it reported;
* a failed run (``FailedRun``: the failure record the table shows), a run without a usable metric
  and a NaN or infinite metric (``objectives`` raises ValueError): FAIL, and the study goes on;
* our runs never raise in a sweep (``run_guarded``); a job that does is FAIL too.
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

from omegaconf import DictConfig

from mdk.engine.result import StageResult


PRUNED = "pruned"  # how a stop_reason of a trial its pruner stopped begins


class StageResults(list):
    """The StageResults of a run; ``objectives()`` (``float()`` for one) are the search's values."""

    def __init__(self, results: Sequence[StageResult], stages: Sequence[str],
                 metric: Union[str, Sequence[str]], stage: Optional[str] = None) -> None:
        super().__init__(results)
        self.stages, self.stage = list(stages), stage
        self.metric: Union[str, list[str]] = metric if isinstance(metric, str) else list(metric)

    @property
    def stop_reason(self) -> Optional[str]:
        """Why a stage ended training early (a trial's pruner: ``pruned ...``); None if none did."""
        return next((r.extra["stop_reason"] for r in self if r.extra.get("stop_reason")), None)

    def objectives(self) -> list[float]:
        """``objective.metric``'s value(s) of the chosen stage, one per metric."""
        names = [self.metric] if isinstance(self.metric, str) else self.metric
        return [self.objective(n) for n in names]

    def objective(self, metric: Optional[str] = None) -> float:
        """The metric of the chosen stage; ValueError (the trial fails) if missing or not finite."""
        metric = metric or (self.metric if isinstance(self.metric, str) else self.metric[0])
        pairs = [(r.stage, r) for r in self]
        if self.stage is not None:
            if self.stage not in self.stages:
                raise ValueError(f"objective.stage={self.stage} did not run (stages: "
                                 f"{', '.join(self.stages)}); pick one of them or null")
            pairs = [(s, r) for s, r in pairs if s == self.stage]
        scored = [(s, r.value(metric)) for s, r in pairs if r.value(metric) is not None]
        if not scored:
            where = f"stage {self.stage}" if self.stage else f"stages {', '.join(self.stages)}"
            raise ValueError(f"objective.metric={metric}: no value in the results of {where}")
        stage, value = scored[-1]
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"objective.metric={metric} of {stage} is {value}")
        return value

    def __float__(self) -> float:
        if not isinstance(self.metric, str):
            raise TypeError(f"objective.metric={self.metric} has several values; use objectives()")
        return self.objective()


class FailedRun(dict):
    """A failed run's record (``run_guarded``); ``float()`` refuses it, so the trial is FAIL."""

    def __str__(self) -> str:  # one line when logged
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
    metric = obj.metric if isinstance(obj.metric, str) else [str(m) for m in obj.metric]
    return StageResults(result, stages, metric, obj.get("stage"))
