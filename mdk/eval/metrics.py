"""One entry to every detection metric: VOC devkit AP (voc07 11-point, voc12 area) and COCO-rule
AP, with the same result layout.

    from mdk.eval.metrics import evaluate_detections
    result = evaluate_detections(detections, dataset.gt, num_classes, metric="voc07")
    result["map"], result["name"]          # headline number and what it is
"""
from __future__ import annotations

from typing import Any, Mapping

from mdk.eval.coco_ap import coco_map
from mdk.eval.config import METRICS
from mdk.eval.inputs import GroundTruth
from mdk.eval.voc_ap import voc_ap


def evaluate_detections(detections: Mapping[int, Mapping[str, Any]], ground_truth: GroundTruth,
                        num_classes: int, metric: str = "voc07") -> dict[str, Any]:
    """``voc_ap`` for ``voc07``/``voc12``, ``coco_map`` for ``coco`` (same result layout)."""
    if metric not in METRICS:
        raise ValueError(f"eval.metric={metric!r}: choose one of {list(METRICS)}")
    if metric == "coco":
        return coco_map(detections, ground_truth, num_classes)
    return voc_ap(detections, ground_truth, num_classes, metric=metric)
