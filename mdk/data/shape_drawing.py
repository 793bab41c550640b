"""Drawing pieces both generated datasets use. Every draw comes from the caller's RNG in a fixed
order: changing one changes the generated images, which the tests pin by digest.
"""
from __future__ import annotations

import math

import numpy as np


def rotate(points: np.ndarray, angle: float) -> np.ndarray:
    """``points`` (N x 2) rotated by ``angle`` radians."""
    c, s = math.cos(angle), math.sin(angle)
    return points @ np.array([[c, s], [-s, c]])


def polygon(name: str, rng: np.random.Generator) -> np.ndarray:
    """Unit-scale polygon (roughly within [-1, 1]^2) for a polygonal class."""
    if name == "square":
        aspect = rng.uniform(0.8, 1.25)
        pts = np.array([[-1, -aspect], [1, -aspect], [1, aspect], [-1, aspect]], float)
        return rotate(pts, rng.uniform(-0.25, 0.25))
    if name == "triangle":
        pts = np.array([[0, -1], [0.95, 0.8], [-0.95, 0.8]], float)
        return rotate(pts, rng.uniform(0, 2 * math.pi))
    if name == "star":
        k = np.arange(10)
        radius = np.where(k % 2 == 0, 1.0, rng.uniform(0.38, 0.5))
        ang = k * math.pi / 5 + rng.uniform(0, 2 * math.pi)
        return np.stack([radius * np.cos(ang), radius * np.sin(ang)], 1)
    if name == "cross":
        t = rng.uniform(0.25, 0.4)
        pts = np.array([[-t, -1], [t, -1], [t, -t], [1, -t], [1, t], [t, t], [t, 1], [-t, 1],
                        [-t, t], [-1, t], [-1, -t], [-t, -t]], float)
        return rotate(pts, rng.uniform(-0.4, 0.4))
    raise ValueError(name)


def place_shape(kind: str, half: float, size: int, rng: np.random.Generator
                ) -> tuple[np.ndarray | None, list | None, np.ndarray]:
    """A ``kind`` of extent ``half`` at a random place: ``(polygon, ellipse, box)``, the polygon's
    points or, for a circle, None and the ellipse's bounds; the box rounded out to whole pixels,
    inside the image."""
    cx, cy = rng.uniform(half, size - half, 2)
    if kind == "circle":
        aspect = rng.uniform(0.8, 1.25)
        rx, ry = half, half * aspect if aspect <= 1 else half / aspect
        pts, ellipse = None, [cx - rx, cy - ry, cx + rx, cy + ry]
        box = np.array(ellipse)
    else:
        pts = polygon(kind, rng)
        pts = pts / np.abs(pts).max() * half + (cx, cy)
        ellipse, box = None, np.concatenate([pts.min(0), pts.max(0)])
    box = np.clip(np.array([math.floor(box[0]), math.floor(box[1]),
                            math.ceil(box[2]), math.ceil(box[3])]), 0, size)
    return pts, ellipse, box


def background(size: int, rng: np.random.Generator) -> np.ndarray:
    """Two-colour gradient in a random direction; noise is added after the objects are drawn."""
    c0, c1 = rng.uniform(0, 255, 3), rng.uniform(0, 255, 3)
    ang = rng.uniform(0, 2 * math.pi)
    axis = np.linspace(-0.5, 0.5, size)
    t = (math.cos(ang) * axis[None, :] + math.sin(ang) * axis[:, None]) + 0.5
    return c0 + (c1 - c0) * t[..., None]


def contrasting_colour(bg: np.ndarray, rng: np.random.Generator) -> tuple[int, int, int]:
    """A colour at least 150 (summed over RGB) from ``bg``, after at most 50 draws."""
    for _ in range(50):
        colour = rng.integers(0, 256, 3)
        if np.abs(colour - bg).sum() > 150:
            break
    return tuple(int(v) for v in colour)


def iou(a: np.ndarray, b: np.ndarray) -> float:
    """Intersection over union of two ``[x1, y1, x2, y2]`` boxes."""
    iw = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    ih = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = iw * ih
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union
