"""The closing table of a Hydra sweep (``python run.py -m ...``): one row per job.

How it works, the same with every launcher (basic, submitit_local, submitit_slurm):

* each job writes ``<job dir>/result.json`` itself (Hydra callback ``on_job_start`` / ``on_job_end``
  run in the job's process, on the cluster node for SLURM): status ``running`` first, then
  ``completed`` or ``failed`` with the error. A job killed hard stays ``running``, which the
  table shows as ``incomplete``;
* a job that raises must not stop the sweep: ``run_guarded`` (called by
  ``launchers.hydra_app.entry``) turns the exception into a ``failed`` result in multirun mode.
  Without it Hydra's basic sweeper re-raises the first failure after the batch and never calls
  ``on_multirun_end``;
* ``on_multirun_end`` (launching process) reads every ``*/result.json`` under the sweep dir, prints
  the table (and, when a seed is swept, the aggregate over seeds of
  ``launchers.reports.sweep_stats``), saves ``sweep_summary.txt`` / ``sweep_summary.json`` there and
  raises ``SweepFailedError`` (a SystemExit: Hydra only warns about Exceptions raised in callbacks)
  when a job failed, so the command exits with status 1 after the table.

``on_multirun_start`` refuses a sweep dir that already holds a sweep's jobs (two sweeps started
in the same second share the default timestamped dir): pass another ``hydra.sweep.dir``, or
``hydra.callbacks.sweep.resume=true`` to continue that sweep (its jobs resume from last.pth).
"""
from __future__ import annotations

import json
import logging
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Optional

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from launchers.processes.env import detect
from launchers.reports.sweep_stats import aggregate, compact_stages, format_aggregate
from mdk.engine.result import StageResult

log = logging.getLogger(__name__)

RESULT = "result.json"


class SweepFailedError(SystemExit):
    """Some sweep jobs failed; the message lists them (the table is printed before).

    A SystemExit (exit status 1, message on stderr) because Hydra turns an Exception raised in a
    callback into a mere warning, and the command must fail when a job did."""


class SweepDirInUseError(SystemExit):
    """The sweep dir already holds another sweep's jobs (SystemExit: see SweepFailedError)."""


def is_multirun() -> bool:
    return HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN


def run_guarded(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """``fn(cfg)``; in a multirun a failure becomes a result instead of an exception.

    Caught: any Exception, and SystemExit carrying a message (config errors). Not caught:
    SystemExit with a code (submitit's requeue exit), KeyboardInterrupt, and
    ``mdk.stop.StopRequested`` (preemption): those must end the process."""
    if not is_multirun():
        return fn(cfg)
    try:
        return fn(cfg)
    except (Exception, SystemExit) as e:
        if isinstance(e, SystemExit) and not isinstance(e.code, str):
            raise
        log.error("job failed: %s", e, exc_info=True)
        return {"status": "failed", "error": f"{type(e).__name__}: {e}",
                "traceback": traceback.format_exc()}


def _rank() -> int:
    return detect().rank


def _write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1), encoding="utf-8")
    tmp.replace(path)


def job_record(ret: Any, overrides: list[str], started: float) -> dict[str, Any]:
    """What result.json holds for a job that returned ``ret`` (its StageResults, a failure, or
    an error)."""
    rec: dict[str, Any] = {"overrides": overrides, "wall_s": round(time.time() - started, 1)}
    if isinstance(ret, BaseException):
        tb = "".join(traceback.format_exception(type(ret), ret, ret.__traceback__))
        return {**rec, "status": "failed", "error": f"{type(ret).__name__}: {ret}", "traceback": tb}
    if isinstance(ret, dict) and ret.get("status") == "failed":
        return {**rec, **ret}
    stages: list[StageResult] = list(ret) if isinstance(ret, (list, tuple)) else []
    scored = [s for s in stages if s.best_map50 is not None]
    losses = [s.final_loss for s in stages if s.final_loss is not None]
    times = [s.time_s for s in stages if s.time_s is not None]
    return {**rec, "status": "completed", "stages": [s.to_dict() for s in stages],
            "best_map50": scored[-1].best_map50 if scored else None,
            "final_loss": losses[-1] if losses else None,
            "time_s": round(sum(times), 1) if times else rec["wall_s"]}


