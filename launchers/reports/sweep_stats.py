"""Results over seeds: the aggregate a sweep with a seed axis prints after its per-job table.

Jobs are grouped by every swept key but ``seed``; per metric and stage each group gets n,
mean ± std, min and max over its completed jobs (failed or incomplete ones are counted as left
out). std is the *sample* one (n-1): the seeds are a sample of those one could have drawn. The
quantization bars are judged on the group means.
"""
from __future__ import annotations

import statistics
from collections import Counter
from typing import Any, Iterable, Optional

from launchers.reports.sweep_bars import Bar, check_bars, format_bar
from mdk.engine.result import StageResult

SEED_KEY = "seed"
STD = "sample, n-1"
# A stage result's numbers -> (mean/std format, min/max format).
METRICS: dict[str, tuple[str, str]] = {
    "best_map50": (".4f", ".4f"),
    "best_epoch": (".1f", ".0f"),
    "final_loss": (".4f", ".4f"),
    "time_s": (".1f", ".1f"),
}


def override_map(overrides: Optional[Iterable[str]]) -> dict[str, str]:
    """key -> value of a job's overrides; ``+seed`` and ``++seed`` count as ``seed``."""
    return {k.lstrip("+"): v for k, v in (str(o).split("=", 1) for o in overrides or [] if "=" in str(o))}


def compact_stages(stages: Any) -> list[dict[str, Any]]:
    """The numbers and quantization bar of each stage result in a result.json."""
    out = []
    for d in stages if isinstance(stages, list) else []:
        r = StageResult.from_dict(d)
        out.append({"stage": r.stage, **{m: r.value(m) for m in METRICS}, "bar": r.bar})
    return out


def _bars(rows: list[dict[str, Any]]) -> list[Bar]:
    """The bars the stages of these jobs declare, once each."""
    found: dict[str, Bar] = {}
    for r in rows:
        for s in r.get("stages") or []:
            if s.get("bar") and s["stage"] not in found:
                found[s["stage"]] = Bar.from_record(s["stage"], s["bar"])
    return list(found.values())


def _job_stages(row: dict[str, Any]) -> dict[str, dict[str, float]]:
    """stage -> metric -> value of one job (a stage run twice gets ``name#2``)."""
    stages = row.get("stages") or [{"stage": "job", **{m: row.get(m) for m in METRICS}}]
    out: dict[str, dict[str, float]] = {}
    for s in stages:
        name, k = s["stage"], 2
        while name in out:
            name, k = f"{s['stage']}#{k}", k + 1
        out[name] = {m: float(s[m]) for m in METRICS if isinstance(s.get(m), (int, float))}
    return out


def describe(values: list[float]) -> dict[str, Any]:
    """n, mean, sample std (None for n=1), min, max and the values."""
    return {"n": len(values), "mean": statistics.fmean(values),
            "std": statistics.stdev(values) if len(values) > 1 else None,
            "min": min(values), "max": max(values), "values": values}


def aggregate(rows: list[dict[str, Any]]) -> Optional[dict[str, Any]]:
    """The aggregate of ``rows`` (``collect_results``); None when the sweep has no seed axis."""
    # An unreadable result.json has no overrides: grouping it would make every key look swept.
    unplaced = [r["job"] for r in rows if not r.get("overrides")]
    rows = [r for r in rows if r.get("overrides")]
    maps = [override_map(r.get("overrides")) for r in rows]
    if len({m.get(SEED_KEY) for m in maps}) <= 1:  # no seed axis
        return None
    bars = _bars(rows)
    keys = list(dict.fromkeys(k for m in maps for k in m))  # in the order first seen
    group_by = [k for k in keys if k != SEED_KEY and len({m.get(k) for m in maps}) > 1]
    members: dict[tuple, list[int]] = {}
    for i, m in enumerate(maps):
        members.setdefault(tuple(m.get(k) for k in group_by), []).append(i)
    groups = []
    for values, idx in members.items():
        done = [i for i in idx if rows[i]["status"] == "completed"]
        per_job = [_job_stages(rows[i]) for i in done]
        stages: dict[str, dict[str, Any]] = {stage: {} for job in per_job for stage in job}
        for stage, metrics in stages.items():
            for m in METRICS:
                vals = [job[stage][m] for job in per_job if m in job.get(stage, {})]
                if vals:
                    metrics[m] = describe(vals)
        groups.append({
            "overrides": dict(zip(group_by, values)),
            "jobs": [rows[i]["job"] for i in idx],
            "seeds": [maps[i].get(SEED_KEY) for i in done],
            "completed": len(done),
            "left_out": dict(Counter(rows[i]["status"] for i in idx if i not in done)),
            "stages": stages,
            "bars": check_bars(bars, stages, per_job),
        })
    seeds = sorted({m[SEED_KEY] for m in maps if SEED_KEY in m},
                   key=lambda s: (not s.lstrip("-").isdigit(), int(s) if s.lstrip("-").isdigit() else 0, s))
    return {"seed_key": SEED_KEY, "seeds": seeds, "group_by": group_by, "std": STD,
            "metrics": list(METRICS), "groups": groups, "unplaced": unplaced}


def _label(group: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in group["overrides"].items()) or "all jobs"


def columns(head: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)]
    return ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]


def format_aggregate(agg: dict[str, Any]) -> str:
    groups, group_by = agg["groups"], agg["group_by"]
    lines = [f"over seeds ({agg['seed_key']}={','.join(agg['seeds'])}): n, mean ± std "
             f"(std: {agg['std']}), min, max of the completed jobs per metric and stage"
             + (f"; grouped by {', '.join(group_by)}" if group_by else "")]
    stage_order = list(dict.fromkeys(s for g in groups for s in g["stages"]))
    # Metric-major: every stage's mAP (what the bars and most sweeps compare) comes first.
    head = ["metric", "stage", *group_by, "n", "mean ± std", "min", "max", "left out"]
    body = []
    for m, (fmt, ext) in METRICS.items():
        for stage in stage_order:
            for g in groups:
                d = g["stages"].get(stage, {}).get(m)
                if d is None:
                    continue
                std = "-" if d["std"] is None else format(d["std"], fmt)
                body.append([m, stage, *[g["overrides"].get(k) or "-" for k in group_by], str(d["n"]),
                             f"{format(d['mean'], fmt)} ± {std}", format(d["min"], ext),
                             format(d["max"], ext), str(sum(g["left_out"].values()))])
    if body:
        lines += columns(head, body)
    for g in groups:
        out = sum(g["left_out"].values())
        if out:
            why = ", ".join(f"{n} {s}" for s, n in sorted(g["left_out"].items()))
            lines.append(f"{_label(g)}: {out} of {out + g['completed']} jobs left out ({why})"
                         + ("; nothing to average" if not g["completed"] else ""))
    if agg.get("unplaced"):
        lines.append(f"left out of every group: job {', '.join(agg['unplaced'])} (its result.json "
                     f"gives no overrides)")
    bars = [(g, b) for g in groups for b in g["bars"]]
    if bars:
        lines.append(f"quantization bars judged on the means over seeds ({bars[0][1]['metric']}):")
        for g, b in bars:
            first, *rest = format_bar(b)
            lines += [f"  {_label(g) + ': ' if group_by else ''}{first}", *[f"  {r}" for r in rest]]
    return "\n".join(lines)
