"""Training augmentation: flips, scale/shift (affine) and colour jitter, with boxes.

A sample's numbers are drawn up front in a fixed order (``draw``) from its (seed, epoch, index)
generator, so the batch split, world size, workers and device never change them (the alignment
check and bit-identical resume rely on it; docs/distributed.md, Semantics). The image part runs
in the loader worker (``augment_image``, torchvision's ops) or, with ``dataset.augment_on``
device, batched on the device (``BatchAugment``, torchvision's formulas: slow per-sample CPU ops
never make the GPU wait); the two agree to rounding (a pixel may be off by one). Boxes and
targets are transformed in the loader either way.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as nnf
from torchvision.transforms.v2 import functional as F

from mdk.data.config import AugmentConf

GRAY = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights
DEFAULT = AugmentConf()  # dataset.augmentation's defaults


@dataclass(frozen=True)
class AugParams:
    flip: bool
    affine: bool
    scale: float
    shift: tuple[float, float]
    bright: float
    contrast: float
    sat: float
    vflip: bool = False


def draw(rng: np.random.Generator, size: int, st: AugmentConf = DEFAULT) -> AugParams:
    """Every number of one sample, in a fixed order that never depends on a drawn value (the
    vertical flip's is drawn last, and only when on, keeping the older default stream)."""
    flip, use_affine = rng.random() < st.flip, rng.random() < st.affine
    scale = rng.uniform(*st.scale)
    shift = (rng.uniform(-st.shift, st.shift, 2) * size).tolist()
    bright, contrast, sat = rng.uniform(1 - st.jitter, 1 + st.jitter, 3).tolist()
    vflip = bool(rng.random() < st.vflip) if st.vflip > 0 else False
    return AugParams(bool(flip), bool(use_affine), float(scale), (shift[0], shift[1]),
                     bright, contrast, sat, vflip)


def affine_boxes(boxes: torch.Tensor, labels: torch.Tensor, scale: float, shift: Sequence[float],
                 size: int, min_visible: float = DEFAULT.min_visible
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Boxes under torchvision's ``affine`` (scale about the image centre, then shift), clipped
    to the image; an object left less than ``min_visible`` inside the image is dropped."""
    centre = size / 2
    full = (boxes - centre) * scale + centre + torch.tensor([shift[0], shift[1]] * 2)
    clipped = full.clamp(0, size)
    area = lambda b: (b[:, 2] - b[:, 0]).clamp(min=0) * (b[:, 3] - b[:, 1]).clamp(min=0)  # noqa: E731
    keep = area(clipped) >= min_visible * area(full).clamp(min=1e-6)
    return clipped[keep], labels[keep]


def augment_boxes(boxes: torch.Tensor, labels: torch.Tensor, p: AugParams, size: int,
                  min_visible: float = DEFAULT.min_visible) -> tuple[torch.Tensor, torch.Tensor]:
    if p.flip:
        boxes = torch.stack([size - boxes[:, 2], boxes[:, 1], size - boxes[:, 0], boxes[:, 3]], 1)
    if p.vflip:
        boxes = torch.stack([boxes[:, 0], size - boxes[:, 3], boxes[:, 2], size - boxes[:, 1]], 1)
    if p.affine:
        boxes, labels = affine_boxes(boxes, labels, p.scale, p.shift, size, min_visible)
    return boxes, labels


def resize_image(images: torch.Tensor, size: int) -> torch.Tensor:
    """uint8 image(s) ``[..., 3, H, W]`` to ``size`` x ``size`` (bilinear with antialiasing: a
    smaller epoch of a resolution schedule sees what a downscaled photograph would show)."""
    out = F.resize(images, [size, size], interpolation=F.InterpolationMode.BILINEAR,
                   antialias=True)
    return out if out.dtype == torch.uint8 else out.round_().clamp_(0, 255).to(torch.uint8)


def augment_image(img: torch.Tensor, p: AugParams) -> torch.Tensor:
    """One uint8 image [3, H, W] with torchvision's functional ops (the loader-side path)."""
    if p.flip:
        img = F.horizontal_flip(img)
    if p.vflip:
        img = F.vertical_flip(img)
    if p.affine:
        img = F.affine(img, angle=0.0, translate=list(p.shift), scale=p.scale, shear=[0.0, 0.0],
                       interpolation=F.InterpolationMode.BILINEAR)
    img = F.adjust_brightness(img, p.bright)
    img = F.adjust_contrast(img, p.contrast)
    return F.adjust_saturation(img, p.sat)


def _gray(x: torch.Tensor) -> torch.Tensor:
    """torchvision's grey level, floored as it floors it for uint8 images (same op order)."""
    r, g, b = x[:, 0:1], x[:, 1:2], x[:, 2:3]
    return r.mul(GRAY[0]).add_(g, alpha=GRAY[1]).add_(b, alpha=GRAY[2]).floor_()


def _blend(x: torch.Tensor, other: torch.Tensor | float, ratio: torch.Tensor) -> torch.Tensor:
    """torchvision's uint8 blend: ``ratio * x + (1 - ratio) * other``, clamped, truncated."""
    return (x * ratio + (1.0 - ratio) * other).clamp_(0, 255).trunc_()


def params_tensor(params: Sequence[AugParams]) -> torch.Tensor:
    """[B, 9] float32: flip, affine, scale, shift x, shift y, brightness, contrast, saturation,
    vertical flip."""
    return torch.tensor([[float(p.flip), float(p.affine), p.scale, p.shift[0], p.shift[1],
                          p.bright, p.contrast, p.sat, float(p.vflip)] for p in params],
                        dtype=torch.float32)


def augment_batch(images: torch.Tensor, params: Sequence[AugParams] | torch.Tensor
                  ) -> torch.Tensor:
    """A uint8 batch [B, 3, H, W], each sample with its own parameters (a list, or
    ``params_tensor``'s [B, 9], best already on the images' device)."""
    b, _, h, w = images.shape
    pt = params if torch.is_tensor(params) else params_tensor(params)
    pt = pt.to(images.device, non_blocking=True)
    on = pt > 0.5  # columns 0, 1 and 8: flip, affine, vertical flip
    s = torch.where(on[:, 1], pt[:, 2], 1.0)
    tx, ty = torch.where(on[:, 1:2], pt[:, 3:5], 0.0).unbind(1)
    f, fy = torch.where(on[:, 0], -1.0, 1.0), torch.where(on[:, 8], -1.0, 1.0)
    # flips then affine, as one inverse map in grid_sample's normalised coordinates
    # (align_corners=False: pixel centres at (2i + 1) / W - 1): u_in = f * (u_out - 2t/W) / s
    zero = torch.zeros_like(s)
    theta = torch.stack([torch.stack([f / s, zero, -f * 2 * tx / (w * s)], 1),
                         torch.stack([zero, fy / s, -fy * 2 * ty / (h * s)], 1)], 1)
    grid = nnf.affine_grid(theta, [b, 3, h, w], align_corners=False)
    x = nnf.grid_sample(images.float(), grid, mode="bilinear", padding_mode="zeros",
                        align_corners=False).round_()
    col = lambda k: pt[:, k].view(b, 1, 1, 1)  # noqa: E731
    x = (x * col(5)).clamp_(0, 255).trunc_()
    # contrast: blend with the mean grey level (float64 sum: exact for these values, so the mean
    # does not depend on how a kernel splits the reduction)
    mean = _gray(x).double().mean(dim=(1, 2, 3), keepdim=True).float()
    x = _blend(x, mean, col(6))
    x = _blend(x, _gray(x), col(7))
    return x.to(torch.uint8)


class BatchAugment:
    """Augment training batches on their device: ``images = BatchAugment(ds)(images, batch)``,
    each sample with the parameters the loader drew for its boxes (``batch[3]``), then resized
    to the size its targets were encoded at (a resolution schedule's epoch)."""

    def __init__(self, dataset: Any) -> None:
        dataset.defer_images = True  # the loader returns the parameters, not augmented images
        self.stride = dataset.stride

    def __call__(self, images: torch.Tensor, batch: Any) -> torch.Tensor:
        out = augment_batch(images, batch[3])
        size = int(batch[1].shape[1]) * self.stride
        return out if size == out.shape[-1] else resize_image(out, size)