class SweepSummary(Callback):
    """Hydra callback (``hydra.callbacks.sweep`` in conf/config.yaml)."""

    def __init__(self, resume: bool = False, fail_on_error: bool = True) -> None:
        self.resume, self.fail_on_error = resume, fail_on_error
        self._started = time.time()

    # --- launching process -------------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        # multirun.yaml: Hydra writes it after this callback, so it marks any earlier sweep here.
        old = sorted(sweep_dir.glob(f"*/{RESULT}")) + sorted(sweep_dir.glob("multirun.yaml"))
        if old and not self.resume:
            raise SweepDirInUseError(
                f"hydra.sweep.dir={sweep_dir} already holds a sweep ({old[0]} exists); its "
                f"checkpoints would be reused or overwritten. Give a new hydra.sweep.dir, or add "
                f"hydra.callbacks.sweep.resume=true to continue that sweep")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        rows = collect_results(sweep_dir)
        text = format_table(rows, sweep_dir)
        agg = aggregate(rows)  # None unless the sweep has a seed axis
        if agg is not None:
            text += "\n\n" + format_aggregate(agg)
        log.info("sweep summary (%s)\n%s", sweep_dir / "sweep_summary.txt", text)
        (sweep_dir / "sweep_summary.txt").write_text(text + "\n", encoding="utf-8")
        _write(sweep_dir / "sweep_summary.json", {"sweep_dir": str(sweep_dir), "jobs": rows,
                                                  **({"aggregate": agg} if agg else {})})
        bad = [r for r in rows if r["status"] != "completed"]
        if bad and self.fail_on_error:
            raise SweepFailedError(
                f"{len(bad)} of {len(rows)} sweep jobs did not complete: "
                + "; ".join(f"#{r['job']} {r['status']}: {r.get('error') or r['dir']}" for r in bad)
                + f". Table: {sweep_dir / 'sweep_summary.txt'}")

    # --- job process -------------------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not is_multirun() or _rank() != 0:
            return
        self._started = time.time()
        path = Path(str(config.hydra.runtime.output_dir)) / RESULT
        attempts = 0
        if path.is_file():
            try:
                attempts = int(json.loads(path.read_text()).get("attempts", 0))
            except (ValueError, OSError):
                pass
        _write(path, {"status": "running", "overrides": _overrides(config),
                      "job_id": str(OmegaConf.select(config, "hydra.job.id")),
                      "attempts": attempts + 1, "started": self._started})

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not is_multirun() or _rank() != 0:
            return
        path = Path(str(config.hydra.runtime.output_dir)) / RESULT
        ret = job_return._return_value if job_return.status != JobStatus.UNKNOWN else None
        prev = json.loads(path.read_text()) if path.is_file() else {}
        rec = job_record(ret, _overrides(config), self._started)
        _write(path, {**rec, "job_id": prev.get("job_id"), "attempts": prev.get("attempts", 1)})


def _overrides(config: DictConfig) -> list[str]:
    return [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task)]  # type: ignore[union-attr]


def collect_results(sweep_dir: Path) -> list[dict[str, Any]]:
    """One row per job dir with a result.json, in job-number order; ``running`` -> ``incomplete``.

    ``stages`` holds each stage's numbers (``sweep_stats.compact_stages``) for the seed aggregate."""
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
                                                 "attempts", "job_id", "error")},
                     "stages": compact_stages(rec.get("stages"))})
    return sorted(rows, key=lambda r: (not r["job"].isdigit(), int(r["job"]) if r["job"].isdigit() else 0, r["job"]))


def _swept(rows: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """(keys whose value differs between jobs, overrides all jobs share)."""
    maps = [dict(o.split("=", 1) for o in (r.get("overrides") or []) if "=" in o) for r in rows]
    keys: list[str] = []
    for m in maps:
        keys += [k for k in m if k not in keys]
    varying = [k for k in keys if len({m.get(k) for m in maps}) > 1]
    common = [f"{k}={maps[0][k]}" for k in keys if k not in varying and maps and k in maps[0]]
    return varying, common


def _fmt(v: Optional[float], spec: str) -> str:
    return "-" if v is None else format(v, spec)


def format_table(rows: list[dict[str, Any]], sweep_dir: Path) -> str:
    """A plain-text table: job, swept override values, best mAP@0.5, final loss, time, status."""
    varying, common = _swept(rows)
    head = ["job", *varying, "best mAP@0.5", "final loss", "time s", "status"]
    body = []
    for r in rows:
        m = dict(o.split("=", 1) for o in (r.get("overrides") or []) if "=" in o)
        status = r["status"] + (f" ({r['attempts']} runs)" if (r.get("attempts") or 1) > 1 else "")
        if r.get("error"):
            status += f": {str(r['error']).splitlines()[0][:120]}"
        body.append([r["job"], *[m.get(k, "-") for k in varying], _fmt(r.get("best_map50"), ".4f"),
                     _fmt(r.get("final_loss"), ".4f"), _fmt(r.get("time_s"), ".1f"), status])
    widths = [max(len(str(x)) for x in col) for col in zip(head, *body)] if body else [len(h) for h in head]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in [head, *body]]
    done = sum(r["status"] == "completed" for r in rows)
    lines.append(f"{done}/{len(rows)} jobs completed; sweep dir: {sweep_dir}")
    if common:
        lines.append("all jobs: " + " ".join(common))
    return "\n".join(lines)
