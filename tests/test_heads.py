"""Heads (mdk.models.heads): the anchor head's targets, decoding and loss; the YOLOv1 head is the
codec of tests/test_codec.py behind the same interface."""
from __future__ import annotations

import pytest
import torch
from torchvision.ops import box_iou

from mdk.models.anchor_loss import AnchorLoss
from mdk.models.heads import AnchorHead, YoloV1Head
from mdk.models.yolo_codec import decode, encode_target

SIZE, S, C = 224, 7, 3
PRIORS = [[0.06, 0.08], [0.16, 0.2], [0.34, 0.4]]


def head(**kw) -> AnchorHead:
    return AnchorHead(C, PRIORS, **kw)


def as_output(target: torch.Tensor) -> torch.Tensor:
    return target.permute(2, 0, 1).unsqueeze(0)        # [S, S, D] -> [1, D, S, S]


def test_yolov1_head_is_the_codec():
    h = YoloV1Head(5, 2)
    boxes, labels = torch.tensor([[10.0, 20.0, 90.0, 150.0]]), torch.tensor([3])
    t = h.encode(boxes, labels, 6, 192)
    assert h.channels == 15 and torch.equal(t, encode_target(boxes, labels, 6, 2, 5, 192))
    got, want = h.decode(as_output(t), 192)[0], decode(as_output(t), 192, boxes_per_cell=2)[0]
    assert all(torch.equal(got[k], want[k]) for k in ("boxes", "scores", "labels"))


@pytest.mark.parametrize("neighbours", [False, True])
def test_round_trip_keeps_two_objects_of_one_cell(neighbours):
    """A platelet and a red cell whose centres share a cell both survive encode -> decode
    (YOLOv1 keeps one object per cell); boxes come back to float precision."""
    boxes = torch.tensor([[40.0, 40.0, 76.0, 84.0],      # centre (58, 62): cell (1, 1)
                          [52.0, 55.0, 66.0, 72.0],      # centre (59, 63.5): the same cell
                          [120.0, 100.0, 200.0, 190.0]])
    labels = torch.tensor([1, 2, 0])
    h = head(neighbours=neighbours)
    t = h.encode(boxes, labels, S, SIZE)
    assert t.shape == (S, S, 3 * (5 + C)) and t.min() >= 0 and t.max() <= 1
    det = h.decode(as_output(t), SIZE, conf_thresh=0.5)[0]
    iou = box_iou(boxes, det["boxes"])
    best = iou.argmax(1)
    assert iou.max(1).values.min() > 0.999
    assert det["labels"][best].tolist() == labels.tolist()
    assert ((det["scores"] >= 0) & (det["scores"] <= 1)).all()
    v1 = YoloV1Head(C, 1).decode(as_output(YoloV1Head(C, 1).encode(boxes, labels, S, SIZE)), SIZE)
    assert len(v1[0]["boxes"]) == 2                     # the YOLOv1 grid lost one of them


def test_assignment_counts_and_order_independence():
    """An object is trained on each prior within match_ratio (else its best one), in its centre
    cell and, with neighbours, the nearer horizontal and vertical neighbour; the result does not
    depend on the annotation order."""
    box = torch.tensor([[40.0, 40.0, 76.0, 84.0]])   # 36 x 44 px: ratio < 2 to prior 1 only
    t = head(match_ratio=2.0, neighbours=False).encode(box, torch.tensor([1]), S, SIZE)
    pos = t.view(S, S, 3, 5 + C)[..., 4] > 0
    assert pos.sum() == 1 and pos[1, 1, 1]
    t = head(match_ratio=2.0, neighbours=True).encode(box, torch.tensor([1]), S, SIZE)
    pos = t.view(S, S, 3, 5 + C)[..., 4] > 0
    assert pos.sum() == 3 and pos[1, 1, 1] and pos[1, 2, 1] and pos[2, 1, 1]  # centre (1.81, 1.94)
    t = head(match_ratio=1.01, neighbours=False).encode(torch.tensor([[0.0, 0.0, 224.0, 224.0]]),
                                                       torch.tensor([0]), S, SIZE)
    assert (t.view(S, S, 3, 5 + C)[..., 4] > 0).sum() == 1   # no prior within 1.01: the best one
    g = torch.Generator().manual_seed(0)
    xy = torch.rand(30, 2, generator=g) * 180
    boxes = torch.cat([xy, xy + 10 + torch.rand(30, 2, generator=g) * 40], 1)
    labels = torch.randint(0, C, (30,), generator=g)
    perm = torch.randperm(30, generator=g)
    h = head(neighbours=True)
    assert torch.equal(h.encode(boxes, labels, S, SIZE), h.encode(boxes[perm], labels[perm], S, SIZE))


