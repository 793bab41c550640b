"""Pascal VOC detection AP, following the devkit's ``VOCevaldet.m`` / ``VOCap.m``. Its conventions
and where mdk chooses (the 11 recall points, IoU >= 0.5, the stable order of equal scores,
``difficult`` objects, classes without ground truth): docs/pipeline.md (Evaluation).

Each detection is assigned the object of its class in its image with the highest IoU (the first
on a tie), *even when that object is already taken*, as the devkit does: on a ``difficult``
object it is ignored, else the first detection to take an object is a TP and later ones FP. So
only "first to take" depends on the order and the assignment is vectorised. Ignored detections
are left out of the precision-recall curve (they would only repeat a point).

``pixel_offset`` is added to widths and heights: 1 is the devkit's 1-based inclusive pixels, 0 the
continuous convention (torchvision, COCO).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mdk.eval.config import VOC_METRICS, check_metric
from mdk.eval.inputs import Flat, GroundTruth, flatten

NAMES = dict(zip(VOC_METRICS, ("VOC07 11-point mAP@0.5", "VOC12 area mAP@0.5")))
_CHUNK = 1 << 20  # IoU matrix elements per block: bounds memory to ~50 MB whatever the input
VOC07_THRESHOLDS = np.arange(0.0, 1.1, 0.1)  # the devkit ports' 11 recall points (k * 0.1)


def _iou(det: np.ndarray, gt: np.ndarray, off: float) -> np.ndarray:
    """IoU of ``det`` [n, 4] with each of ``gt`` [n, m, 4]; 0 where the boxes do not overlap."""
    iw = np.minimum(det[:, None, 2], gt[..., 2]) - np.maximum(det[:, None, 0], gt[..., 0]) + off
    ih = np.minimum(det[:, None, 3], gt[..., 3]) - np.maximum(det[:, None, 1], gt[..., 1]) + off
    overlap = (iw > 0) & (ih > 0)  # the devkit only scores boxes that overlap
    inter = np.where(overlap, iw * ih, 0.0)
    area_d = (det[:, 2] - det[:, 0] + off) * (det[:, 3] - det[:, 1] + off)
    area_g = (gt[..., 2] - gt[..., 0] + off) * (gt[..., 3] - gt[..., 1] + off)
    union = area_d[:, None] + area_g - inter
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(overlap & (union > 0), inter / union, 0.0)


def best_overlap(flat: Flat, num_classes: int, pixel_offset: float = 0.0
                 ) -> tuple[np.ndarray, np.ndarray]:
    """For each detection: (highest IoU with an object of its class in its image, that object's
    index into ``flat.gt_*`` or -1 when the image has no such object)."""
    n_det = len(flat.det_scores)
    best = np.zeros(n_det, np.float64)
    gid = np.full(n_det, -1, np.int64)
    if n_det == 0 or len(flat.gt_labels) == 0:
        return best, gid
    # Ground truth padded per (image, class) key, in annotation order within a key.
    gt_key = flat.gt_image * num_classes + flat.gt_labels
    order = np.argsort(gt_key, kind="stable")
    keys, starts, counts = np.unique(gt_key[order], return_index=True, return_counts=True)
    width = int(counts.max())
    row = np.repeat(np.arange(len(keys)), counts)
    slot = np.arange(len(order)) - np.repeat(starts, counts)
    pad_boxes = np.zeros((len(keys), width, 4))
    pad_id = np.full((len(keys), width), -1, np.int64)
    pad_boxes[row, slot] = flat.gt_boxes[order]
    pad_id[row, slot] = order
    det_key = flat.det_image * num_classes + flat.det_labels
    pos = np.minimum(np.searchsorted(keys, det_key), len(keys) - 1)
    has = np.flatnonzero(keys[pos] == det_key)
    step = max(1, _CHUNK // width)
    for s in range(0, len(has), step):
        d = has[s:s + step]
        r = pos[d]
        ov = _iou(flat.det_boxes[d], pad_boxes[r], pixel_offset)
        ov = np.where(pad_id[r] >= 0, ov, -1.0)
        j = ov.argmax(1)  # first maximum: the devkit's strict '>' keeps the first on a tie
        best[d] = ov[np.arange(len(d)), j]
        gid[d] = pad_id[r, j]
    return best, gid


def ap_voc07(recall: np.ndarray, precision: np.ndarray) -> float:
    """11-point interpolated AP (VOC2007 devkit)."""
    if len(recall) == 0:
        return 0.0
    envelope = np.maximum.accumulate(precision[::-1])[::-1]  # max precision at index >= i
    first = np.searchsorted(recall, VOC07_THRESHOLDS, side="left")  # recall is sorted
    return float(np.where(first < len(recall), envelope[np.minimum(first, len(recall) - 1)],
                          0.0).sum() / 11.0)


def ap_area(recall: np.ndarray, precision: np.ndarray) -> float:
    """Area under the monotone precision envelope (VOC2010+ devkit ``VOCap.m``)."""
    mrec = np.concatenate([[0.0], recall, [1.0]])
    mpre = np.concatenate([[0.0], precision, [0.0]])
    mpre = np.maximum.accumulate(mpre[::-1])[::-1]
    i = np.flatnonzero(mrec[1:] != mrec[:-1]) + 1
    return float(((mrec[i] - mrec[i - 1]) * mpre[i]).sum())


def voc_ap(detections: Mapping[int, Mapping[str, Any]], ground_truth: GroundTruth,
           num_classes: int, metric: str = "voc07", iou_threshold: float = 0.5,
           pixel_offset: float = 0.0) -> dict[str, Any]:
    """VOC AP per class and their mean.

    Returns ``{"metric", "name", "map", "ap" [C] (nan: no ground truth), "precision": [C arrays],
    "recall": [C arrays] (after each counted detection), "num_gt" [C] (non-difficult objects),
    "num_det" [C], "images"}``.
    """
    check_metric(metric, VOC_METRICS)
    if not 0.0 < iou_threshold <= 1.0:
        raise ValueError(f"iou_threshold={iou_threshold} must be in (0, 1]")
    flat = flatten(detections, ground_truth, num_classes)
    ov, gid = best_overlap(flat, num_classes, pixel_offset)
    hit = (gid >= 0) & (ov >= iou_threshold)
    hit_difficult = hit & flat.gt_difficult[np.maximum(gid, 0)]
    # Class-major, then decreasing score; lexsort is stable, so ties keep the input order.
    order = np.lexsort((-flat.det_scores, flat.det_labels))
    labels = flat.det_labels[order]
    ignored = hit_difficult[order]
    tp = np.zeros(len(order), bool)
    cand = np.flatnonzero((hit & ~hit_difficult)[order])
    _, first = np.unique(gid[order][cand], return_index=True)  # the first to take each object
    tp[cand[first]] = True
    fp = ~tp & ~ignored
    npos = np.bincount(flat.gt_labels[~flat.gt_difficult], minlength=num_classes)
    bounds = np.searchsorted(labels, np.arange(num_classes + 1))
    ap = np.full(num_classes, np.nan)
    precision, recall = [], []
    ap_fn = ap_voc07 if metric == "voc07" else ap_area
    for c in range(num_classes):
        sl = slice(bounds[c], bounds[c + 1])
        keep = ~ignored[sl]
        tpc = np.cumsum(tp[sl][keep], dtype=np.float64)
        fpc = np.cumsum(fp[sl][keep], dtype=np.float64)
        prec = tpc / np.maximum(tpc + fpc, 1.0)  # every kept row is a TP or an FP: never 0/0
        rec = tpc / npos[c] if npos[c] else np.full(len(tpc), np.nan)
        precision.append(prec)
        recall.append(rec)
        if npos[c]:
            ap[c] = ap_fn(rec, prec)
    valid = ~np.isnan(ap)
    return {"metric": metric, "name": NAMES[metric],
            "map": float(ap[valid].mean()) if valid.any() else float("nan"),
            "ap": ap, "precision": precision, "recall": recall, "num_gt": npos,
            "num_det": np.bincount(flat.det_labels, minlength=num_classes),
            "images": len(flat.images)}
