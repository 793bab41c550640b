"""COCO-rule AP (torchmetrics ``MeanAveragePrecision``: 101 recall points, at most 100 detections
per image, AP over IoU 0.50:0.05:0.95 as ``map``, at 0.5 as ``map50``), labelled apart from VOC's.
VOC ``difficult`` objects become ``iscrowd``, matched by intersection over the *detection's* area:
a small detection inside a difficult box is ignored here but a false positive under VOC rules.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from mdk.eval.inputs import GroundTruth, flatten

COCO_NAME = "COCO mAP@[.5:.95]"
_RECALL_POINTS = np.linspace(0.0, 1.0, 101)


def coco_map(detections: Mapping[int, Mapping[str, Any]], ground_truth: GroundTruth,
             num_classes: int) -> dict[str, Any]:
    """COCO AP50:95 (``map``) and AP50 (``map50``), per class too, with the IoU-0.5 PR curves.

    Returns ``{"metric": "coco", "name", "map", "map50", "ap" [C] (AP50:95, nan: no ground
    truth), "ap50" [C], "precision"/"recall": [C arrays] (IoU 0.5, 101 recall points), "num_gt"
    [C] (non-crowd objects), "num_det" [C], "images"}``.
    """
    # Imported here: torchmetrics' detection module costs seconds of startup.
    from torchmetrics.detection import MeanAveragePrecision

    flat = flatten(detections, ground_truth, num_classes)  # checks shapes and labels
    preds, gts = [], []
    n = len(flat.images)
    db = np.searchsorted(flat.det_image, np.arange(n + 1))  # both sorted by image position
    gb = np.searchsorted(flat.gt_image, np.arange(n + 1))
    for pos in range(n):
        d, g = slice(db[pos], db[pos + 1]), slice(gb[pos], gb[pos + 1])
        preds.append({"boxes": torch.from_numpy(flat.det_boxes[d]).float(),
                      "scores": torch.from_numpy(flat.det_scores[d]).float(),
                      "labels": torch.from_numpy(flat.det_labels[d])})
        gts.append({"boxes": torch.from_numpy(flat.gt_boxes[g]).float(),
                    "labels": torch.from_numpy(flat.gt_labels[g]),
                    "iscrowd": torch.from_numpy(flat.gt_difficult[g]).long()})
    # Per-class AP is read from the precision array, as COCOeval's summarize does: class_metrics
    # would run the evaluation a second time.
    metric = MeanAveragePrecision(iou_type="bbox", extended_summary=True)
    metric.update(preds, gts)
    r = metric.compute()
    ap = np.full(num_classes, np.nan)
    ap50 = np.full(num_classes, np.nan)
    precision = [np.zeros(0) for _ in range(num_classes)]
    recall = [np.zeros(0) for _ in range(num_classes)]
    # precision[T, R, K, A, M]: IoU thresholds, 101 recall points, classes present (ascending),
    # area ranges ("all" first), max detections (100 last); -1 where undefined.
    prec_all = r["precision"][:, :, :, 0, -1].double().numpy()
    for k, c in enumerate(r["classes"].reshape(-1).tolist()):
        p = prec_all[:, :, k]
        if (p < 0).all():  # no ground truth of this class
            continue
        ap[c] = float(p[p >= 0].mean())
        ap50[c] = float(np.where(p[0] < 0, 0.0, p[0]).mean())
        valid = p[0] >= 0  # COCOeval fills 0 past the highest recall; -1 is never expected here
        precision[c], recall[c] = p[0][valid], _RECALL_POINTS[valid]
    npos = np.bincount(flat.gt_labels[~flat.gt_difficult], minlength=num_classes)
    means = [float(r[k]) if float(r[k]) >= 0 else float("nan")  # -1: no ground truth at all
             for k in ("map", "map_50")]
    return {"metric": "coco", "name": COCO_NAME, "map": means[0], "map50": means[1], "ap": ap,
            "ap50": ap50, "precision": precision, "recall": recall, "num_gt": npos,
            "num_det": np.bincount(flat.det_labels, minlength=num_classes),
            "images": len(flat.images)}
