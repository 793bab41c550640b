"""YOLO loss on hand-made targets."""
from __future__ import annotations

import torch

from mdk.models.loss import YoloLoss
from mdk.models.yolo_codec import encode_target

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
