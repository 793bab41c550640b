"""What a run returns to a hyperparameter search: the stage results the sweep table reads, with
its objective (docs/cluster.md, "Searches": the value of a trial).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Union

from omegaconf import DictConfig

from mdk.engine.result import StageResult


PRUNED = "pruned"  # the start of a pruned trial's stop_reason


class StageResults(list):
    """A run's StageResults; ``objectives()`` (``float()`` for one) are the search's values."""

    def __init__(self, results: Sequence[StageResult], stages: Sequence[str],
                 metric: Union[str, Sequence[str]], stage: Optional[str] = None) -> None:
        super().__init__(results)
        self.stages, self.stage = list(stages), stage
        self.metric = metric if isinstance(metric, str) else [str(m) for m in metric]

    @property
    def stop_reason(self) -> Optional[str]:
        """Why a stage ended training early; None if none did."""
        return next((r.extra["stop_reason"] for r in self if r.extra.get("stop_reason")), None)

    def objectives(self) -> list[float]:
        names = [self.metric] if isinstance(self.metric, str) else self.metric
        return [self.objective(n) for n in names]

    def objective(self, metric: str) -> float:
        """The metric of the chosen stage; ValueError (the trial fails) if missing or not finite."""
        if self.stage is not None and self.stage not in self.stages:
            raise ValueError(f"objective.stage={self.stage} did not run (stages: "
                             f"{', '.join(self.stages)}); pick one of them or null")
        scored = [(r.stage, r.value(metric)) for r in self
                  if self.stage in (None, r.stage) and r.value(metric) is not None]
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
        return self.objective(self.metric)


class FailedRun(dict):
    """A failed run's record (``run_guarded``); ``float()`` refuses it, so the trial is FAIL."""

    def __str__(self) -> str:  # one line when logged
        return f"run failed: {str(self.get('error', '')).splitlines()[0] if self.get('error') else '?'}"


def with_objective(cfg: DictConfig, result: Any) -> Any:
    """``result`` with the objective attached when the config has an ``objective`` node."""
    obj = cfg.get("objective")
    if obj is None:
        return result
    if isinstance(result, dict) and result.get("status") == "failed":
        return FailedRun(result)
    if not isinstance(result, (list, tuple)):
        return result
    stages = list(cfg.pipeline) or [cfg.step.name]
    return StageResults(result, stages, obj.metric, obj.get("stage"))
