"""What a stage returns: one typed record for the run summary, a sweep's result.json, the seed
aggregate and a search's objective.

A stage's work returns a mapping of some of these fields; the stage runner adds the rest. Results
cross processes as ``to_dict()`` (JSON) and come back with ``from_dict``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional


@dataclass
class StageResult:
    stage: str
    checkpoints: Optional[str] = None     # the stage's checkpoint folder
    next: Optional[str] = None            # the stage that comes next (its record's ``next``)
    best_map50: Optional[float] = None    # val mAP@0.5 (``metric``) of the best evaluation
    best_epoch: Optional[int] = None      # 1-based epoch of that evaluation (training stages)
    final_loss: Optional[float] = None    # training loss at the end (cal: the val loss)
    iterations: int = 0                   # optimizer steps this stage has made in all
    metric: Optional[str] = None          # the name of the mAP (eval.metric), e.g. VOC07 11-point
    ap: Optional[list[float]] = None      # per-class AP of the best evaluation (nan: no objects)
    caps: Optional[list[float]] = None    # calibrated activation caps (cal)
    export: Optional[str] = None          # the exported chip model's folder (step4)
    time_s: Optional[float] = None        # wall time of the stage in this process
    bar: Optional[dict[str, Any]] = None  # the record's quantization bar (a sweep judges it)
    extra: dict[str, Any] = field(default_factory=dict)  # a custom work's own numbers

    @classmethod
    def fields(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "extra")

    @classmethod
    def from_work(cls, stage: str, out: Mapping[str, Any]) -> "StageResult":
        """A work function's mapping: known names become fields, any other goes to ``extra``."""
        known = set(cls.fields())
        extra = {k: v for k, v in out.items() if k not in known}
        return cls(**{**{k: v for k, v in out.items() if k in known}, "stage": stage},
                   extra=extra)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "StageResult":
        """Inverse of ``to_dict`` (what result.json and spawned ranks carry)."""
        extra = dict(d.get("extra") or {})
        rest = {k: v for k, v in d.items() if k not in cls.fields() and k != "extra"}
        return cls(**{k: d[k] for k in cls.fields() if k in d}, extra={**extra, **rest})

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def value(self, name: str) -> Any:
        """A field or an ``extra`` number by name (a search's ``objective.metric``)."""
        return getattr(self, name) if name in self.fields() else self.extra.get(name)
