"""Report helpers: a PNG read back as a tensor, and a random VOC evaluation result."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from mdk.eval.voc_ap import voc_ap


def read_png(path) -> torch.Tensor:
    return torch.from_numpy(np.array(Image.open(path).convert("RGB"))).permute(2, 0, 1)


def _result(classes=13, seed=0):
    rng = np.random.default_rng(seed)
    dets, gts = {}, {}
    for i in range(40):
        n = int(rng.integers(1, 5))
        xy = rng.uniform(0, 50, (n, 2))
        b = np.concatenate([xy, xy + rng.uniform(8, 30, (n, 2))], 1)
        labels = rng.integers(0, classes - 1, n)   # the last class never has ground truth
        gts[i] = (b, labels, np.zeros(n, bool))
        k = rng.integers(0, n, 6)
        dets[i] = {"boxes": b[k] + rng.normal(0, 3, (6, 4)), "scores": rng.random(6),
                   "labels": labels[k]}
    return voc_ap(dets, gts, classes, "voc07")
