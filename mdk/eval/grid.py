"""A grid of val images with ground truth and detections drawn, as one uint8 image (cheap: meant
for rank 0 at each evaluation)."""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch
from PIL import Image
from torchvision.utils import draw_bounding_boxes, make_grid

from mdk.eval.inputs import as_numpy

GT_COLOR = (0, 200, 0)            # ground truth: green
DIFFICULT_COLOR = (230, 200, 0)   # difficult ground truth: yellow (ignored by VOC AP)
DET_COLOR = (230, 40, 40)         # detections: red, labelled "class score"


def _ordered(boxes: torch.Tensor) -> torch.Tensor:
    """x1 <= x2, y1 <= y2 (torchvision refuses inverted boxes; a raw prediction may be one)."""
    return torch.cat([torch.minimum(boxes[:, :2], boxes[:, 2:]),
                      torch.maximum(boxes[:, :2], boxes[:, 2:])], 1)


def _draw_one(image: torch.Tensor, det: Mapping[str, Any], gt: Sequence[Any],
              names: Sequence[str], scale: int, score_thresh: float, max_dets: int
              ) -> torch.Tensor:
    if scale > 1:  # nearest upscaling: labels stay legible on 64-px images
        image = image.repeat_interleave(scale, 1).repeat_interleave(scale, 2)
    g_boxes = _ordered(torch.as_tensor(as_numpy(gt[0], "float32")).reshape(-1, 4) * scale)
    g_diff = as_numpy(gt[2], bool).reshape(-1) if len(gt) > 2 else None
    if len(g_boxes):
        colors = [DIFFICULT_COLOR if g_diff is not None and g_diff[k] else GT_COLOR
                  for k in range(len(g_boxes))]
        image = draw_bounding_boxes(image, g_boxes, colors=colors, width=2)
    scores = torch.as_tensor(as_numpy(det["scores"], "float32")).reshape(-1)
    keep = torch.nonzero(scores >= score_thresh).flatten()
    keep = keep[torch.argsort(scores[keep], descending=True, stable=True)][:max_dets]
    if len(keep):
        boxes = _ordered(torch.as_tensor(as_numpy(det["boxes"], "float32")).reshape(-1, 4)[keep]
                         * scale)
        labels = as_numpy(det["labels"], "int64").reshape(-1)[keep.numpy()]
        text = [f"{names[int(c)] if int(c) < len(names) else int(c)} {float(s):.2f}"
                for c, s in zip(labels, scores[keep])]
        image = draw_bounding_boxes(image, boxes, labels=text, colors=DET_COLOR, width=2,
                                    label_background_colors=DET_COLOR, label_colors="white",
                                    fill_labels=True)
    return image


def detection_grid(images: torch.Tensor | Sequence[torch.Tensor],
                   detections: Sequence[Mapping[str, Any]], ground_truth: Sequence[Sequence[Any]],
                   class_names: Sequence[str], score_thresh: float = 0.3, max_dets: int = 20,
                   nrow: int = 4, min_size: int = 256) -> torch.Tensor:
    """``images`` uint8 ``[N, 3, H, W]``, their detections ``{boxes, scores, labels}`` and ground
    truth ``(boxes, labels[, difficult])`` (xyxy in the image's pixels) -> uint8 ``[3, H', W']``.
    At most ``max_dets`` detections per image; images below ``min_size`` are upscaled so labels
    can be read."""
    if not (len(images) == len(detections) == len(ground_truth)):
        raise ValueError(f"detection_grid: {len(images)} images, {len(detections)} detections and "
                         f"{len(ground_truth)} ground truths; give one of each per image")
    if len(images) == 0:
        raise ValueError("detection_grid: no images to draw")
    tiles = []
    for img, det, gt in zip(images, detections, ground_truth):
        if img.dtype != torch.uint8 or img.ndim != 3 or img.shape[0] != 3:
            raise ValueError(f"detection_grid: images must be uint8 [3, H, W], got "
                             f"{img.dtype} {tuple(img.shape)}")
        scale = max(1, math.ceil(min_size / max(1, min(img.shape[1:]))))
        tiles.append(_draw_one(img.cpu(), det, gt, class_names, scale, score_thresh, max_dets))
    return make_grid(tiles, nrow=min(nrow, len(tiles)), padding=4, pad_value=255)


def dataset_grid(dataset: Any, detections: Mapping[int, Mapping[str, Any]],
                 class_names: Sequence[str], count: int = 8, **kwargs: Any) -> torch.Tensor:
    """:func:`detection_grid` of the ``count`` lowest-indexed evaluated images: the same images at
    every evaluation, so the grids compare over training."""
    chosen = sorted(detections)[:count]
    return detection_grid([dataset.image(i) for i in chosen], [detections[i] for i in chosen],
                          [dataset.gt(i) for i in chosen], class_names, **kwargs)


def save_png(image: torch.Tensor, path: str | Path) -> Path:
    """Write a uint8 ``[3, H, W]`` image as PNG with Pillow (torchvision.io's encoding is
    deprecated)."""
    if image.dtype != torch.uint8 or image.ndim != 3 or image.shape[0] != 3:
        raise ValueError(f"save_png({path}): expected uint8 [3, H, W], got {image.dtype} "
                         f"{tuple(image.shape)}")
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image.cpu().permute(1, 2, 0).contiguous().numpy()).save(p)
    return p