def test_sizes_are_log_coded_so_a_level_is_a_relative_step():
    """One 5-bit level of the output (1/31 at cap 1) changes a small and a large box by the same
    factor: size_range ** (2/31), 12 % at the default size_range 6."""
    h = head(neighbours=False)
    for box, prior in (([100.0, 100.0, 113.0, 118.0], 0), ([50.0, 50.0, 126.0, 140.0], 2)):
        t = h.encode(torch.tensor([box]), torch.tensor([0]), S, SIZE).view(S, S, 3, 5 + C)
        cell = t[..., prior, 4].nonzero()[0]
        a = h.boxes(t.unsqueeze(0))[0, cell[0], cell[1], prior]
        t[cell[0], cell[1], prior, 2] += 1 / 31
        b = h.boxes(t.unsqueeze(0))[0, cell[0], cell[1], prior]
        ratio = (b[2] - b[0]) / (a[2] - a[0])
        assert ratio.item() == pytest.approx(6.0 ** (2 / 31), rel=1e-4)


def test_bad_priors_and_ranges_are_one_line():
    with pytest.raises(ValueError, match=r"^head.anchors=\[\[0.1, 0.1, 0.1\]\] must be a list of \[width, height\]"):
        AnchorHead(C, [[0.1, 0.1, 0.1]])
    with pytest.raises(ValueError, match=r"^head.anchors=\[\[0.1, 2.0\]\] must be a list of "):
        AnchorHead(C, [[0.1, 2.0]])
    with pytest.raises(ValueError, match=r"^head.size_range=1 must be a number > 1$"):
        AnchorHead(C, PRIORS, size_range=1)


def test_loss_is_zero_for_the_target_and_split_invariant():
    h = head(neighbours=True)
    g = torch.Generator().manual_seed(1)
    targets = []
    for n in (3, 7, 1, 0):
        xy = torch.rand(n, 2, generator=g) * 150
        boxes = torch.cat([xy, xy + 12 + torch.rand(n, 2, generator=g) * 60], 1)
        targets.append(h.encode(boxes, torch.randint(0, C, (n,), generator=g), S, SIZE))
    target = torch.stack(targets)
    loss = AnchorLoss(h)
    perfect = loss(target.permute(0, 3, 1, 2), target)
    assert all(v.item() == 0 for v in perfect.values())
    pred = (target.permute(0, 3, 1, 2) + 0.3 * torch.randn(4, 24, S, S, generator=g)).double()
    pred.requires_grad_(True)
    whole = loss(pred, target)
    assert set(whole) == {"box", "conf_obj", "conf_noobj", "cls", "total"}
    halves = [loss(pred[i:i + 2], target[i:i + 2])["total"] for i in (0, 2)]
    torch.testing.assert_close(whole["total"], (halves[0] + halves[1]) / 2, rtol=1e-12, atol=0)
    whole["total"].backward()
    assert pred.grad.abs().sum() > 0


def test_ignore_rule_spares_a_good_duplicate():
    """A prior that is no object's but whose box overlaps one by more than ignore_iou gets no
    confidence target; with ignore_iou=null every such prior is pushed to 0."""
    h = head(neighbours=False, match_ratio=1.01)   # the object is its best prior's only
    box = torch.tensor([[40.0, 40.0, 76.0, 84.0]])
    t = h.encode(box, torch.tensor([1]), S, SIZE)[None]
    pred = t.clone().view(1, S, S, 3, 5 + C)
    alone = AnchorHead(C, PRIORS[2:]).encode(box, torch.tensor([1]), S, SIZE).view(S, S, 5 + C)
    pred[0, 1, 1, 2, :4] = alone[1, 1, :4]        # prior 2 of the object's cell: exactly its box
    pred[..., 4] = torch.where(pred[..., 4] > 0, 1.0, 0.8)
    pred = pred.view(1, S, S, -1).permute(0, 3, 1, 2)
    spared = AnchorLoss(h, ignore_iou=0.2)(pred, t)["conf_noobj"]
    plain = AnchorLoss(h, ignore_iou=None)(pred, t)["conf_noobj"]
    assert plain.item() - spared.item() == pytest.approx(0.5 * 0.5 * 0.8 ** 2, abs=1e-5)
    with pytest.raises(ValueError, match=r"^loss.head: loss=anchors reads the box priors"):
        AnchorLoss(YoloV1Head(C, 1))
