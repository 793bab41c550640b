"""A hand-made VOC year folder of photo-like JPEGs (PIL), and a way to break a file."""
from __future__ import annotations

import io
from pathlib import Path

import numpy as np
from PIL import Image

CLASSES = ["cat", "dog"]


def jpeg_bytes(size: int, seed: int) -> bytes:
    """A photo-like JPEG (gradients + noise: a realistic amount of entropy-coded data)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:size, 0:size]
    base = np.stack([(x * 0.5 + y * 0.2 + seed) % 256, (y * 0.7) % 256, ((x + y) * 0.3) % 256], -1)
    arr = (base + rng.normal(0, 20, base.shape)).clip(0, 255).astype(np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def make_voc(root: Path, n_train: int = 12, n_val: int = 4, size: int = 64) -> Path:
    """A hand-made VOC year folder: JPEGs written with PIL, one object per image in the XML."""
    for sub in ("JPEGImages", "Annotations", "ImageSets/Main"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    ids = [f"{i:06d}" for i in range(n_train + n_val)]
    for i, image_id in enumerate(ids):
        (root / "JPEGImages" / f"{image_id}.jpg").write_bytes(jpeg_bytes(size, i))
        x0, y0 = 4 + i % 8, 6 + i % 5
        (root / "Annotations" / f"{image_id}.xml").write_text(
            f"<annotation><size><width>{size}</width><height>{size}</height><depth>3</depth>"
            f"</size><object><name>{CLASSES[i % 2]}</name><difficult>0</difficult><bndbox>"
            f"<xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x0 + size // 2}</xmax>"
            f"<ymax>{y0 + size // 3}</ymax></bndbox></object></annotation>")
    (root / "ImageSets/Main/train.txt").write_text("\n".join(ids[:n_train]) + "\n")
    (root / "ImageSets/Main/val.txt").write_text("\n".join(ids[n_train:]) + "\n")
    return root


def truncate(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
