"""The Hydra callback behind a sweep's closing table, the same under every launcher: each job
writes its own ``result.json``, the launching process reads them all (docs/cluster.md, "Sweeps").
"""
from __future__ import annotations

import contextlib
import json
import logging
import time
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from launchers.hydra_app.job import is_multirun
from launchers.hydra_app.optuna_study import MARKER, SWEEPER
from launchers.processes.env import detect
from launchers.reports.sweep_results import RESULT, collect_results, format_table, job_record
from launchers.reports.sweep_stats import aggregate, format_aggregate
from mdk.atomic_file import write_json

log = logging.getLogger(__name__)


class SweepFailedError(SystemExit):
    """Some sweep jobs failed; the message lists them. A SystemExit because Hydra turns an
    Exception raised in a callback into a mere warning."""


class SweepDirInUseError(SystemExit):
    """The sweep dir already holds another sweep's jobs (SystemExit: see SweepFailedError)."""


class SweepSummary(Callback):

    def __init__(self, resume: bool = False, fail_on_error: bool = True) -> None:
        self.resume, self.fail_on_error = resume, fail_on_error
        self._started = time.time()

    # --- launching process -------------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        # multirun.yaml: Hydra writes it after this callback, so it marks any earlier sweep here.
        old = sorted(sweep_dir.glob(f"*/{RESULT}")) + sorted(sweep_dir.glob("multirun.yaml"))
        study = OmegaConf.select(config, "hydra.sweeper._target_") == SWEEPER and \
            (sweep_dir / MARKER).is_file()  # a search continues its study (checked by its sweeper)
        if old and not self.resume and not study:
            raise SweepDirInUseError(
                f"hydra.sweep.dir={sweep_dir} already holds a sweep ({old[0]} exists); its "
                f"checkpoints would be reused or overwritten. Give a new hydra.sweep.dir, or add "
                f"hydra.callbacks.sweep.resume=true to continue that sweep")

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir))
        rows = collect_results(sweep_dir)
        text = format_table(rows, sweep_dir)
        agg = aggregate(rows)  # None without a seed axis
        if agg is not None:
            text += "\n\n" + format_aggregate(agg)
        log.info("sweep summary (%s)\n%s", sweep_dir / "sweep_summary.txt", text)
        (sweep_dir / "sweep_summary.txt").write_text(text + "\n", encoding="utf-8")
        write_json(sweep_dir / "sweep_summary.json",
                   {"sweep_dir": str(sweep_dir), "jobs": rows,
                    **({"aggregate": agg} if agg else {})}, indent=1)
        bad = [r for r in rows if r["status"] not in ("completed", "pruned")]
        if bad and self.fail_on_error:
            raise SweepFailedError(
                f"{len(bad)} of {len(rows)} sweep jobs did not complete: "
                + "; ".join(f"#{r['job']} {r['status']}: {r.get('error') or r['dir']}" for r in bad)
                + f". Table: {sweep_dir / 'sweep_summary.txt'}")

    # --- job process -------------------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        if not is_multirun() or detect().rank != 0:
            return
        self._started = time.time()
        path = Path(str(config.hydra.runtime.output_dir)) / RESULT
        attempts = 0
        with contextlib.suppress(ValueError, OSError):  # a first run has no result.json yet
            attempts = int(json.loads(path.read_text()).get("attempts", 0))
        write_json(path, {"status": "running", "overrides": _overrides(config),
                          "job_id": str(OmegaConf.select(config, "hydra.job.id")),
                          "attempts": attempts + 1, "started": self._started}, indent=1)

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        if not is_multirun() or detect().rank != 0:
            return
        path = Path(str(config.hydra.runtime.output_dir)) / RESULT
        ret = job_return._return_value if job_return.status != JobStatus.UNKNOWN else None
        prev = json.loads(path.read_text()) if path.is_file() else {}
        rec = job_record(ret, _overrides(config), self._started)
        # A search's sweeper may have recorded the trial first (a run that outlived its sweep).
        keep = {"trial": prev["trial"]} if "trial" in prev else {}
        write_json(path, {**rec, "job_id": prev.get("job_id"),
                          "attempts": prev.get("attempts", 1),
                          "started": prev.get("started", self._started), **keep}, indent=1)


def _overrides(config: DictConfig) -> list[str]:
    return [str(o) for o in OmegaConf.to_container(config.hydra.overrides.task)]  # type: ignore[union-attr]
