"""YOLO loss on hand-made targets."""
from __future__ import annotations

import pytest
import torch

from mdk.models.loss import YoloLoss
from mdk.models.yolo_codec import encode_target
from helpers.loss_example import hand_example

S, C, B = 4, 3, 2


def _target() -> torch.Tensor:
    boxes = torch.tensor([[10.0, 12.0, 40.0, 50.0], [70.0, 80.0, 120.0, 120.0]])
    labels = torch.tensor([0, 2])
    return encode_target(boxes, labels, S, B, C, 128).unsqueeze(0)


def _perfect(t: torch.Tensor) -> torch.Tensor:
    """Box slot 0 predicts the object exactly; slot 1 (not responsible) says 'no object'."""
    p = t.clone()
    p[..., 9] = 0.0
    return p.permute(0, 3, 1, 2)


def test_perfect_prediction_costs_about_zero():
    t = _target()
    terms = YoloLoss(C, B)(_perfect(t), t)
    assert terms["total"].item() < 1e-6


def test_wrong_class_costs_more_than_right_class():
    t = _target()
    good = _perfect(t)
    bad = good.clone()
    obj = t[0, ..., 4] > 0
    cls = bad[0, 5 * B:].permute(1, 2, 0)
    cls[obj] = cls[obj].flip(-1)  # swap class scores in object cells
    bad[0, 5 * B:] = cls.permute(2, 0, 1)
    f = YoloLoss(C, B)
    assert f(bad, t)["cls"] > f(good, t)["cls"] + 0.5
    assert f(bad, t)["total"] > f(good, t)["total"]


def test_false_confidence_in_empty_cell_is_penalised_and_loss_is_per_image_mean():
    t = _target()
    p = _perfect(t)
    empty = (t[0, ..., 4] == 0).nonzero()[0]
    p[0, 4, empty[0], empty[1]] = 1.0
    f = YoloLoss(C, B, lambda_noobj=0.5)
    one = f(p, t)["conf_noobj"].item()
    assert one == torch.nn.functional.smooth_l1_loss(torch.tensor(1.0), torch.tensor(0.0)).item() * 0.5
    # Duplicating the batch leaves the (per-image mean) loss unchanged: split-invariant gradients.
    assert f(torch.cat([p, p]), torch.cat([t, t]))["conf_noobj"].item() == one


def test_gradient_of_a_batch_equals_mean_of_split_gradients():
    torch.manual_seed(0)
    t = torch.cat([_target()] * 4)
    p = torch.rand(4, 5 * B + C, S, S, requires_grad=True)
    f = YoloLoss(C, B)
    f(p, t)["total"].backward()
    g_full = p.grad.clone()
    p.grad = None
    (f(p[:2], t[:2])["total"] / 2 + f(p[2:], t[2:])["total"] / 2).backward()
    assert torch.allclose(g_full, p.grad, atol=1e-7)


def test_hand_computed_example():
    pred, target = hand_example()
    t = YoloLoss(1, 2)(pred, target)
    # smooth-L1 (beta 1) of a difference d < 1 is d^2 / 2.
    # coord: x off by 0.2, h off by 0.11: 5 * (0.02 + 0.00605) = 0.13025
    assert abs(t["coord"].item() - 0.13025) < 1e-12
    # conf_obj: 0.6 -> 1: 0.16 / 2 = 0.08
    assert abs(t["conf_obj"].item() - 0.08) < 1e-12
    # conf_noobj: box 1 (0.4), empty cell (0.2, -0.1): 0.5 * (0.08 + 0.02 + 0.005) = 0.0525
    assert abs(t["conf_noobj"].item() - 0.0525) < 1e-12
    # cls: 0.7 -> 1: 0.045
    assert abs(t["cls"].item() - 0.045) < 1e-12
    assert abs(t["total"].item() - 0.30775) < 1e-12
    # configurable weights: each term scales with its own weight
    w = YoloLoss(1, 2, lambda_coord=1.0, lambda_obj=3.0, lambda_noobj=0.0, lambda_cls=2.0)(pred, target)
    assert abs(w["total"].item() - (0.02605 + 3 * 0.08 + 0 + 2 * 0.045)) < 1e-12


def test_weights_are_checked_by_key():
    import pytest

    with pytest.raises(ValueError, match=r"^loss\.lambda_noobj=-0\.5 must be a finite number >= 0$"):
        YoloLoss(3, 2, lambda_noobj=-0.5)
    with pytest.raises(ValueError, match=r"^loss\.num_classes=0 must be an integer >= 1$"):
        YoloLoss(0, 2)
    with pytest.raises(ValueError, match=r"loss\.beta"):
        YoloLoss(3, 2, beta=0.0)


