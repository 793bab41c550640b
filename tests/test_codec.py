"""YOLOv1 target encoding / decoding."""
import pytest
import torch

from mdk.models.yolo_codec import decode, encode_target

S, B, C, SIZE = 6, 2, 5, 192


def perfect(target: torch.Tensor) -> torch.Tensor:
    return target.permute(2, 0, 1).unsqueeze(0)       # [S,S,5B+C] -> [1,5B+C,S,S]


def test_encode_layout():
    # centre (48, 80) -> column 1, row 2 (cells of 32 px); offset (0.5, 0.5)
    t = encode_target(torch.tensor([[32.0, 64.0, 64.0, 96.0]]), torch.tensor([3]), S, B, C, SIZE)
    assert t.shape == (S, S, 5 * B + C)
    cell = t[2, 1]
    expected_box = torch.tensor([0.5, 0.5, 32 / SIZE, 32 / SIZE, 1.0])
    torch.testing.assert_close(cell[:5], expected_box)
    torch.testing.assert_close(cell[5:10], expected_box)
    assert cell[10:].tolist() == [0, 0, 0, 1, 0]
    t[2, 1] = 0
    assert t.abs().sum() == 0                          # nothing anywhere else


def test_normalised_boxes_with_image_size_one():
    px = encode_target(torch.tensor([[10.0, 20.0, 90.0, 150.0]]), torch.tensor([1]), S, B, C, SIZE)
    norm = encode_target(torch.tensor([[10, 20, 90, 150]]) / SIZE, torch.tensor([1]), S, B, C, 1)
    torch.testing.assert_close(px, norm)


@pytest.mark.parametrize("b", [1, 2])  # gnetdet_small, gnetdet
def test_round_trip_returns_original_boxes_and_labels(b):
    boxes = torch.tensor([[5.0, 7.0, 60.0, 50.0], [100.0, 90.0, 190.0, 180.0],
                          [70.0, 10.0, 110.0, 40.0], [0.0, 150.0, 30.0, 192.0]])
    labels = torch.tensor([0, 4, 2, 1])
    target = encode_target(boxes, labels, S, b, C, SIZE)
    assert target.shape == (S, S, 5 * b + C)
    det = decode(perfect(target), SIZE, boxes_per_cell=b)[0]
    order = torch.argsort(det["boxes"][:, 0])
    ref = torch.argsort(boxes[:, 0])
    torch.testing.assert_close(det["boxes"][order], boxes[ref], atol=1e-4, rtol=0)
    assert det["labels"][order].tolist() == labels[ref].tolist()
    torch.testing.assert_close(det["scores"], torch.ones(4))   # duplicates of B slots removed


def test_same_cell_keeps_larger_box_regardless_of_order():
    small, big = [40.0, 40.0, 50.0, 50.0], [30.0, 30.0, 60.0, 62.0]   # both centres in cell (1,1)
    for boxes, labels in (([small, big], [0, 1]), ([big, small], [1, 0])):
        t = encode_target(torch.tensor(boxes), torch.tensor(labels), S, B, C, SIZE)
        det = decode(perfect(t), SIZE, boxes_per_cell=B)[0]
        assert det["labels"].tolist() == [1]
        torch.testing.assert_close(det["boxes"][0], torch.tensor(big), atol=1e-4, rtol=0)


def test_encode_rejects_bad_labels():
    with pytest.raises(ValueError, match="outside 0..4"):
        encode_target(torch.tensor([[0.0, 0, 10, 10]]), torch.tensor([5]), S, B, C, SIZE)
    with pytest.raises(ValueError, match="2 boxes but 1 labels"):
        encode_target(torch.zeros(2, 4), torch.tensor([0]), S, B, C, SIZE)


def cell_pred(x, y, w, h, conf, cls_scores, row, col, pred=None):
    pred = torch.zeros(1, 5 * B + C, S, S) if pred is None else pred
    pred[0, 0:5, row, col] = torch.tensor([x, y, w, h, conf])
    pred[0, 10:, row, col] = torch.tensor(cls_scores)
    return pred


