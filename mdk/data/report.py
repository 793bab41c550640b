"""What a dataset holds and what the model's input size and grid will lose, from its records
(``python -m mdk.tools.dataset_report`` prints it): images and objects per class, images without
objects, box sizes at the model's input, and the objects the grid cannot hold.

The grid: each object belongs to the cell its centre falls in at the model's input (the image
resized to ``size`` x ``size``; a cell is ``stride`` pixels). A cell holds ``capacity`` objects
(GNetDet's YOLOv1 head: one, whatever its boxes per cell, the larger box winning; the anchor head:
one per prior); the smaller ones beyond it are lost from the training targets. What training
leaves out anyway (difficult objects, zero-area boxes) is left out here too. Augmentation moves
objects between cells; the counts are of the images as they are.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from mdk.data.records import Record


@dataclass
class SplitSummary:
    """One split: ``images``, ``empty`` (images without objects), ``objects`` per class [C]."""

    images: int
    empty: int
    objects: np.ndarray


@dataclass
class GridLoss:
    """At one input size: per class [C], the objects that ``share`` a cell with another object
    of their image, and those ``lost`` beyond the cell's capacity, of ``total``."""

    size: int
    grid: int
    share: np.ndarray
    lost: np.ndarray
    total: np.ndarray


def trained(rec: Record) -> np.ndarray:
    """The objects training targets hold: not difficult, of positive area."""
    b = rec.boxes
    return ~rec.difficult & (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])


def summarize(records: Sequence[Record], num_classes: int) -> SplitSummary:
    labels = [r.labels for r in records]
    flat = np.concatenate(labels) if labels else np.zeros(0, np.int64)
    return SplitSummary(len(records), sum(1 for x in labels if len(x) == 0),
                        np.bincount(flat, minlength=num_classes))


def input_sizes(records: Sequence[Record], size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(width, height, label) of every trained object, in pixels of the ``size`` input."""
    w, h, lab = [], [], []
    for r in records:
        keep = trained(r)
        b = r.boxes[keep].astype(np.float64)
        w.append((b[:, 2] - b[:, 0]) * size / r.width)
        h.append((b[:, 3] - b[:, 1]) * size / r.height)
        lab.append(r.labels[keep])
    if not w:
        return np.zeros(0), np.zeros(0), np.zeros(0, np.int64)
    return np.concatenate(w), np.concatenate(h), np.concatenate(lab)


def grid_loss(records: Sequence[Record], num_classes: int, size: int, stride: int,
              capacity: int) -> GridLoss:
    """The objects of ``records`` the grid of a ``size`` input cannot hold (see the module)."""
    grid = max(1, size // stride)
    share, lost, total = (np.zeros(num_classes, np.int64) for _ in range(3))
    for r in records:
        keep = trained(r)
        b, lab = r.boxes[keep].astype(np.float64), r.labels[keep]
        if not len(lab):
            continue
        np.add.at(total, lab, 1)
        cx = (b[:, 0] + b[:, 2]) / 2 * size / r.width
        cy = (b[:, 1] + b[:, 3]) / 2 * size / r.height
        col = np.clip((cx // stride).astype(np.int64), 0, grid - 1)
        row = np.clip((cy // stride).astype(np.int64), 0, grid - 1)
        cell = row * grid + col
        cells, counts = np.unique(cell, return_counts=True)
        if counts.max() < 2:
            continue
        area = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
        for c in cells[counts >= 2]:
            members = np.flatnonzero(cell == c)
            np.add.at(share, lab[members], 1)
            # the larger boxes are kept (on a tie the later object, as the encoding writes it)
            order = members[np.lexsort((members, area[members]))][::-1]
            np.add.at(lost, lab[order[capacity:]], 1)
    return GridLoss(size, grid, share, lost, total)


def cell_capacity(head: Any) -> int:
    """Objects one cell holds: one per prior with the anchor head, else one (GNetDet's YOLOv1
    encoding keeps the larger box whatever its boxes per cell)."""
    return int(head.boxes_per_cell) if getattr(head, "kind", None) == "anchors" else 1


def short_report(records: Sequence[Record], class_names: Sequence[str], size: int, stride: int,
                 capacity: int, min_px: int = 8) -> str:
    """One line for the log: the train objects the grid cannot hold and the boxes under
    ``min_px`` at the input (the whole report: python -m mdk.tools.dataset_report)."""
    g = grid_loss(records, len(class_names), size, stride, capacity)
    w, h, _ = input_sizes(records, size)
    total, lost = int(g.total.sum()), int(g.lost.sum())
    worst = sorted(((int(g.lost[c]), name) for c, name in enumerate(class_names) if g.lost[c]),
                   reverse=True)[:3]
    which = f" ({', '.join(f'{name} {n}' for n, name in worst)})" if worst else ""
    share = f"{100 * lost / total:.1f} %" if total else "0 %"
    return (f"train split at {size} px ({g.grid}x{g.grid} grid): {lost} of {total} objects "
            f"({share}) share a cell beyond its {capacity} and are lost from the targets{which}; "
            f"{int((np.minimum(w, h) < min_px).sum())} boxes under {min_px} px at the input "
            "(python -m mdk.tools.dataset_report with this run's overrides says more)")
