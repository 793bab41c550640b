"""One entry to every detection metric: VOC devkit AP (voc07 11-point, voc12 area) and COCO-rule
AP, with the same result layout.

    from mdk.eval.metrics import evaluate_dataset, evaluate_detections
    result = evaluate_dataset(detections, dataset, metric="voc07", box_rule="devkit")
    result = evaluate_detections(detections, dataset.gt, num_classes, metric="voc07")
    result["map"], result["name"]          # headline number and what it is

The box rule (``eval.box_rule``) of ``voc07``/``voc12`` on a dataset's model-input detections:

* ``devkit`` (default): what the VOC devkit scores, and published VOC numbers with it. Each
  detection box is mapped from the model input back to its image's original pixels (``x * width /
  image_size``, ``y * height / image_size``, in float64; the inverse of the resize, as detectron2
  maps its boxes back), and scored against the annotation's boxes as written (VOC XML: 1-based
  inclusive integers) with the devkit's +1 on widths and heights (``pixel_offset=1``). The metric
  decides, not the format: a COCO-format dataset's boxes (``[x, y, x + w, y + h]``, continuous)
  get the +1 too, as they would in a VOC XML; use ``continuous`` or ``coco`` for those.
* ``continuous``: detections and ``dataset.gt`` (the annotation boxes rescaled to the model input)
  in the model-input frame, no +1. Continuous IoU does not change when both frames are scaled, so
  this is also the continuous IoU in original pixels (up to rounding): the rules differ by the +1.

``coco`` is pycocotools' rule whatever ``box_rule`` says (continuous, model-input frame; its AP50
and AP50:95 over all areas do not depend on the frame).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from mdk.eval.coco_ap import coco_map
from mdk.eval.config import BOX_RULES, METRICS
from mdk.eval.inputs import GroundTruth, as_numpy
from mdk.eval.voc_ap import voc_ap


def evaluate_detections(detections: Mapping[int, Mapping[str, Any]], ground_truth: GroundTruth,
                        num_classes: int, metric: str = "voc07",
                        pixel_offset: float = 0.0) -> dict[str, Any]:
    """``voc_ap`` for ``voc07``/``voc12`` (``pixel_offset`` on widths and heights), ``coco_map``
    for ``coco`` (same result layout); the boxes as given, ground truth in the same frame."""
    if metric not in METRICS:
        raise ValueError(f"eval.metric={metric!r}: choose one of {list(METRICS)}")
    if metric == "coco":
        return coco_map(detections, ground_truth, num_classes)
    return voc_ap(detections, ground_truth, num_classes, metric=metric, pixel_offset=pixel_offset)


def to_original(detections: Mapping[int, Mapping[str, Any]], dataset: Any
                ) -> dict[int, dict[str, Any]]:
    """Detections of ``dataset``'s model input (``image_size`` square) in each image's original
    pixels: boxes float64 times ``(width / image_size, height / image_size)``; scores and labels
    as they are."""
    size = float(dataset.image_size)
    out: dict[int, dict[str, Any]] = {}
    for i, d in detections.items():
        width, height = dataset.original_size(i)
        scale = np.array([width / size, height / size] * 2, dtype=np.float64)
        out[i] = {**d, "boxes": as_numpy(d["boxes"], np.float64).reshape(-1, 4) * scale}
    return out


def evaluate_dataset(detections: Mapping[int, Mapping[str, Any]], dataset: Any,
                     metric: str = "voc07", box_rule: str = "devkit") -> dict[str, Any]:
    """``metric`` of ``detections`` in ``dataset``'s model-input frame under ``box_rule`` (see
    the module docstring). ``dataset``: ``image_size``, ``class_names``, ``gt(i)``, and for the
    devkit rule ``original_size(i)`` and ``gt_original(i)`` (mdk.data.dataset)."""
    if box_rule not in BOX_RULES:
        raise ValueError(f"eval.box_rule={box_rule!r}: choose one of {list(BOX_RULES)}")
    num_classes = len(dataset.class_names)
    if metric != "coco" and box_rule == "devkit":
        return evaluate_detections(to_original(detections, dataset), dataset.gt_original,
                                   num_classes, metric, pixel_offset=1.0)
    result = evaluate_detections(detections, dataset.gt, num_classes, metric)
    if metric != "coco":
        result["name"] += " (continuous boxes)"
    return result
