"""What an evaluation leaves for people to look at (rank 0, ``eval.reports``; which files and
sinks: docs/pipeline.md, "Running it"): per-class AP after every evaluation; the pictures of the
best one once, at the stage's end, from its result and detections kept in memory (``keep``), so
nothing is evaluated again.
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
                 grid_images: int = 8) -> None:
        self.run_dir, self.stage, self.dataset, self.sink = Path(run_dir), stage, dataset, sink
        self.grid_images = int(grid_images)
        self.keep: list = []  # filled by the evaluation: [evaluator result, merged detections]
        self.best: Optional[list] = None  # the best evaluation's [result, detections] so far

    def after_eval(self, step: int, best: bool) -> None:
        """Report the evaluation that just filled ``keep`` to the sinks; ``best``: it chose a new
        best.pth (kept for ``write_best``)."""
        if len(self.keep) != 2:
            return
        result, detections = self.keep
        self.keep = []
        if best:
            self.best = [result, detections]
        names = list(self.dataset.class_names)
        try:
            self.sink.log({f"val/{k}": v for k, v in scalars(result, names).items()}, step)
            self.sink.log_text("val/ap_table", ap_table(result, names), step)
        except Exception as e:  # a report must never stop training
            log.warning("could not write the evaluation reports: %s", e)

    def write_best(self, step: int) -> list[Path]:
        """Write the pictures of the best evaluation so far (the grid also to the sinks); return
        the files."""
        if self.best is None:
            return []
        result, detections = self.best
        self.best = None
        names = list(self.dataset.class_names)
        paths: list[Path] = []
        try:
            if self.grid_images > 0:
                grid = dataset_grid(self.dataset, detections, names, count=self.grid_images)
                self.sink.log_image("val/best_detections", grid, step)
                paths.append(save_png(grid, self.run_dir / f"detections_{self.stage}.png"))
                log.info("detections of the best evaluation: %s", paths[-1])
            paths += save_pr_curves(result, self.run_dir, names, stem=f"pr_{self.stage}",
                                    title=f"{self.stage} best ({result['name']})")
        except Exception as e:  # a report must never stop training
            log.warning("could not write the evaluation reports: %s", e)
        return paths


def maybe_reporter(cfg: Any, run_dir: Path, stage: str, dataset: Any, sink: NullSink,
                   is_main: bool) -> Optional[EvalReporter]:
    ev = cfg.get("eval") or {}
    if not is_main or not ev.get("reports", True):
        return None
    return EvalReporter(run_dir, stage, dataset, sink, int(ev.get("grid_images", 8)))


class ReportHook(HookBase):
    """Hand each epoch's evaluation to the reporter, and its best one's pictures when the loop
    ends. Register after the CheckpointHook, which decides what is best."""

    def __init__(self, reporter: EvalReporter, checkpoint_hook: Any, step_offset: int,
                 best_path: Path) -> None:
        self.reporter, self.ckpt, self.offset = reporter, checkpoint_hook, step_offset
        self.best_path = best_path

    def after_epoch(self) -> None:
        t = self.trainer
        if getattr(t, "metrics", None):
            self.reporter.after_eval(self.offset + t.iter, best=self.ckpt.best_epoch == t.epoch)

    def after_train(self) -> None:
        if self.reporter.best is None and self.ckpt.best_epoch >= 0:
            log.info("the best evaluation of %s (epoch %d) came before this run resumed: its "
                     "PR curves and detections are in that run's dir, or draw them with "
                     "python -m mdk.tools.evaluate %s --reports <dir>", self.reporter.stage,
                     self.ckpt.best_epoch + 1, self.best_path)
            return
        self.reporter.write_best(self.offset + self.trainer.iter)
