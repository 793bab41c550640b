"""The harder built-in dataset: 15 classes (``<kind>_<style>``) of small, overlapping shapes on
textured clutter (docs/pipeline.md, "The harder built-in dataset"). Generated like
:mod:`mdk.data.shapes`: byte-identical for the same parameters.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image, ImageDraw

from mdk.data.generated import bytes_for, check_request, ensure_generated, manifest, write_voc
from mdk.data.shape_drawing import background, contrasting_colour, iou, place_shape

KINDS: tuple[str, ...] = ("circle", "square", "triangle", "star", "cross")
STYLES: tuple[str, ...] = ("solid", "outline", "striped")
HARD_CLASSES: tuple[str, ...] = tuple(f"{k}_{s}" for k in KINDS for s in STYLES)
GENERATOR, FORMAT_VERSION = "shapes_hard", 1
MIN_SIZE_FRAC, MAX_SIZE_FRAC = 0.07, 0.40   # object extent as a fraction of the image side
MIN_OBJECTS, MAX_OBJECTS = 2, 5             # objects per image (fewer where no place is free)
MAX_IOU = 0.2                               # box overlap between two objects of one image
MAX_COVER = 0.35                            # share of an earlier object's box a later one covers
MIN_DISTRACTORS, MAX_DISTRACTORS = 1, 4     # clutter under the objects (plus 0-2 lines over)


def _texture(size: int, rng: np.random.Generator) -> np.ndarray:
    """A gradient under one of: nothing, stripes, a checkerboard, colour blobs (H x W x 3)."""
    base = background(size, rng)
    kind = int(rng.integers(4))
    if kind == 0:
        return base
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    ang = rng.uniform(0, math.pi)
    u, v = xx * math.cos(ang) + yy * math.sin(ang), -xx * math.sin(ang) + yy * math.cos(ang)
    if kind == 1:      # soft or hard stripes
        wave = np.sin(2 * math.pi * u / rng.uniform(4, 24))
        pattern = (wave > 0).astype(np.float32) if rng.random() < 0.5 else 0.5 + 0.5 * wave
    elif kind == 2:    # a rotated checkerboard
        cell = rng.uniform(5, 28)
        pattern = ((np.floor(u / cell) + np.floor(v / cell)) % 2).astype(np.float32)
    else:              # low-frequency colour blobs
        k = int(rng.integers(3, 10))
        small = rng.uniform(0, 255, (k, k, 3)).astype(np.uint8)
        blobs = np.asarray(Image.fromarray(small).resize((size, size), Image.BILINEAR), np.float32)
        strength = rng.uniform(0.3, 0.7)
        return base * (1 - strength) + blobs * strength
    other = rng.uniform(0, 255, 3)
    strength = rng.uniform(0.2, 0.6)
    return base + (other - base) * (strength * pattern)[..., None]


def _distractor(draw: ImageDraw.ImageDraw, size: int, colour: tuple, rng: np.random.Generator
                ) -> None:
    """One piece of clutter that is no class."""
    kind = int(rng.integers(5))
    half = math.exp(rng.uniform(math.log(MIN_SIZE_FRAC), math.log(MAX_SIZE_FRAC))) * size / 2
    cx, cy = rng.uniform(0, size, 2)
    width = int(rng.integers(1, 4))
    if kind == 0:      # an irregular polygon (random radii: never a regular kind)
        n = int(rng.integers(7, 12))
        ang = np.sort(rng.uniform(0, 2 * math.pi, n))
        rad = rng.uniform(0.45, 1.0, n) * half
        pts = np.stack([cx + rad * np.cos(ang), cy + rad * np.sin(ang)], 1)
        draw.polygon([(float(x), float(y)) for x, y in pts], fill=colour)
    elif kind == 1:    # a long, rotated ellipse
        t = np.linspace(0, 2 * math.pi, 24, endpoint=False)
        a, rot = rng.uniform(3, 6), rng.uniform(0, math.pi)
        x, y = half * np.cos(t), half / a * np.sin(t)
        pts = np.stack([cx + x * math.cos(rot) - y * math.sin(rot),
                        cy + x * math.sin(rot) + y * math.cos(rot)], 1)
        draw.polygon([(float(x), float(y)) for x, y in pts], fill=colour)
    elif kind == 2:    # an open arc
        start = float(rng.uniform(0, 360))
        draw.arc([cx - half, cy - half, cx + half, cy + half], start,
                 start + float(rng.uniform(60, 240)), fill=colour, width=width)
    elif kind == 3:    # a line
        draw.line([float(v) for v in rng.uniform(0, size, 4)], fill=colour, width=width)
    else:              # a few dots
        for _ in range(int(rng.integers(3, 8))):
            x, y, r = *rng.uniform(0, size, 2), rng.uniform(1, 3)
            draw.ellipse([x - r, y - r, x + r, y + r], fill=colour)


def _place(name: str, size: int, boxes: list[np.ndarray], rng: np.random.Generator):
    """A free place for a new object: (kind, style, polygon, ellipse, box) or None."""
    kind, style = name.rsplit("_", 1)
    for _attempt in range(30):
        half = math.exp(rng.uniform(math.log(MIN_SIZE_FRAC), math.log(MAX_SIZE_FRAC))) * size / 2
        pts, ellipse, box = place_shape(kind, half, size, rng)
        if all(iou(box, o) < MAX_IOU and _covered(o, box) < MAX_COVER for o in boxes):
            return kind, style, pts, ellipse, box
    return None


def _covered(earlier: np.ndarray, later: np.ndarray) -> float:
    """The share of ``earlier``'s box that ``later``'s box covers."""
    iw = max(0.0, min(earlier[2], later[2]) - max(earlier[0], later[0]))
    ih = max(0.0, min(earlier[3], later[3]) - max(earlier[1], later[1]))
    return iw * ih / ((earlier[2] - earlier[0]) * (earlier[3] - earlier[1]))


def _draw_object(canvas: np.ndarray, placed: tuple, rng: np.random.Generator) -> None:
    """Paint one placed object onto ``canvas`` (H x W x 3 float) in its style."""
    kind, style, pts, ellipse, box = placed
    size = canvas.shape[0]
    x0, y0, x1, y1 = (int(v) for v in box)
    colour = np.array(contrasting_colour(canvas[y0:y1, x0:x1].mean((0, 1)), rng), np.float32)
    mask_img = Image.new("L", (size, size), 0)
    draw = ImageDraw.Draw(mask_img)
    width = max(1, round((x1 - x0) * rng.uniform(0.07, 0.14)))
    fill, outline = (None, 255) if style == "outline" else (255, None)
    if pts is None:
        draw.ellipse(ellipse, fill=fill, outline=outline, width=width)
    else:
        draw.polygon([(float(x), float(y)) for x, y in pts], fill=fill, outline=outline,
                     width=width)
    mask = np.asarray(mask_img) > 0
    if style == "striped":   # two colours in bands across the shape
        period = max(3.0, (x1 - x0) * rng.uniform(0.2, 0.35))
        ang = rng.uniform(0, math.pi)
        yy, xx = np.mgrid[0:size, 0:size]
        band = ((xx * math.cos(ang) + yy * math.sin(ang)) / period) % 1 < 0.5
        second = np.array(contrasting_colour(colour, rng), np.float32)
        canvas[mask & ~band] = second
        mask &= band
    canvas[mask] = colour


def render_hard_image(index: int, image_size: int, seed: int, class_names: Sequence[str]
                      ) -> tuple[Image.Image, list[tuple[str, list[int]]]]:
    """Draw image ``index``: returns the RGB image and ``[(class name, [x1, y1, x2, y2])]``."""
    rng = np.random.default_rng([seed, index])
    bg = _texture(image_size, rng)
    img = Image.fromarray(bg.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    mean_bg = bg.mean((0, 1))
    for _ in range(int(rng.integers(MIN_DISTRACTORS, MAX_DISTRACTORS + 1))):
        _distractor(draw, image_size, contrasting_colour(mean_bg, rng), rng)
    canvas = np.asarray(img, dtype=np.float32).copy()
    objects: list[tuple[str, list[int]]] = []
    boxes: list[np.ndarray] = []
    for _ in range(int(rng.integers(MIN_OBJECTS, MAX_OBJECTS + 1))):
        name = class_names[int(rng.integers(len(class_names)))]
        placed = _place(name, image_size, boxes, rng)
        if placed is None:
            continue   # no free place for another object: fewer objects in this image
        _draw_object(canvas, placed, rng)
        boxes.append(placed[-1])
        objects.append((name, [int(v) for v in placed[-1]]))
    img = Image.fromarray(canvas.clip(0, 255).astype(np.uint8))
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(0, 3))):   # lines across the objects too
        draw.line([float(v) for v in rng.uniform(0, image_size, 4)],
                  fill=contrasting_colour(mean_bg, rng), width=int(rng.integers(1, 3)))
    noisy = np.asarray(img, dtype=np.float32) + rng.normal(0, rng.uniform(4, 14),
                                                           (image_size, image_size, 3))
    return Image.fromarray(noisy.clip(0, 255).astype(np.uint8)), objects


def _generate(out: Path, params: dict) -> None:
    write_voc(out, params, render_hard_image, GENERATOR)


def bytes_to_generate(root: str | Path, num_train: int = 3200, num_val: int = 800,
                      image_size: int = 224, seed: int = 0,
                      class_names: Sequence[str] = HARD_CLASSES) -> int:
    """About how many bytes :func:`ensure_shapes_hard_dataset` writes (0 if ``root`` holds them)."""
    return bytes_for(manifest(FORMAT_VERSION, num_train, num_val, image_size, seed, class_names,
                              generator=GENERATOR), root)


def ensure_shapes_hard_dataset(root: str | Path, num_train: int = 3200, num_val: int = 800,
                               image_size: int = 224, seed: int = 0,
                               class_names: Sequence[str] = HARD_CLASSES) -> Path:
    """Make sure ``root`` holds the hard shapes dataset for these parameters; return ``root``."""
    root = Path(root).expanduser().resolve()
    check_request(GENERATOR, class_names, HARD_CLASSES, num_train, num_val, image_size)
    params = manifest(FORMAT_VERSION, num_train, num_val, image_size, seed, class_names,
                      generator=GENERATOR)
    return ensure_generated(root, params, _generate, GENERATOR)
