"""What a dataset holds and what the model's input size and grid will lose, before any training.

    python -m mdk.tools.dataset_report dataset=voc dataset.root=/data/BCCD model.image_size=224
    python -m mdk.tools.dataset_report experiment=bccd dataset.root=/data/BCCD --out reports/

Takes the overrides of ``python run.py`` (the dataset, the model and its input size, the head).
Prints, per split, images, images without objects and objects per class; box sizes at the
model's input (how many under ``--min-px``); and, on the train split, the objects that share a
grid cell with another and those the grid cannot hold (a cell holds one object with GNetDet's
YOLOv1 head, one per prior with the anchor head; the smaller ones beyond it are lost), at this
input size and at the chip's other sizes. Writes a histogram of the box sizes at the input (PNG,
into ``--out``). The records come through the dataset's index cache (paths.data); no image is
decoded. How the counts are made: mdk/data/report.py.
"""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
from omegaconf import DictConfig

from mdk.data.build import split_records
from mdk.data.report import cell_capacity, grid_loss, input_sizes, summarize
from mdk.errors import UserError
from mdk.models.build import build_head
from mdk.paths import resolve_path
from mdk.quant.chips import CHIP_INPUT_SIZES
from mdk.tools.evaluate import ToolError, tool_config


def _pct(n: int, total: int) -> str:
    return f"{n} ({100 * n / total:.1f} %)" if total else "0"


def capacity_of(cfg: DictConfig) -> tuple[int, str]:
    """How many objects a cell holds with the config's head, and that in words."""
    head = build_head(cfg)
    b = cell_capacity(head)
    if getattr(head, "kind", None) == "anchors":
        return b, f"one object per prior, {b} prior(s) per cell"
    return b, "one object per cell (the larger box is kept)"


def report_lines(cfg: DictConfig, records: dict, min_px: int) -> list[str]:
    names = list(cfg.dataset.class_names)
    size = int(cfg.model.image_size)
    stride = 2 ** list(cfg.model.net.channels).count("M")
    capacity, held = capacity_of(cfg)
    out = [f"dataset {cfg.dataset.name} ({cfg.dataset.root}): {len(names)} classes; model "
           f"{cfg.model.name} at {size} px (a {size // stride}x{size // stride} grid of "
           f"{stride}-px cells), {held}", ""]
    width = max(8, *(len(n) for n in names))
    out.append(f"{'split':<10} {'images':>7} {'no objects':>11}  " +
               "  ".join(f"{n:>{width}}" for n in names) + f"  {'objects':>8}")
    for split, recs in records.items():
        s = summarize(recs, len(names))
        out.append(f"{split:<10} {s.images:>7} {s.empty:>11}  " +
                   "  ".join(f"{int(v):>{width}}" for v in s.objects) + f"  {int(s.objects.sum()):>8}")
    train = records[str(cfg.dataset.train_split)]
    w, h, lab = input_sizes(train, size)
    side = np.sqrt(w * h)
    out += ["", f"box sizes at the {size}-px input (train split; sqrt(width x height), px):",
            f"{'class':<{width}} {'objects':>8} {'median':>7} {'smallest':>9} "
            f"{'under ' + str(min_px) + ' px wide or high':>27}"]
    for c, name in enumerate(names):
        sel = lab == c
        if sel.any():
            small = int((np.minimum(w[sel], h[sel]) < min_px).sum())
            out.append(f"{name:<{width}} {int(sel.sum()):>8} {np.median(side[sel]):>7.1f} "
                       f"{side[sel].min():>9.1f} {_pct(small, int(sel.sum())):>27}")
    sizes = sorted({*CHIP_INPUT_SIZES.get(str(cfg.chip), ()), size})
    out += ["", f"the grid (train split; {held}): objects that share a cell with another, and "
            "those it cannot hold", f"{'size':>6} {'grid':>6}  {'class':<{width}} {'objects':>8} "
            f"{'share a cell':>16} {'lost':>16}"]
    for at in sizes:
        g = grid_loss(train, len(names), at, stride, capacity)
        mark = "*" if at == size else " "
        for c, name in enumerate(names):
            head = f"{at:>5}{mark} {g.grid:>3}x{g.grid:<2}" if c == 0 else " " * 13
            out.append(f"{head}  {name:<{width}} {int(g.total[c]):>8} "
                       f"{_pct(int(g.share[c]), int(g.total[c])):>16} "
                       f"{_pct(int(g.lost[c]), int(g.total[c])):>16}")
    out.append(f"(* the model's input size; the others are the chip's input sizes, {stride}-px "
               "cells)")
    return out


def histogram_png(cfg: DictConfig, records: dict, min_px: int, out_dir: Path) -> Path:
    """Box sizes at the model's input per class (train split), log-scale bins; the lines mark
    ``min_px`` and one grid cell."""
    # matplotlib here: slow to import, needed only for the figure
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    names, size = list(cfg.dataset.class_names), int(cfg.model.image_size)
    stride = 2 ** list(cfg.model.net.channels).count("M")
    w, h, lab = input_sizes(records[str(cfg.dataset.train_split)], size)
    side = np.sqrt(w * h)
    fig = Figure(figsize=(7, 4.2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    top = max(float(side.max()) if side.size else size, stride) * 1.1
    low = min(float(side.min()) if side.size else 1.0, min_px) * 0.8
    bins = np.geomspace(max(low, 0.1), max(top, 1.0), 40)
    for c, name in enumerate(names):
        if (lab == c).any():
            ax.hist(side[lab == c], bins=bins, histtype="step", linewidth=1.5,
                    label=f"{name} ({int((lab == c).sum())})")
    ax.axvline(min_px, color="red", linestyle="--", linewidth=1, label=f"{min_px} px")
    ax.axvline(stride, color="grey", linestyle=":", linewidth=1, label=f"one cell ({stride} px)")
    ax.set_xscale("log")
    ax.set_xlabel(f"box size at the {size}-px input: sqrt(width x height), px")
    ax.set_ylabel("objects (train split)")
    ax.set_title(f"{cfg.dataset.name}: box sizes at {size} px", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"dataset_report_{cfg.dataset.name}_{size}.png"
    fig.savefig(path)
    return path


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.dataset_report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="Hydra overrides, e.g. dataset=voc "
                    "dataset.root=/data/BCCD model.image_size=224")
    ap.add_argument("--min-px", type=int, default=8,
                    help="count boxes narrower or lower than this at the model's input (default 8)")
    ap.add_argument("--out", default=".", help="folder for the histogram PNG (default: here)")
    args = ap.parse_intermixed_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        cfg = tool_config(args.overrides)
        records = split_records(cfg.dataset, int(cfg.model.image_size),
                                resolve_path(cfg.paths.data, Path.cwd()))
        lines = report_lines(cfg, records, args.min_px)
        png = histogram_png(cfg, records, args.min_px, Path(args.out))
    except (ToolError, UserError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print("\n".join(lines))
    print(f"\nwrote {png}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
