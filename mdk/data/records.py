"""The standard record every dataset format is read into, and the reader interface (a format is
one reader class named by ``dataset.reader._target_``: README.md, "Extending mdk").

The bad-box policy is the same for every format (:func:`clip_to_image`): a box partly outside
the image is clipped and counted; a box of zero area is counted and kept for evaluation only, as
the VOC devkit counts it; anything else wrong is a :class:`~mdk.errors.DataError` naming the file.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Protocol, Sequence

import numpy as np

log = logging.getLogger(__name__)


@dataclass
class Record:
    """One image of a split and its objects."""

    image: str            # path relative to the dataset root (posix, no whitespace)
    width: int            # original image size in pixels
    height: int
    boxes: np.ndarray     # [N, 4] float32 xyxy in original image pixels
    labels: np.ndarray    # [N] int64, index into dataset.class_names
    difficult: np.ndarray  # [N] bool: left out of training targets, ignored in evaluation


@dataclass
class SplitRecords:
    """One split's records in the format's own order, and how many boxes the bad-box policy
    clipped and kept at zero area; ``dropped``: boxes a reader of your own left out."""

    records: list[Record]
    clipped: int = 0
    dropped: int = 0
    zero_area: int = 0


READER_METHODS = ("check", "count", "records", "sources")


class Reader(Protocol):
    """A dataset format. Built as ``cls(root=..., class_names=..., **its own YAML keys)``. Every
    method raises a one-line :class:`~mdk.errors.DataError` naming the file; none writes."""

    root: Path               # the dataset root (``dataset.root``); record paths are relative to it
    class_names: list[str]   # ``dataset.class_names``; labels are indices into it

    def check(self, splits: Sequence[str]) -> None:
        """Cheap, before any worker starts: the root and the annotation files of ``splits``
        exist and look like this format, and each split lists at least one image."""

    def count(self, split: str) -> int:
        """How many images ``split`` lists (for the "fewer than one global batch" check)."""

    def records(self, split: str) -> SplitRecords:
        """Every image of ``split`` with its objects (image files must exist)."""

    def sources(self, split: str) -> list[Path]:
        """The files the records of ``split`` are read from (they key the index cache)."""

    # Optional: ``data_class_names(train_split, val_split) -> list[str]``, the class list the data
    # itself gives, read when ``dataset.class_names`` is left out (mdk/data/class_names.py).


def clip_to_image(box: list[float], width: int, height: int) -> tuple[list[float], bool]:
    """The bad-box policy: ``(box clipped to [0, width] x [0, height], whether it changed)``. VOC
    has border boxes with 1-based ``xmax == width``; dropping them would cost recall. A zero-area
    result is kept: the devkit counts it, so dropping it would score higher than published tools."""
    fixed = [min(max(v, 0.0), side) for v, side in zip(box, (width, height, width, height))]
    return fixed, fixed != box


def zero_area(box: Sequence[float]) -> bool:
    """``xmax <= xmin`` or ``ymax <= ymin``: nothing to learn, and no detection can match it."""
    return box[2] <= box[0] or box[3] <= box[1]


def fix_box(box: list[float], width: int, height: int, got: SplitRecords, path: Path, where: str
            ) -> list[float]:
    """:func:`clip_to_image` in a shipped reader: a clip or a zero area counted in ``got`` and
    logged at DEBUG (``path``, ``where``: the file and the object)."""
    fixed, changed = clip_to_image(box, width, height)
    if zero_area(fixed):
        got.zero_area += 1
        log.debug("%s: %s box %s has zero area inside %dx%d: kept for evaluation only", path,
                  where, box, width, height)
    elif changed:
        got.clipped += 1
        log.debug("%s: %s box %s outside %dx%d: clipped to %s", path, where, box, width, height,
                  fixed)
    return fixed


def make_record(image: str, width: int, height: int, boxes: Sequence[Sequence[float]],
                labels: Sequence[int], difficult: Sequence[bool]) -> Record:
    """A :class:`Record` with the standard dtypes and shapes (also for zero objects)."""
    return Record(image=image, width=int(width), height=int(height),
                  boxes=np.asarray(boxes, dtype=np.float32).reshape(-1, 4),
                  labels=np.asarray(labels, dtype=np.int64),
                  difficult=np.asarray(difficult, dtype=bool))


def only_in_val(train: Sequence[Record], val: Sequence[Record], class_names: Sequence[str]
                ) -> Optional[str]:
    """One line naming the classes that have objects in the val split and none in the train
    split (the model cannot learn them; each counts as a miss), or None."""
    def counts(records: Sequence[Record]) -> np.ndarray:
        labels = [r.labels for r in records if len(r.labels)]
        return np.bincount(np.concatenate(labels) if labels else np.zeros(0, np.int64),
                           minlength=len(class_names))

    trained, scored = counts(train), counts(val)
    missing = [f"{class_names[c]} ({scored[c]})" for c in range(len(class_names))
               if scored[c] and not trained[c]]
    if not missing:
        return None
    return (f"class(es) {', '.join(missing)} have objects in the val split but none in the train "
            "split: the model cannot learn them and each counts as a miss; add train images of "
            "them or leave them out of val")