def test_decode_scores_nms_and_threshold():
    # Two overlapping boxes (centres 6.4 px apart) in neighbouring cells, plus one below threshold.
    def scene(second_class: int) -> torch.Tensor:
        p = cell_pred(0.9, 0.5, 0.3, 0.3, 0.8, [0, 0, 0.9, 0.1, 0], row=2, col=2)
        scores = [0.0] * C
        scores[second_class] = 0.5
        p = cell_pred(0.1, 0.5, 0.3, 0.3, 0.9, scores, row=2, col=3, pred=p)
        return cell_pred(0.5, 0.5, 0.2, 0.2, 0.1, [0.05, 0, 0, 0, 0], row=0, col=0, pred=p)

    same = decode(scene(2), SIZE, conf_thresh=0.01, nms_iou=0.5, boxes_per_cell=B)[0]
    assert same["labels"].tolist() == [2]                        # NMS kept the higher score
    torch.testing.assert_close(same["scores"], torch.tensor([0.72]))   # 0.8 conf x 0.9 class
    cx, cy = (2 + 0.9) / S * SIZE, (2 + 0.5) / S * SIZE
    half = 0.15 * SIZE
    torch.testing.assert_close(same["boxes"][0], torch.tensor(
        [cx - half, cy - half, cx + half, cy + half]), atol=1e-3, rtol=0)

    other = decode(scene(3), SIZE, conf_thresh=0.01, nms_iou=0.5, boxes_per_cell=B)[0]   # NMS is per class
    assert other["labels"].tolist() == [2, 3]
    torch.testing.assert_close(other["scores"], torch.tensor([0.72, 0.45]))
    loose = decode(scene(3), SIZE, conf_thresh=0.001, boxes_per_cell=B)[0]               # 0.1 x 0.05 = 0.005 passes
    assert loose["labels"].tolist() == [2, 3, 0]


def test_decode_max_det_batch_and_clipping():
    p = torch.zeros(3, 5 * B + C, S, S)
    p[0, 0:2] = 0.5
    p[0, 2:4] = 0.1            # small boxes in every cell: no overlap
    p[0, 4] = torch.arange(S * S, dtype=torch.float32).view(S, S) / 100 + 0.05
    p[0, 10] = 1.0
    p[2, 0:5, 0, 0] = torch.tensor([0.0, 0.0, 1.0, 1.0, 1.0])   # box centred on the corner
    p[2, 11, 0, 0] = 1.0
    out = decode(p, SIZE, max_det=7, boxes_per_cell=B)
    assert len(out) == 3 and len(out[0]["boxes"]) == 7 and len(out[1]["boxes"]) == 0
    assert out[0]["scores"].tolist() == sorted(out[0]["scores"].tolist(), reverse=True)
    torch.testing.assert_close(out[0]["scores"][0], torch.tensor(0.4))
    torch.testing.assert_close(out[2]["boxes"][0], torch.tensor([0.0, 0.0, 96.0, 96.0]))
    assert out[2]["labels"].tolist() == [1]
    with pytest.raises(ValueError, match="expected"):
        decode(torch.zeros(1, 10, S, S), SIZE, boxes_per_cell=B)


def test_scores_are_in_zero_to_one_when_outputs_overshoot():
    """A linear output regressed to 0/1 overshoots; each factor is clamped, so a score is 0..1
    and an overshooting detection ranks with a sure one, not above it."""
    p = torch.zeros(1, 5 * B + C, S, S)
    p[0, 0:5, 1, 1] = torch.tensor([0.5, 0.5, 0.2, 0.2, 1.6])   # conf 1.6
    p[0, 5 * B + 2, 1, 1] = 1.3                                  # class score 1.3
    p[0, 0:5, 3, 3] = torch.tensor([0.5, 0.5, 0.2, 0.2, 0.5])
    p[0, 5 * B + 1, 3, 3] = 0.8
    det = decode(p, SIZE, boxes_per_cell=B)[0]
    assert det["scores"].tolist() == pytest.approx([1.0, 0.4])
    assert det["labels"].tolist() == [2, 1]
