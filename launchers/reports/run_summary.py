"""The closing summary of a run: a row per stage, AP per class, and what to run next."""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from mdk.engine.result import StageResult
from mdk.errors import disk_reason

log = logging.getLogger(__name__)


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def _per_class(results: list[StageResult], class_names: list[str]) -> list[str]:
    """AP of each class at each stage's best evaluation; n/a: no ground truth."""
    scored = [r for r in results if r.ap]
    if not scored:
        return []
    width = max(12, *(len(n) for n in class_names))
    lines = [f"{'AP per class':<{width}} " + " ".join(f"{r.stage:>7}" for r in scored)]
    for c, name in enumerate(class_names):
        aps = [r.ap[c] if c < len(r.ap) else math.nan for r in scored]
        lines.append(f"{name:<{width}} " + " ".join(
            f"{'n/a' if math.isnan(v) else format(v, '.4f'):>7}" for v in aps))
    return lines


def print_summary(results: list[StageResult], cfg: DictConfig, run_dir: Path) -> None:
    w = max([7, *(len(r.stage) for r in results)])
    lines = [f"{'stage':<{w}} {'mAP@0.5':>8} {'best ep':>7} {'loss':>8} {'time s':>7}  checkpoints"]
    for r in results:
        lines.append(f"{r.stage:<{w}} {_fmt(r.best_map50):>8} {_fmt(r.best_epoch):>7} "
                     f"{_fmt(r.final_loss):>8} {_fmt(r.time_s, '.1f'):>7}  "
                     f"{r.checkpoints or '-'}")
    metric = next((r.metric for r in results if r.metric), None)
    if metric:
        lines.append(f"mAP@0.5: {metric} on the {cfg.dataset.val_split} split, at each stage's "
                     "best evaluation (eval.metric)")
    lines += _per_class(results, list(cfg.dataset.class_names))
    if results[-1].next:
        lines.append(f"next stage: python run.py step={results[-1].next}")
    if results[-1].export:
        lines.append(f"chip model exported to {results[-1].export}")
    lines.append(f"run dir: {run_dir}")
    text = "\n".join(lines)
    log.info("summary\n%s", text)
    try:
        (run_dir / "summary.txt").write_text(text + "\n")
    except OSError as e:  # a copy of what was just printed: the run's work is done and kept
        log.warning("could not write %s: %s (%s)", run_dir / "summary.txt",
                    disk_reason(e) or "a write failed", e)
