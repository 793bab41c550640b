"""A sweep's job records (each job's ``result.json``) and its closing table, one row per job. In a
search the sweeper adds a ``trial`` record, and the table shows its state, value and epoch."""
from __future__ import annotations

import json
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any, Optional

from launchers.reports.sweep_stats import columns, compact_stages
from mdk.engine.result import StageResult
from mdk.errors import error_line

RESULT = "result.json"


def failure_record(e: BaseException) -> dict[str, Any]:
    """A job that raised ``e``: its error as the command line would say it (a user error's
    ``<label>: <message>``, anything else ``<type>: <message>``) and its traceback."""
    tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    return {"status": "failed", "error": error_line(e) or f"{type(e).__name__}: {e}",
            "traceback": tb}


def job_record(ret: Any, overrides: list[str], started: float) -> dict[str, Any]:
    """What result.json holds for a job that returned ``ret`` (results, a failure, or an error)."""
    rec: dict[str, Any] = {"overrides": overrides, "wall_s": round(time.time() - started, 1)}
    if isinstance(ret, BaseException):
        return {**rec, **failure_record(ret)}
    if isinstance(ret, dict) and ret.get("status") == "failed":
        return {**rec, **ret}
    stages: list[StageResult] = list(ret) if isinstance(ret, (list, tuple)) else []
    scored = [s for s in stages if s.best_map50 is not None]
    losses = [s.final_loss for s in stages if s.final_loss is not None]
    times = [s.time_s for s in stages if s.time_s is not None]
    stopped = [s for s in stages if s.extra.get("stop_reason")]
    if stopped:
        why = str(stopped[-1].extra["stop_reason"])
        rec.update(status="pruned" if why.startswith("pruned") else "stopped", stop_reason=why,
                   stopped_epoch=stopped[-1].extra.get("stopped_epoch"))
    return {"status": "completed", **rec, "stages": [s.to_dict() for s in stages],
            "best_map50": scored[-1].best_map50 if scored else None,
            "final_loss": losses[-1] if losses else None,
            "time_s": round(sum(times), 1) if times else rec["wall_s"]}


def collect_results(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job dir with a result.json, in job order; ``running`` reads ``incomplete``
    (killed hard)."""
    rows = []
    for p in Path(sweep_dir).glob(f"*/{RESULT}"):
        try:
            rec = json.loads(p.read_text())
        except (ValueError, OSError) as e:
            rec = {"status": "unreadable", "error": f"{p}: {e}"}
        status = rec.get("status", "unknown")
        rows.append({"job": p.parent.name, "dir": str(p.parent),
                     "status": "incomplete" if status == "running" else status,
                     **{k: rec.get(k) for k in ("overrides", "best_map50", "final_loss", "time_s",
                                                 "attempts", "job_id", "error", "trial",
                                                 "stopped_epoch")},
                     "stages": compact_stages(rec.get("stages"))})
    return sorted(rows, key=lambda r: (not r["job"].isdigit(), int(r["job"]) if r["job"].isdigit() else 0, r["job"]))


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def _trial_cells(r: dict[str, Any]) -> tuple[str, str, str]:
    """(status, value, epoch) of a trial's row."""
    t = r["trial"]
    vals = t.get("values") or []
    value = " ".join(format(v, ".4g") for v in vals) if vals else "-"
    epoch = t.get("epoch") if t.get("epoch") is not None else r.get("stopped_epoch")
    status = f"{t['state']} (trial {t['number']})"
    if t.get("retry_of") is not None:
        status += f", retry of {t['retry_of']}"
    if t.get("note"):
        status += f": {t['note']}"
    return status, value, "-" if epoch is None else str(epoch)


def format_table(rows: list[dict[str, Any]], sweep_dir: Path) -> str:
    # A column per key whose value differs between jobs; the overrides all jobs share below.
    maps = [dict(o.split("=", 1) for o in (r.get("overrides") or []) if "=" in o) for r in rows]
    keys = list(dict.fromkeys(k for m in maps for k in m))  # in the order first seen
    varying = [k for k in keys if len({m.get(k) for m in maps}) > 1]
    common = [f"{k}={maps[0][k]}" for k in keys if k not in varying and k in maps[0]]
    search = any(r.get("trial") for r in rows)
    head = ["job", *varying, "best mAP@0.5", "final loss", *(["value", "epoch"] if search else []),
            "time s", "status"]
    body = []
    for r, m in zip(rows, maps):
        status = r["status"] + (f" ({r['attempts']} runs)" if (r.get("attempts") or 1) > 1 else "")
        extra = []
        if search:
            status, value, epoch = _trial_cells(r) if r.get("trial") else (status, "-", "-")
            extra = [value, epoch]
        if r.get("error"):
            status += f": {str(r['error']).splitlines()[0][:120]}"
        body.append([r["job"], *[m.get(k, "-") for k in varying], _fmt(r.get("best_map50"), ".4f"),
                     _fmt(r.get("final_loss"), ".4f"), *extra, _fmt(r.get("time_s"), ".1f"),
                     status])
    lines = columns(head, body)
    if search:
        states = Counter(r["trial"]["state"] for r in rows if r.get("trial"))
        lines.append(", ".join(f"{n} {k}" for k, n in sorted(states.items())) +
                     f" of {len(rows)} trials; sweep dir: {sweep_dir}")
    else:
        done = sum(r["status"] == "completed" for r in rows)
        lines.append(f"{done}/{len(rows)} jobs completed; sweep dir: {sweep_dir}")
    if common:
        lines.append("all jobs: " + " ".join(common))
    return "\n".join(lines)
