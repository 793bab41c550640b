"""What an evaluation leaves for people to look at (rank 0, ``eval.reports``): per-class AP and
its table in the sinks, a grid of val detections in the sinks and the run dir after every
evaluation, and the precision-recall curves of the stage's best checkpoint in the run dir.

Cheap on purpose (measured ~0.4 s for the grid, ~0.15 s per PR figure): it reuses the
evaluator's result and the merged detections the evaluation already computed.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Optional

from mdk.engine.loop import HookBase
from mdk.eval.grid import dataset_grid, save_png
from mdk.eval.plots import save_pr_curves
from mdk.eval.scalars import ap_table, scalars
from mdk.sinks.base import NullSink

log = logging.getLogger(__name__)


class EvalReporter:
    def __init__(self, run_dir: Path, stage: str, dataset: Any, sink: NullSink,
                 grid_images: int = 8, enabled: bool = True) -> None:
        self.run_dir, self.stage, self.dataset, self.sink = Path(run_dir), stage, dataset, sink
        self.grid_images, self.enabled = int(grid_images), enabled
        self.keep: list = []  # filled by the evaluation: [evaluator result, merged detections]

    def after_eval(self, step: int, best: bool) -> None:
        """Report the evaluation that just filled ``keep``; ``best``: it chose a new best.pth."""
        if not self.enabled or len(self.keep) != 2:
            return
        result, detections = self.keep
        self.keep = []
        names = list(self.dataset.class_names)
        try:
            self.sink.log({f"val/{k}": v for k, v in scalars(result, names).items()}, step)
            self.sink.log_text("val/ap_table", ap_table(result, names), step)
            if self.grid_images > 0:
                grid = dataset_grid(self.dataset, detections, names, count=self.grid_images)
                self.sink.log_image("val/detections", grid, step)
                save_png(grid, self.run_dir / f"detections_{self.stage}.png")
            if best:
                save_pr_curves(result, self.run_dir, names, stem=f"pr_{self.stage}",
                               title=f"{self.stage} best ({result['name']})")
        except Exception as e:  # a report must never stop training
            log.warning("could not write the evaluation reports: %s", e)


def maybe_reporter(cfg: Any, run_dir: Path, stage: str, dataset: Any, sink: NullSink,
                   is_main: bool) -> Optional[EvalReporter]:
    ev = cfg.get("eval") or {}
    if not is_main or not ev.get("reports", True):
        return None
    return EvalReporter(run_dir, stage, dataset, sink, int(ev.get("grid_images", 8)))


class ReportHook(HookBase):
    """After each epoch's evaluation (register after the CheckpointHook, which decides whether it
    is the new best): hand the evaluation to the reporter at the run's global step."""

    def __init__(self, reporter: EvalReporter, checkpoint_hook: Any, step_offset: int = 0) -> None:
        self.reporter, self.ckpt, self.offset = reporter, checkpoint_hook, step_offset

    def after_epoch(self) -> None:
        t = self.trainer
        if getattr(t, "metrics", None):
            self.reporter.after_eval(self.offset + t.iter, best=self.ckpt.best_epoch == t.epoch)
