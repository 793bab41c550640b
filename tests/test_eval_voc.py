"""VOC devkit AP on hand-computed examples: difficult objects, duplicates, missing classes,
11-point vs area, ties in score, the box convention."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdk.eval.metrics import evaluate_detections
from mdk.eval.voc_ap import voc_ap
from mdk.eval.voc_ap import ap_area, ap_voc07


def det(boxes, scores, labels=None):
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    labels = [0] * len(boxes) if labels is None else labels
    return {"boxes": boxes, "scores": torch.tensor(scores, dtype=torch.float32),
            "labels": torch.tensor(labels, dtype=torch.int64)}


def gt(boxes, labels=None, difficult=None):
    boxes = torch.tensor(boxes, dtype=torch.float32).reshape(-1, 4)
    n = len(boxes)
    return (boxes, torch.tensor([0] * n if labels is None else labels),
            torch.tensor([False] * n if difficult is None else difficult))


REG, DIFF = [0, 0, 10, 10], [40, 40, 60, 60]   # a regular and a difficult object
SMALL_IN_DIFF = [50, 50, 52, 52]                # IoU with DIFF = 4/400: no match


@pytest.mark.parametrize("metric", ["voc07", "voc12"])
def test_issue_example_small_detection_inside_difficult_box(metric):
    """The issue's example. VOC: the small box does not reach IoU 0.5 with the difficult object,
    so it is a false positive, not ignored; scored above the true hit it halves the AP."""
    g = {0: gt([REG, DIFF], difficult=[False, True])}
    r = voc_ap({0: det([REG, SMALL_IN_DIFF], [0.5, 0.9])}, g, 1, metric)
    assert r["ap"][0] == pytest.approx(0.5, abs=1e-12)
    np.testing.assert_allclose(r["precision"][0], [0.0, 0.5])
    np.testing.assert_allclose(r["recall"][0], [0.0, 1.0])   # npos = 1: difficult not counted
    assert r["num_gt"][0] == 1
    # Scored below the true hit, the false positive comes after full recall: AP 1.
    r = voc_ap({0: det([REG, SMALL_IN_DIFF], [0.9, 0.5])}, g, 1, metric)
    assert r["ap"][0] == 1.0


@pytest.mark.parametrize("metric", ["voc07", "voc12"])
def test_detection_matching_a_difficult_object_is_ignored(metric):
    g = {0: gt([REG, DIFF], difficult=[False, True])}
    # On the difficult box (highest score): neither TP nor FP; then the hit; then a miss.
    r = voc_ap({0: det([DIFF, REG, [100, 100, 120, 120]], [0.9, 0.8, 0.7])}, g, 1, metric)
    np.testing.assert_allclose(r["precision"][0], [1.0, 0.5])
    np.testing.assert_allclose(r["recall"][0], [1.0, 1.0])
    assert r["ap"][0] == 1.0
    # Two detections on the difficult box: both ignored (a difficult object is never "taken").
    r = voc_ap({0: det([DIFF, DIFF, REG], [0.9, 0.85, 0.8])}, g, 1, metric)
    assert r["ap"][0] == 1.0 and len(r["precision"][0]) == 1
    # Only a difficult object and a detection on it: no positives -> AP undefined (nan).
    r = voc_ap({0: det([DIFF], [0.9])}, {0: gt([DIFF], difficult=[True])}, 1, metric)
    assert math.isnan(r["ap"][0]) and math.isnan(r["map"])


def test_duplicates_are_false_positives():
    a, b = [0, 0, 10, 10], [20, 20, 30, 30]
    g = {0: gt([a, b])}
    d = {0: det([a, [0, 0, 10, 11], b], [0.9, 0.8, 0.7])}   # second box duplicates the first
    r07, r12 = voc_ap(d, g, 1, "voc07"), voc_ap(d, g, 1, "voc12")
    np.testing.assert_allclose(r07["precision"][0], [1, 0.5, 2 / 3])
    np.testing.assert_allclose(r07["recall"][0], [0.5, 0.5, 1.0])
    # 11-point: t = 0..0.5 -> 1 (6 points), t = 0.6..1 -> 2/3 (5 points).
    assert r07["ap"][0] == pytest.approx((6 + 5 * 2 / 3) / 11, abs=1e-12)
    # Area: 0.5 * 1 + 0.5 * 2/3.
    assert r12["ap"][0] == pytest.approx(0.5 + 0.5 * 2 / 3, abs=1e-12)


def test_highest_overlap_object_even_when_taken_is_the_devkit_rule():
    """The devkit assigns the highest-IoU object whether or not it is taken: a detection whose
    best object is taken is a duplicate (FP) even when another free object overlaps >= 0.5."""
    o1, o2 = [0, 0, 10, 10], [2, 0, 12, 10]          # IoU(o1, o2) = 80/120
    g = {0: gt([o1, o2])}
    second = [0.5, 0, 10.5, 10]                         # IoU 0.90 with o1, 0.74 with o2
    r = voc_ap({0: det([o1, second], [0.9, 0.8])}, g, 1, "voc12")
    np.testing.assert_allclose(r["precision"][0], [1.0, 0.5])
    np.testing.assert_allclose(r["recall"][0], [0.5, 0.5])
    assert r["ap"][0] == pytest.approx(0.5, abs=1e-12)


def test_class_without_detections_and_class_without_ground_truth():
    g = {0: gt([[0, 0, 10, 10], [20, 20, 40, 40]], labels=[0, 1])}
    # Class 0 found, class 1 never detected, class 2 has no ground truth but a detection.
    d = {0: det([[0, 0, 10, 10], [50, 50, 60, 60]], [0.9, 0.8], labels=[0, 2])}
    r = voc_ap(d, g, 3, "voc07")
    assert r["ap"][0] == 1.0 and r["ap"][1] == 0.0 and math.isnan(r["ap"][2])
    assert r["map"] == pytest.approx(0.5)            # nan class left out of the mean
    assert r["num_det"].tolist() == [1, 0, 1] and r["num_gt"].tolist() == [1, 1, 0]
    assert len(r["precision"][1]) == 0
    # An image without detections still counts its objects (recall).
    r = voc_ap({0: det([[0, 0, 10, 10]], [0.9]), 1: det([], [])},
               {0: gt([[0, 0, 10, 10]]), 1: gt([[0, 0, 5, 5]])}, 1, "voc12")
    assert r["ap"][0] == pytest.approx(0.5) and r["images"] == 2


def test_eleven_point_and_area_differ_as_computed_by_hand():
    # Curve: TP, FP, TP, FP, FP, TP over 4 objects (one never found).
    rec = np.array([1, 1, 2, 2, 2, 3]) / 4
    prec = np.array([1, 1 / 2, 2 / 3, 2 / 4, 2 / 5, 3 / 6])
    # 11-point: t<=0.25 -> 1 (t=0,.1,.2), t in (.25,.5] -> 2/3 (t=.3,.4,.5), (.5,.75] -> .5
    # (t=.6,.7), t > .75 -> 0 (t=.8,.9,1).
    assert ap_voc07(rec, prec) == pytest.approx((3 * 1 + 3 * 2 / 3 + 2 * 0.5) / 11, abs=1e-12)
    # Area under the envelope: .25 * 1 + .25 * 2/3 + .25 * .5.
    assert ap_area(rec, prec) == pytest.approx(0.25 + 0.25 * 2 / 3 + 0.125, abs=1e-12)
    assert ap_voc07(np.zeros(0), np.zeros(0)) == 0.0 and ap_area(np.zeros(0), np.zeros(0)) == 0.0


@pytest.mark.parametrize("found, points", [(3, 3), (6, 6), (7, 7), (5, 6), (8, 9)])
def test_eleven_points_are_the_devkit_ports_thresholds(found, points):
    """The devkit ports' thresholds are np.arange(0, 1.1, 0.1): 0.3, 0.6 and 0.7 sit a hair above
    3/10, 6/10, 7/10, so 3 of 10 objects found (recall exactly 0.3) do not count at t = 0.3;
    5/10 and 8/10 count at 0.5 and 0.8, which are exact."""
    objs = [[20 * k, 0, 20 * k + 10, 10] for k in range(10)]
    r = voc_ap({0: det(objs[:found], [0.9 - 0.01 * k for k in range(found)])},
               {0: gt(objs)}, 1, "voc07")
    assert r["recall"][0][-1] == found / 10
    assert r["ap"][0] == pytest.approx(points / 11, abs=1e-12)   # precision 1 up to the recall


def test_ties_in_score_keep_the_given_order():
    g = {0: gt([[0, 0, 10, 10]])}
    poor, good = [0, 0, 4, 10], [0, 0, 10, 10]
    # Equal scores: the first given is ranked first (stable sort, as the MATLAB devkit).
    assert voc_ap({0: det([poor, good], [0.5, 0.5])}, g, 1, "voc12")["ap"][0] == 0.5
    assert voc_ap({0: det([good, poor], [0.5, 0.5])}, g, 1, "voc12")["ap"][0] == 1.0
    # Across images: by ascending image id, whatever the order of the dict.
    g2 = {0: gt([[0, 0, 10, 10]]), 1: gt([[0, 0, 10, 10]])}
    d = {1: det([good], [0.5]), 0: det([poor], [0.5])}
    r = voc_ap(d, g2, 1, "voc12")
    np.testing.assert_allclose(r["precision"][0], [0.0, 0.5])
    d = {1: det([poor], [0.5]), 0: det([good], [0.5])}
    np.testing.assert_allclose(voc_ap(d, g2, 1, "voc12")["precision"][0], [1.0, 0.5])


def test_iou_tie_between_objects_takes_the_first_in_annotation_order():
    left, right = [0, 0, 10, 10], [10, 0, 20, 10]
    g = {0: gt([left, right], difficult=[False, True])}
    middle = [5, 0, 15, 10]               # IoU exactly 1/3 with both; threshold 0.3 here
    assert voc_ap({0: det([middle], [0.9])}, g, 1, "voc12", iou_threshold=0.3)["ap"][0] == 1.0
    g = {0: gt([right, left], difficult=[True, False])}
    r = voc_ap({0: det([middle], [0.9])}, g, 1, "voc12", iou_threshold=0.3)
    assert r["ap"][0] == 0.0 and len(r["precision"][0]) == 0   # matched the difficult one


def test_pixel_offset_one_reproduces_the_devkit_on_integer_boxes():
    g = {0: gt([[1, 1, 6, 6]])}
    d = {0: det([[2, 2, 7, 7]], [0.9])}
    # Continuous: IoU 16/34 = 0.47 (miss); devkit +1 widths: 25/47 = 0.53 (hit).
    assert voc_ap(d, g, 1, "voc12")["ap"][0] == 0.0
    assert voc_ap(d, g, 1, "voc12", pixel_offset=1.0)["ap"][0] == 1.0


def test_labels_separate_classes_and_mean_is_over_classes():
    g = {0: gt([[0, 0, 10, 10], [0, 0, 10, 10]], labels=[0, 1])}
    # Right box, wrong class for class 1: class 0 TP, class 1 has an FP on class 0's object.
    d = {0: det([[0, 0, 10, 10], [0, 0, 10, 10]], [0.9, 0.8], labels=[0, 0])}
    r = evaluate_detections(d, g, 2, "voc07")
    assert r["ap"].tolist() == [1.0, 0.0] and r["map"] == 0.5 and r["name"].startswith("VOC07")


def test_bad_input_is_named():
    g = {0: gt([[0, 0, 10, 10]])}
    with pytest.raises(ValueError, match="image 0: detection labels \\[3\\] outside 0..1"):
        voc_ap({0: det([[0, 0, 1, 1]], [0.5], labels=[3])}, g, 2)
    with pytest.raises(KeyError, match="no entry for image 5"):
        voc_ap({5: det([], [])}, g, 1)
    with pytest.raises(ValueError, match="metric='voc10'"):
        voc_ap({0: det([], [])}, g, 1, metric="voc10")
    with pytest.raises(ValueError, match="not all finite"):
        voc_ap({0: det([[0, 0, 1, 1]], [float("nan")])}, g, 1)
