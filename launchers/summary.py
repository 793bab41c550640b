"""The closing summary of a run: a table per stage and what to run next."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

log = logging.getLogger(__name__)

NEXT = {"step1": "step2", "step2": "cal", "cal": "step3", "step3": "step4"}


def _fmt(v: Any, spec: str = ".4f") -> str:
    return "-" if v is None else format(v, spec) if isinstance(v, float) else str(v)


def print_summary(results: list[dict[str, Any]], cfg: DictConfig, run_dir: Path) -> None:
    lines = [f"{'stage':<7} {'mAP@0.5':>8} {'best ep':>7} {'loss':>8} {'time s':>7}  checkpoints"]
    for r in results:
        m = r.get("best_map50", r.get("map50"))
        lines.append(f"{r['stage']:<7} {_fmt(m):>8} {_fmt(r.get('best_epoch')):>7} "
                     f"{_fmt(r.get('final_loss')):>8} {_fmt(r.get('time_s'), '.1f'):>7}  "
                     f"{r.get('checkpoints', '-')}")
    nxt = NEXT.get(results[-1]["stage"])
    if nxt:
        lines.append(f"next stage: python run.py step={nxt}")
    if results[-1].get("export"):
        lines.append(f"chip model exported to {results[-1]['export']}")
    lines.append(f"run dir: {run_dir}")
    text = "\n".join(lines)
    log.info("summary\n%s", text)
    (run_dir / "summary.txt").write_text(text + "\n")
