"""One entry to every detection metric: VOC devkit AP (voc07 11-point, voc12 area) and COCO-rule
AP, with the same result layout. Which boxes a VOC metric scores (``eval.box_rule``: ``devkit``
maps the detections back to each image's original pixels, float64 as detectron2 does, and adds
the devkit's +1; ``continuous`` keeps the model-input frame) and why ``coco`` ignores the rule:
docs/pipeline.md (Evaluation).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mdk.eval.coco_ap import coco_map
from mdk.eval.config import check_box_rule, check_metric
from mdk.eval.inputs import GroundTruth, as_numpy
from mdk.eval.voc_ap import voc_ap


def evaluate_detections(detections: Mapping[int, Mapping[str, Any]], ground_truth: GroundTruth,
                        num_classes: int, metric: str = "voc07",
                        pixel_offset: float = 0.0) -> dict[str, Any]:
    """``metric`` of the boxes as given, ground truth in the same frame (``pixel_offset``: VOC's
    +1 on widths and heights)."""
    if check_metric(metric) == "coco":
        return coco_map(detections, ground_truth, num_classes)
    return voc_ap(detections, ground_truth, num_classes, metric=metric, pixel_offset=pixel_offset)


def evaluate_dataset(detections: Mapping[int, Mapping[str, Any]], dataset: Any,
                     metric: str = "voc07", box_rule: str = "devkit") -> dict[str, Any]:
    """``metric`` of ``detections`` in ``dataset``'s model-input frame under ``box_rule``.
    ``dataset`` needs ``image_size``, ``class_names``, ``gt(i)``, and for the devkit rule
    ``original_size(i)`` and ``gt_original(i)``."""
    check_box_rule(box_rule)
    num_classes = len(dataset.class_names)
    if metric != "coco" and box_rule == "devkit":  # the detections in each image's own pixels
        size = float(dataset.image_size)
        original = {}
        for i, d in detections.items():
            width, height = dataset.original_size(i)
            scale = np.array([width / size, height / size] * 2, dtype=np.float64)
            original[i] = {**d, "boxes": as_numpy(d["boxes"], np.float64).reshape(-1, 4) * scale}
        return evaluate_detections(original, dataset.gt_original, num_classes, metric,
                                   pixel_offset=1.0)
    result = evaluate_detections(detections, dataset.gt, num_classes, metric)
    if metric != "coco":
        result["name"] += " (continuous boxes)"
    return result
