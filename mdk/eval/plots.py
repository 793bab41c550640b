"""Precision-recall curves of an evaluator's result, drawn with matplotlib's Agg canvas (never
pyplot: no global figure state, safe in a training process and in threads)."""
from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Optional, Sequence

import numpy as np
import torch

from mdk.eval.grid import save_png

log = logging.getLogger(__name__)


def _render(result: dict[str, Any], classes: list[int], names: Sequence[str], title: str
            ) -> torch.Tensor:
    # matplotlib here: slow to import, needed only when a figure is drawn
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.8), dpi=100)
    canvas = FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for c in classes:
        rec, prec = result["recall"][c], result["precision"][c]
        # Precision after each counted detection against recall, as the devkit plots it.
        ax.plot(rec, prec, linewidth=1.2, label=f"{names[c]} (AP {float(result['ap'][c]):.3f})")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("recall")
    ax.set_ylabel("precision")
    ax.set_title(title, fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    # Fixed margins that fit the 0-1 tick labels: tight_layout would draw the figure once more
    # only to measure them (drawn at every stage's end).
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.11, top=0.92)
    canvas.draw()
    rgba = np.asarray(canvas.buffer_rgba())
    return torch.from_numpy(np.ascontiguousarray(rgba[..., :3].transpose(2, 0, 1)))


def pr_curve_images(result: dict[str, Any], class_names: Optional[Sequence[str]] = None,
                    per_figure: int = 10, title: str = "") -> list[torch.Tensor]:
    """One uint8 ``[3, H, W]`` image per group of up to ``per_figure`` classes with ground truth."""
    n = len(result["ap"])
    names = list(class_names) if class_names is not None else [str(c) for c in range(n)]
    classes = [c for c in range(n) if not math.isnan(float(result["ap"][c]))]
    images = []
    for g in range(0, len(classes), max(1, per_figure)):
        group = classes[g:g + per_figure]
        head = f"{result['name']}: mean {result['map']:.4f}"
        if len(classes) > per_figure:
            head += f" (classes {g + 1}-{g + len(group)} of {len(classes)})"
        images.append(_render(result, group, names, f"{title}  {head}".strip()))
    return images


def save_pr_curves(result: dict[str, Any], out_dir: str | Path,
                   class_names: Optional[Sequence[str]] = None, stem: str = "pr",
                   per_figure: int = 10, title: str = "") -> list[Path]:
    """Write ``<out_dir>/<stem>_<k>.png``, one per class group; returns the paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [save_png(img, out / f"{stem}_{k}.png")
             for k, img in enumerate(pr_curve_images(result, class_names, per_figure, title), 1)]
    log.info("precision-recall curves: %s", ", ".join(str(p) for p in paths) or "none (no classes "
             "with ground truth)")
    return paths
