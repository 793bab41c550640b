"""The built-in detection dataset: coloured shapes on noisy, cluttered backgrounds, in VOC layout.

Generated on first use (:mod:`mdk.data.generated`), never downloaded. Image ``i`` has its own RNG
seeded by ``(seed, i)``: the output is byte-identical for the same parameters, and growing
``num_val`` does not change the training images (the first ``num_train`` images).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from mdk.data.generated import bytes_for, check_request, ensure_generated, manifest, write_voc
from mdk.data.shape_drawing import background, contrasting_colour, iou, place_shape

SHAPE_CLASSES: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")
FORMAT_VERSION = 1
MIN_SIZE_FRAC, MAX_SIZE_FRAC = 0.12, 0.40   # object extent as a fraction of the image side
MAX_IOU = 0.1                               # limited overlap between objects of one image


def render_image(index: int, image_size: int, seed: int, class_names: Sequence[str]
                 ) -> tuple[Image.Image, list[tuple[str, list[int]]]]:
    """Draw image ``index``: returns the RGB image and ``[(class name, [x1, y1, x2, y2])]``."""
    rng = np.random.default_rng([seed, index])
    bg = background(image_size, rng)
    img = Image.fromarray(bg.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(0, 4))):   # clutter: thin lines that are not objects
        pts = rng.uniform(0, image_size, 4)
        draw.line([float(v) for v in pts], fill=contrasting_colour(bg.mean((0, 1)), rng),
                  width=int(rng.integers(1, 3)))
    objects: list[tuple[str, list[int]]] = []
    boxes: list[np.ndarray] = []
    for _ in range(int(rng.integers(1, 5))):
        for _attempt in range(30):
            name = class_names[int(rng.integers(len(class_names)))]
            half = rng.uniform(MIN_SIZE_FRAC, MAX_SIZE_FRAC) * image_size / 2
            pts, ellipse, box = place_shape(name, half, image_size, rng)
            if all(iou(box, other) < MAX_IOU for other in boxes):
                break
        else:
            continue   # no free place for another object: fewer objects in this image
        x0, y0 = int(box[0]), int(box[1])
        local = bg[min(y0, image_size - 1), min(x0, image_size - 1)]
        colour = contrasting_colour(local, rng)
        if pts is None:
            draw.ellipse(ellipse, fill=colour)
        else:
            draw.polygon([(float(x), float(y)) for x, y in pts], fill=colour)
        boxes.append(box)
        objects.append((name, [int(v) for v in box]))
    noisy = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(4, 16),
                                                           (image_size, image_size, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8)), objects


def _generate(out: Path, params: dict) -> None:
    write_voc(out, params, render_image)


def bytes_to_generate(root: str | Path, num_train: int = 1600, num_val: int = 400,
                      image_size: int = 192, seed: int = 0,
                      class_names: Sequence[str] = SHAPE_CLASSES,
                      val_first: int | None = None) -> int:
    """About how many bytes :func:`ensure_shapes_dataset` writes; 0 when ``root`` holds them."""
    return bytes_for(manifest(FORMAT_VERSION, num_train, num_val, image_size, seed, class_names,
                              val_first), root)


def ensure_shapes_dataset(root: str | Path, num_train: int = 1600, num_val: int = 400,
                          image_size: int = 192, seed: int = 0,
                          class_names: Sequence[str] = SHAPE_CLASSES,
                          val_first: int | None = None) -> Path:
    """Make sure ``root`` holds the shapes dataset for these parameters (a folder made with others
    is regenerated); return ``root``. ``val_first``: the val images are the generator's images
    from this index on, whatever ``num_train`` (mdk.data.generated.render_index)."""
    root = Path(root).expanduser().resolve()
    check_request("shapes", class_names, SHAPE_CLASSES, num_train, num_val, image_size)
    params = manifest(FORMAT_VERSION, num_train, num_val, image_size, seed, class_names,
                      val_first)
    # _generate looked up at call time: tests replace it to fake a full disk
    return ensure_generated(root, params, lambda out, p: _generate(out, p), "shapes")
