"""A hand-worked loss example (target and prediction grids) shared by the loss tests."""
from __future__ import annotations

import torch

from mdk.models.yolo_codec import encode_target


def hand_example() -> tuple[torch.Tensor, torch.Tensor]:
    """2x2 grid, 2 boxes per cell, 1 class, one image with one object (the loss tests share it).

    Object: centre (0.75, 0.25), w = h = 0.25 (normalised) -> cell row 0, col 1, offset (0.5, 0.5);
    target box [0.625, 0.125, 0.875, 0.375].
    Predictions in that cell:
      box 0: x 0.7, y 0.5, w 0.25, h 0.36, conf 0.6 -> [0.725, 0.07, 0.975, 0.43]:
             intersection 0.15 * 0.25 = 0.0375, union 0.09 + 0.0625 - 0.0375 = 0.115, IoU 15/46
      box 1: x 0.5, y 0.5, w 0.5, h 0.5, conf 0.4 -> contains the target: IoU 0.0625/0.25 = 0.25
      so box 0 is responsible; class score 0.7.
    Empty cell row 1, col 0: confidences 0.2 and -0.1. Everything else 0.
    """
    target = encode_target(torch.tensor([[0.625, 0.125, 0.875, 0.375]]), torch.tensor([0]),
                           grid=2, boxes_per_cell=2, num_classes=1, image_size=1).unsqueeze(0)
    pred = torch.zeros(1, 11, 2, 2, dtype=torch.float64)
    pred[0, 0:5, 0, 1] = torch.tensor([0.7, 0.5, 0.25, 0.36, 0.6], dtype=torch.float64)
    pred[0, 5:10, 0, 1] = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.4], dtype=torch.float64)
    pred[0, 10, 0, 1] = 0.7
    pred[0, 4, 1, 0], pred[0, 9, 1, 0] = 0.2, -0.1
    return pred, target