def test_ignore_iou_leaves_a_good_second_box_without_a_confidence_target():
    """The hand example's object cell with box 0 on the object (IoU 1, responsible) and box 1
    [0.6, 0.1, 0.9, 0.4] around it (IoU 0.0625 / 0.09 = 0.694): with ignore_iou 0.5 box 1's
    confidence 0.4 is not pushed to 0; with null (YOLOv1) or 0.7 it is."""
    pred, target = hand_example()
    pred[0, 0:4, 0, 1] = torch.tensor([0.5, 0.5, 0.25, 0.25], dtype=torch.float64)
    pred[0, 5:9, 0, 1] = torch.tensor([0.5, 0.5, 0.3, 0.3], dtype=torch.float64)
    # only the empty cell (0.2, -0.1): 0.5 * (0.02 + 0.005)
    assert abs(YoloLoss(1, 2)(pred, target)["conf_noobj"].item() - 0.0125) < 1e-12
    # box 1 too: 0.5 * (0.08 + 0.02 + 0.005)
    for ignore in (None, 0.7):
        got = YoloLoss(1, 2, ignore_iou=ignore)(pred, target)["conf_noobj"].item()
        assert abs(got - 0.0525) < 1e-12, ignore
    # the responsible box's own terms are unchanged by the rule
    a, b = YoloLoss(1, 2)(pred, target), YoloLoss(1, 2, ignore_iou=None)(pred, target)
    assert a["conf_obj"].item() == b["conf_obj"].item() and a["coord"].item() == b["coord"].item()
    for bad in (1.5, -0.1, True, "half"):
        with pytest.raises(ValueError, match="loss.ignore_iou"):
            YoloLoss(1, 2, ignore_iou=bad)


def test_one_box_per_cell_hand_computed():
    """gnetdet_small's layout, B = 1: ``[x, y, w, h, conf, classes]``. The one slot is always the
    responsible one, whatever its IoU, and empty cells are the only 'no object' terms.

    Object: centre (0.75, 0.25), 0.4 x 0.4, class 0 of 1, grid 2 -> cell row 0, col 1, offset
    (0.5, 0.5). Prediction there: h 0.2 (off by 0.2: 0.5 * 0.04 = 0.02, x lambda_coord 5 = 0.1),
    conf 0.6 (0.5 * 0.16 = 0.08), class 0.7 (0.5 * 0.09 = 0.045); empty cell (1, 0) conf 0.2
    (0.5 * 0.04 = 0.02, x lambda_noobj 0.5 = 0.01). Total 0.235."""
    target = encode_target(torch.tensor([[0.55, 0.05, 0.95, 0.45]]), torch.tensor([0]),
                           grid=2, boxes_per_cell=1, num_classes=1, image_size=1)
    assert target.shape == (2, 2, 6)
    assert target[0, 1].tolist() == pytest.approx([0.5, 0.5, 0.4, 0.4, 1.0, 1.0])
    pred = torch.zeros(1, 6, 2, 2, dtype=torch.float64)
    pred[0, :, 0, 1] = torch.tensor([0.5, 0.5, 0.4, 0.2, 0.6, 0.7], dtype=torch.float64)
    pred[0, 4, 1, 0] = 0.2
    want = {"coord": 0.1, "conf_obj": 0.08, "conf_noobj": 0.01, "cls": 0.045, "total": 0.235}
    for ignore in (0.5, None):  # nothing for the ignore rule to act on with one slot
        got = YoloLoss(1, 1, ignore_iou=ignore)(pred, target.unsqueeze(0).double())
        assert {k: v.item() for k, v in got.items()} == pytest.approx(want, abs=1e-7)
    # a slot far off the object (IoU 0) is still the responsible one: conf -> 1, box -> the object
    pred[0, 0:4, 0, 1] = torch.tensor([0.0, 0.0, 0.05, 0.05], dtype=torch.float64)
    got = YoloLoss(1, 1)(pred, target.unsqueeze(0).double())
    assert got["conf_obj"].item() == pytest.approx(0.08, abs=1e-7)
    assert got["coord"].item() == pytest.approx(5 * 2 * (0.5 * 0.25 + 0.5 * 0.35 ** 2), abs=1e-6)
