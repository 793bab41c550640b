"""YOLOv1 target encoding and prediction decoding for the GNetDet output grid.

Layout per cell (model output channels, target last dimension): box ``b`` occupies ``5b..5b+4`` =
``x, y`` (box centre offset inside the cell, 0..1), ``w, h`` (box size relative to the image,
0..1), ``conf``; then ``C`` class scores. Row index = y cell, column index = x cell.
"""
from __future__ import annotations

import torch
from torchvision.ops import batched_nms

from mdk.models.scores import read_scores


def nms(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, conf_thresh: float,
        nms_iou: float, max_det: int) -> list[dict]:
    """Per image: drop scores <= conf_thresh and empty boxes, per-class NMS, top ``max_det``."""
    out = []
    for i in range(boxes.shape[0]):
        b = boxes[i]
        keep = (scores[i] > conf_thresh) & (b[:, 2] > b[:, 0]) & (b[:, 3] > b[:, 1])
        bx, sc, lb = b[keep], scores[i][keep], labels[i][keep]
        kept = batched_nms(bx, sc, lb, nms_iou)[:max_det]
        out.append({"boxes": bx[kept], "scores": sc[kept], "labels": lb[kept]})
    return out


def encode_target(boxes: torch.Tensor, labels: torch.Tensor, grid: int, boxes_per_cell: int,
                  num_classes: int, image_size: float, class_region: float = 0.0) -> torch.Tensor:
    """Encode ``boxes`` ``[N, 4]`` xyxy (pixels of an ``image_size`` square; 1 for normalised) and
    ``labels`` ``[N]`` into ``[S, S, 5B + C]``.

    All ``B`` slots of the centre's cell get the box with ``conf = 1`` (the loss picks the
    responsible one). One object per cell (YOLOv1): the larger box wins, whatever the order.
    ``class_region`` > 0: the class is also the target of every other cell whose centre lies in
    the middle ``class_region`` of the object's box (its width and height times it; the smaller
    object where two overlap), with no box there: more cells learn what an object is.
    """
    s, b, c = grid, boxes_per_cell, num_classes
    target = torch.zeros(s, s, 5 * b + c, dtype=torch.float32)
    boxes = torch.as_tensor(boxes, dtype=torch.float32).reshape(-1, 4) / float(image_size)
    labels = torch.as_tensor(labels, dtype=torch.int64).reshape(-1)
    if boxes.shape[0] != labels.shape[0]:
        raise ValueError(f"encode_target: {boxes.shape[0]} boxes but {labels.shape[0]} labels")
    if labels.numel() and (labels.min() < 0 or labels.max() >= c):
        raise ValueError(f"encode_target: labels {labels.tolist()} outside 0..{c - 1}")
    wh = (boxes[:, 2:] - boxes[:, :2]).clamp(0, 1)
    centre = ((boxes[:, :2] + boxes[:, 2:]) / 2).clamp(0, 1 - 1e-6)
    cell = (centre * s).floor().long()
    offset = centre * s - cell
    order = torch.argsort(wh.prod(1), stable=True).tolist()
    if class_region > 0:  # larger first, so a smaller object's cells are its own
        mid = (torch.arange(s, dtype=torch.float32) + 0.5) / s
        for k in reversed(order):
            half = wh[k] * class_region / 2
            cols = ((mid - centre[k, 0]).abs() <= half[0]).nonzero().flatten().tolist()
            rows = ((mid - centre[k, 1]).abs() <= half[1]).nonzero().flatten().tolist()
            for row in rows:
                for col in cols:
                    target[row, col, 5 * b:] = 0
                    target[row, col, 5 * b + labels[k]] = 1
    # Smallest first, so a larger box in the same cell overwrites it.
    for k in order:
        col, row = cell[k].tolist()
        box = torch.cat([offset[k], wh[k], torch.ones(1)])
        target[row, col, :5 * b] = box.repeat(b)
        target[row, col, 5 * b:] = 0
        target[row, col, 5 * b + labels[k]] = 1
    return target


def cell_xyxy(b: torch.Tensor) -> torch.Tensor:
    """``b`` ``[N, S, S, B, >=4]`` (x, y in the cell, w, h of the image) -> normalised xyxy
    ``[N, S, S, B, 4]``."""
    s = b.shape[1]
    idx = torch.arange(s, dtype=b.dtype, device=b.device)
    cx = (idx.view(1, 1, s, 1) + b[..., 0]) / s
    cy = (idx.view(1, s, 1, 1) + b[..., 1]) / s
    w, h = b[..., 2], b[..., 3]
    return torch.stack([cx - w / 2, cy - h / 2, cx + w / 2, cy + h / 2], -1)


@torch.no_grad()
def decode(pred: torch.Tensor, image_size: float, conf_thresh: float = 0.01,
           nms_iou: float = 0.5, max_det: int = 100, *, boxes_per_cell: int,
           conf_scores: str = "linear", class_scores: str = "linear",
           score_gain: float = 10.0) -> list[dict]:
    """Raw outputs ``[N, 5B + C, S, S]`` -> ``[{"boxes": [K, 4] xyxy pixels, "scores": [K],
    "labels": [K] int64}]`` after per-class NMS (docs/pipeline.md, Heads). ``boxes_per_cell`` has
    no default: a wrong B reads class channels as boxes without error whenever 5B + C still fits.
    ``score = conf x best class score``, each read by :func:`read_scores`.
    """
    n, ch, s, s2 = pred.shape
    b = boxes_per_cell
    if s != s2 or ch <= 5 * b:
        raise ValueError(f"decode: expected [N, 5*{b}+C, S, S], got {list(pred.shape)}")
    pred = pred.float()
    p = pred[:, :5 * b].reshape(n, b, 5, s, s).permute(0, 3, 4, 1, 2)   # [N, S(row), S(col), B, 5]
    boxes = (cell_xyxy(p) * image_size).clamp(0, image_size).reshape(n, -1, 4)
    # Linear reading: the output layer is linear in float stages, so negative conf/class values
    # mean 'no' (two negatives must not multiply into a confident detection), values over 1 'yes'.
    best, cls = pred[:, 5 * b:].max(1)                                    # [N, S, S]
    cls_score = read_scores(best, class_scores, score_gain)  # monotone: the best stays best
    conf = read_scores(p[..., 4], conf_scores, score_gain)
    scores = (conf * cls_score.unsqueeze(-1)).reshape(n, -1)
    cls = cls.unsqueeze(-1).expand(n, s, s, b).reshape(n, -1)
    return nms(boxes, scores, cls, conf_thresh, nms_iou, max_det)
