"""Detections and ground truth of many images flattened into arrays, the evaluators' input.

Detections: ``{image_id: {"boxes": [N, 4] xyxy, "scores": [N], "labels": [N]}}``, torch or
numpy. The keys are the images evaluated (an entry may be empty); ground truth is read for those
only: ``{image_id: (boxes [M, 4], labels [M], difficult [M])}`` or a callable such as
``dataset.gt``.

Order: images by ascending id, then the order given; the evaluators' stable sort keeps it for
equal scores, as the MATLAB devkit does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Union

import numpy as np

GroundTruth = Union[Mapping[int, tuple], Callable[[int], tuple]]


@dataclass
class Flat:
    images: np.ndarray        # [I] image ids, ascending
    det_image: np.ndarray     # [D] int64 position in ``images``
    det_boxes: np.ndarray     # [D, 4] float64 xyxy
    det_scores: np.ndarray    # [D] float64
    det_labels: np.ndarray    # [D] int64
    gt_image: np.ndarray      # [G] int64 position in ``images``
    gt_boxes: np.ndarray      # [G, 4] float64
    gt_labels: np.ndarray     # [G] int64
    gt_difficult: np.ndarray  # [G] bool


def as_numpy(x: Any, dtype: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        x = x.detach().cpu().numpy()
    return np.asarray(x, dtype=dtype)


def _gt_of(ground_truth: GroundTruth, image_id: int) -> tuple:
    if callable(ground_truth):
        return ground_truth(image_id)
    try:
        return ground_truth[image_id]
    except KeyError:
        raise KeyError(f"ground truth has no entry for image {image_id}, which has detections; "
                       "give ground truth (possibly empty) for every evaluated image") from None


def _check(name: str, image_id: int, boxes: np.ndarray, labels: np.ndarray, n_other: int,
           num_classes: int) -> None:
    if boxes.ndim != 2 or boxes.shape[1] != 4:
        raise ValueError(f"image {image_id}: {name} boxes have shape {boxes.shape}, "
                         "expected [N, 4]")
    if len(labels) != len(boxes) or n_other != len(boxes):
        raise ValueError(f"image {image_id}: {len(boxes)} {name} boxes but {len(labels)} labels "
                         f"and {n_other} scores/difficult flags; give one per box")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise ValueError(f"image {image_id}: {name} labels {sorted(set(labels.tolist()))} outside "
                         f"0..{num_classes - 1} (num_classes={num_classes})")


def flatten(detections: Mapping[int, Mapping[str, Any]], ground_truth: GroundTruth,
            num_classes: int) -> Flat:
    """Concatenate all images (ascending id) into :class:`Flat`; checks shapes and labels."""
    images = np.array(sorted(int(i) for i in detections), dtype=np.int64)
    db, ds, dl, di, gb, gl, gd, gi = [], [], [], [], [], [], [], []
    for pos, image_id in enumerate(images.tolist()):
        d = detections[image_id]
        boxes = as_numpy(d["boxes"], np.float64).reshape(-1, 4)
        scores = as_numpy(d["scores"], np.float64).reshape(-1)
        labels = as_numpy(d["labels"], np.int64).reshape(-1)
        _check("detection", image_id, boxes, labels, len(scores), num_classes)
        if not np.isfinite(scores).all():
            raise ValueError(f"image {image_id}: detection scores {scores.tolist()} are not all "
                             "finite; a NaN score cannot be ranked")
        db.append(boxes), ds.append(scores), dl.append(labels)
        di.append(np.full(len(scores), pos, np.int64))
        g_boxes, g_labels, g_diff = _gt_of(ground_truth, image_id)
        g_boxes = as_numpy(g_boxes, np.float64).reshape(-1, 4)
        g_labels = as_numpy(g_labels, np.int64).reshape(-1)
        g_diff = as_numpy(g_diff, bool).reshape(-1)
        _check("ground-truth", image_id, g_boxes, g_labels, len(g_diff), num_classes)
        gb.append(g_boxes), gl.append(g_labels), gd.append(g_diff)
        gi.append(np.full(len(g_labels), pos, np.int64))

    def cat(parts: list, dtype: Any, shape: tuple) -> np.ndarray:
        return np.concatenate(parts).astype(dtype) if parts else np.zeros(shape, dtype)

    return Flat(images=images, det_image=cat(di, np.int64, (0,)),
                det_boxes=cat(db, np.float64, (0, 4)), det_scores=cat(ds, np.float64, (0,)),
                det_labels=cat(dl, np.int64, (0,)), gt_image=cat(gi, np.int64, (0,)),
                gt_boxes=cat(gb, np.float64, (0, 4)), gt_labels=cat(gl, np.int64, (0,)),
                gt_difficult=cat(gd, bool, (0,)))
