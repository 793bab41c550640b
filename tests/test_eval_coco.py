"""COCO-rule AP via torchmetrics: labelled as COCO, the issue's VOC/COCO difference, per-class."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdk.eval.metrics import evaluate_detections
from mdk.eval.scalars import scalars


def _set(seed, images=30, classes=3):
    rng = np.random.default_rng(seed)
    dets, gts = {}, {}
    for i in range(images):
        n = int(rng.integers(1, 5))
        xy = rng.uniform(0, 80, (n, 2))
        b = np.concatenate([xy, xy + rng.uniform(8, 40, (n, 2))], 1)
        labels = rng.integers(0, classes, n)
        gts[i] = (torch.tensor(b), torch.tensor(labels), torch.tensor(rng.random(n) < 0.2))
        k = rng.integers(0, n, 8)
        dets[i] = {"boxes": torch.tensor(b[k] + rng.normal(0, 4, (8, 4))).float(),
                   "scores": torch.tensor(rng.random(8)).float(),
                   "labels": torch.tensor(labels[k])}
    return dets, gts


def test_issue_example_coco_one_voc_one_half():
    """One regular and one difficult object; the true hit, and a higher-scored small box inside
    the difficult one. COCO matches the small box to the crowd region (intersection over the
    detection's area = 1) and ignores it: 1.0. VOC: IoU 0.01 with it, a false positive: 0.5."""
    d = {0: {"boxes": torch.tensor([[0.0, 0, 10, 10], [50, 50, 52, 52]]),
             "scores": torch.tensor([0.5, 0.9]), "labels": torch.tensor([0, 0])}}
    g = {0: (torch.tensor([[0.0, 0, 10, 10], [40, 40, 60, 60]]), torch.tensor([0, 0]),
             torch.tensor([False, True]))}
    coco = evaluate_detections(d, g, 1, "coco")
    assert coco["map50"] == pytest.approx(1.0) and coco["map"] == pytest.approx(1.0)
    assert evaluate_detections(d, g, 1, "voc07")["map"] == pytest.approx(0.5)
    assert evaluate_detections(d, g, 1, "voc12")["map"] == pytest.approx(0.5)


def test_per_class_numbers_agree_with_torchmetrics_class_metrics():
    from torchmetrics.detection import MeanAveragePrecision

    dets, gts = _set(0)
    r = evaluate_detections(dets, gts, 4, "coco")   # class 3 never appears: nan
    preds = [dets[i] for i in sorted(dets)]
    targets = [{"boxes": gts[i][0].float(), "labels": gts[i][1], "iscrowd": gts[i][2].long()}
               for i in sorted(gts)]
    for thresholds, key in ((None, "ap"), ([0.5], "ap50")):
        m = MeanAveragePrecision(iou_type="bbox", class_metrics=True, iou_thresholds=thresholds)
        m.update(preds, targets)
        ref = m.compute()
        np.testing.assert_allclose(r[key][:3], ref["map_per_class"].numpy(), atol=1e-6)
        assert r["map" if key == "ap" else "map50"] == pytest.approx(float(ref["map"]), abs=1e-7)
    assert math.isnan(r["ap"][3])
    assert r["name"] == "COCO mAP@[.5:.95]"
    # PR curve at IoU 0.5 on COCO's 101 recall points.
    assert len(r["recall"][0]) == 101 and r["recall"][0][-1] == 1.0


def test_scalars_name_the_metric():
    dets, gts = _set(1)
    names = ["a", "b", "c"]
    s = scalars(evaluate_detections(dets, gts, 3, "coco"), names)
    assert set(s) == {"map_coco", "map50_coco", "ap_coco/a", "ap_coco/b", "ap_coco/c"}
    s = scalars(evaluate_detections(dets, gts, 3, "voc12"), names, per_class=False)
    assert set(s) == {"map50_voc12"}
