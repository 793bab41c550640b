"""Detection dataset over the records of one split (:mod:`mdk.data.records`), whatever the format.

Augmentation is seeded by ``(seed, epoch, index)`` (:mod:`mdk.data.augment`); call
:meth:`DetectionDataset.set_epoch` each epoch.

``difficult`` objects (VOC difficult, COCO crowd) and zero-area boxes are left out of the training
targets; :meth:`DetectionDataset.gt` and :meth:`DetectionDataset.gt_original` return them, flagged,
for evaluation.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from mdk import faults
from mdk.data.augment import (augment_boxes, augment_image, draw, params_tensor,
                              resize_image)
from mdk.data.config import AugmentConf
from mdk.data.image_check import DECODE_ERRORS, apply_bad_image_policy, check_images
from mdk.data.records import Record
from mdk.errors import DataError

log = logging.getLogger(__name__)


class DetectionDataset(Dataset):
    """``records`` of ``split`` (image paths relative to ``root``) as model inputs and targets.
    ``meta_dir``: where the image check keeps its cache; ``progress``: its bar."""

    def __init__(self, root: str | Path, split: str, records: Sequence[Record],
                 class_names: Sequence[str], image_size: int, grid: int, head: Any,
                 augment: bool, meta_dir: str | Path, cache_images: bool = False, seed: int = 0,
                 on_bad_image: str = "error", progress: Any = "auto",
                 augmentation: Any = None) -> None:
        self.root = Path(root).expanduser().resolve()
        self.split = split
        self.class_names = list(class_names)
        self.image_size, self.grid = int(image_size), int(grid)
        self.head = head  # encodes the training targets (mdk.models.heads), decodes evaluations
        self.boxes_per_cell = head.boxes_per_cell
        self.augment, self.seed, self.epoch = bool(augment), int(seed), 0
        self.strengths = AugmentConf(**(augmentation or {}))  # dataset.augmentation
        # True: the training device augments the images in batches (dataset.augment_on); boxes
        # and targets are still augmented here.
        self.defer_images = False
        # The input size of each epoch (trainer.image_sizes: a float stage's resolution schedule,
        # mdk.trainer_config.epoch_sizes); None: every epoch at image_size.
        self.epoch_sizes: list[int] | None = None
        # Before any sampler sees the length (mdk.data.image_check says why).
        bad = check_images(self.root, [e.image for e in records],
                           Path(meta_dir) / f"{split}.images.json", desc=f"checking {split} images",
                           progress=progress)
        drop = apply_bad_image_policy(self.root, split, bad, on_bad_image, len(records))
        self.records = [e for e in records if e.image not in drop]
        # Boxes rescaled once to image_size pixels (the frame of every returned image).
        self._boxes = [torch.from_numpy(e.boxes * np.array(
            [image_size / e.width, image_size / e.height] * 2, dtype=np.float32)) for e in self.records]
        self.images: torch.Tensor | None = None
        if cache_images:
            # Decoded before the loader workers fork, so they share these pages (copy-on-write,
            # never written). Numpy, not torch.stack: torch's threaded copy spins its thread pool.
            buf = np.empty((len(self), 3, self.image_size, self.image_size), dtype=np.uint8)
            for i in range(len(self)):
                buf[i] = self._read(i).numpy()
            self.images = torch.from_numpy(buf)
            log.info("cached %d %s images (%.0f MB)", len(self), split, self.images.numel() / 2**20)
        log.info("%s split %r: %d images, %d objects", self.root, split, len(self),
                 sum(len(b) for b in self._boxes))

    def __len__(self) -> int:
        return len(self.records)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def size_at(self, epoch: int) -> int:
        """The training input size of ``epoch`` (image_size unless a resolution schedule)."""
        sizes = self.epoch_sizes
        return sizes[min(int(epoch), len(sizes) - 1)] if sizes else self.image_size

    @property
    def stride(self) -> int:
        """Input pixels per grid cell (the model's pools)."""
        return self.image_size // self.grid

    def _read(self, index: int) -> torch.Tensor:
        """The image decoded to RGB uint8 ``[3, H, W]`` (bilinear resize to image_size if needed)."""
        path, size = self.root / self.records[index].image, self.image_size
        try:
            with Image.open(path) as im:
                im = im.convert("RGB")
                if im.size != (size, size):
                    im = im.resize((size, size), Image.BILINEAR)
                arr = np.asarray(im)
        except FileNotFoundError:
            raise DataError(f"{path}: image listed in the meta file is missing; restore it, or "
                            "remove its id from the split (the meta file is rebuilt automatically)"
                            ) from None
        except DECODE_ERRORS as exc:  # changed since the start-up check (mdk.data.image_check)
            raise DataError(f"{path}: cannot decode image ({exc}); replace the file or set "
                            "dataset.on_bad_image=skip") from None
        # HWC -> CHW in numpy: torch's threaded copy of a small uint8 tensor spins its thread pool.
        return torch.from_numpy(np.array(arr.transpose(2, 0, 1), order="C"))  # a writable copy

    def image(self, index: int) -> torch.Tensor:
        """The un-augmented image ``[3, H, W]`` uint8."""
        return self.images[index] if self.images is not None else self._read(index)

    def gt(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Ground truth for evaluation: boxes xyxy in image_size pixels, labels, difficult."""
        _, labels, difficult = self.gt_original(index)
        return self._boxes[index].clone(), labels, difficult

    def original_size(self, index: int) -> tuple[int, int]:
        """``(width, height)`` of the image file in pixels, before the resize to image_size."""
        e = self.records[index]
        return e.width, e.height

    def gt_original(self, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`gt` in the image's original pixels, as the annotation writes them (VOC:
        1-based inclusive): what the VOC devkit scores against."""
        e = self.records[index]
        return (torch.from_numpy(e.boxes.copy()), torch.from_numpy(e.labels.copy()),
                torch.from_numpy(e.difficult.copy()))

    def __getitem__(self, key: int | tuple[int, int]) -> tuple:
        """``(image uint8 [3, H, W], target, index)``, plus the augmentation parameters [9] with
        ``defer_images``. ``key``: an index, or ``(epoch, index)`` (persistent workers never see
        ``set_epoch``, so the epoch travels with the index)."""
        epoch, index = key if isinstance(key, tuple) else (self.epoch, key)
        faults.at("item")  # MDK_FAULT=raise:item:N:<rank>:<Class> (tests); a lookup when off
        img = self.image(index)
        boxes, labels, difficult = self.gt(index)
        train = ~difficult & (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        boxes, labels = boxes[train], labels[train]
        size = self.size_at(epoch)
        if self.augment:
            rng = np.random.default_rng([self.seed & 0xFFFFFFFF, int(epoch), int(index)])
            p = draw(rng, self.image_size, self.strengths.at_size(size, self.image_size))
            boxes, labels = augment_boxes(boxes, labels, p, self.image_size,
                                          self.strengths.min_visible)
            if not self.defer_images:  # else mdk.data.augment.BatchAugment on the device
                img = augment_image(img, p)
        if size != self.image_size:  # an epoch of a resolution schedule: fewer pixels
            boxes = boxes * (size / self.image_size)
            if not self.defer_images:
                img = resize_image(img, size)
        target = self.head.encode(boxes, labels, size // self.stride, size)
        if self.augment and self.defer_images:  # the device applies them to the image
            return img, target, index, params_tensor([p])[0]
        return img, target, index
