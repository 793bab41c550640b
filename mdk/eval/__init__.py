"""Detection evaluation: VOC devkit AP (voc07 11-point, voc12 area) and COCO-rule AP, reports.

    from mdk.eval import evaluate_detections, scalars, ap_table
    result = evaluate_detections(detections, dataset.gt, num_classes, metric="voc07")
    result["map"], result["name"]          # headline number and what it is
    sink.log(scalars(result, class_names), step); sink.log_text("val/ap", ap_table(...), step)

Reports (PR curves, detection grids) are in :mod:`mdk.eval.plots` and :mod:`mdk.eval.grid`;
they import matplotlib/torchvision drawing only when called.
"""
from __future__ import annotations

from typing import Any, Mapping

from mdk.eval.inputs import GroundTruth
from mdk.eval.summary import METRICS, ap_table, headline_key, scalars
from mdk.eval.voc import voc_ap


def evaluate_detections(detections: Mapping[int, Mapping[str, Any]], ground_truth: GroundTruth,
                        num_classes: int, metric: str = "voc07") -> dict[str, Any]:
    """``voc_ap`` for ``voc07``/``voc12``, ``coco_map`` for ``coco`` (same result layout)."""
    if metric not in METRICS:
        raise ValueError(f"eval.metric={metric!r}: choose one of {list(METRICS)}")
    if metric == "coco":
        from mdk.eval.coco import coco_map

        return coco_map(detections, ground_truth, num_classes)
    return voc_ap(detections, ground_truth, num_classes, metric=metric)


__all__ = ["METRICS", "GroundTruth", "ap_table", "evaluate_detections", "headline_key", "scalars",
           "voc_ap"]
