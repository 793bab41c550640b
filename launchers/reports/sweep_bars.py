"""The quantization bars of the chip pipeline (a stage record's ``bar``), judged on the means over
seeds: one seed's number moves by more than the bars themselves, so the spread is reported too.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Optional

METRIC = "best_map50"
# A bar met exactly (0.87 vs 0.89 - 0.02) must not fail in the 17th digit of a float mean.
EPS = 1e-9


@dataclass(frozen=True)
class Bar:
    """``stage`` >= ``reference`` - ``tolerance`` (mAP@0.5 as a fraction, 0.02 = 2 points)."""

    stage: str
    reference: str
    tolerance: float

    def __str__(self) -> str:
        return f"{self.stage} >= {self.reference} - {self.tolerance:g} ({self.tolerance * 100:g} points)"

    @classmethod
    def from_record(cls, stage: str, bar: dict[str, Any]) -> "Bar":
        return cls(stage, str(bar["reference"]), float(bar["tolerance"]))


def check_bars(bars: list[Bar], stats: dict[str, dict[str, dict[str, Any]]],
               per_job: list[dict[str, dict[str, float]]]) -> list[dict[str, Any]]:
    """Each of ``bars`` whose two stages have numbers in ``stats`` (stage -> metric -> summary, as
    ``sweep_stats.describe`` makes), judged on the means. ``per_job`` (stage -> metric -> value,
    per completed job) gives the paired view: the difference seed by seed."""
    out = []
    for bar in bars:
        s, r = ((stats.get(stage) or {}).get(METRIC) for stage in (bar.stage, bar.reference))
        if s is None or r is None:
            continue
        threshold = r["mean"] - bar.tolerance
        diffs = [j[bar.stage][METRIC] - j[bar.reference][METRIC] for j in per_job
                 if j.get(bar.stage, {}).get(METRIC) is not None
                 and j.get(bar.reference, {}).get(METRIC) is not None]
        out.append({
            "bar": str(bar), "stage": bar.stage, "reference": bar.reference,
            "tolerance": bar.tolerance, "metric": METRIC,
            "met": s["mean"] - threshold >= -EPS,
            "stage_mean": s["mean"], "stage_std": s["std"], "stage_n": s["n"],
            "reference_mean": r["mean"], "reference_std": r["std"], "reference_n": r["n"],
            "threshold": threshold, "margin": s["mean"] - threshold,
            "diff_mean": statistics.fmean(diffs) if diffs else None,
            "diff_std": statistics.stdev(diffs) if len(diffs) > 1 else None,
            "met_per_seed": sum(d >= -bar.tolerance - EPS for d in diffs), "paired": len(diffs),
        })
    return out


def _pm(mean: float, std: Optional[float]) -> str:
    return f"{mean:.4f} ± {'-' if std is None else format(std, '.4f')}"


def format_bar(b: dict[str, Any]) -> list[str]:
    """The bar's verdict, both means and, when paired, the difference seed by seed."""
    lines = [f"{b['bar']}: {'met' if b['met'] else 'NOT met'}, margin {b['margin']:+.4f}",
             f"  means: {b['stage']} {_pm(b['stage_mean'], b['stage_std'])} (n={b['stage_n']}), "
             f"{b['reference']} {_pm(b['reference_mean'], b['reference_std'])} (n={b['reference_n']})"
             f" -> bar {b['threshold']:.4f}"]
    if b["paired"]:
        std = "-" if b["diff_std"] is None else format(b["diff_std"], ".4f")
        lines.append(f"  per seed: {b['stage']} - {b['reference']} {b['diff_mean']:+.4f} ± {std}, "
                     f"bar met in {b['met_per_seed']}/{b['paired']} seeds")
    return lines
