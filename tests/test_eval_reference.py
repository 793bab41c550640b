"""The vectorised VOC evaluator against a slow loop transcription of the devkit (tests/helpers/devkit.py)
(VOCevaldet.m + VOCap.m as documented: per detection, a loop over the image's objects; the 11
thresholds of the Python ports), on random sets with difficult objects, duplicates, score ties and
empty images, with and without the +1; and its speed. Real-sized images and the box rule:
test_eval_devkit.py."""
from __future__ import annotations

import time

import numpy as np
import pytest

from mdk.eval.voc_ap import voc_ap
from helpers.devkit import devkit_ap


def random_set(seed, images=60, classes=4, integer=False):
    rng = np.random.default_rng(seed)
    gts, dets = {}, {}
    for i in range(images):
        n = int(rng.integers(0, 6))
        xy = rng.uniform(0, 80, (n, 2))
        b = np.concatenate([xy, xy + rng.uniform(4, 40, (n, 2))], 1)
        if integer:
            b = np.round(b)
        labels = rng.integers(0, classes, n)
        gts[i] = (b, labels, rng.random(n) < 0.2)
        m = int(rng.integers(0, 12))
        if n:
            k = rng.integers(0, n, m)
            db = b[k] + rng.normal(0, 3, (m, 4))   # near an object: hits, misses, duplicates
            dl = np.where(rng.random(m) < 0.85, labels[k], rng.integers(0, classes, m))
        else:
            xy = rng.uniform(0, 80, (m, 2))
            db, dl = np.concatenate([xy, xy + 10], 1), rng.integers(0, classes, m)
        if integer:
            db = np.round(db)
        # Scores on a 0.1 grid: many ties, decided by the given order.
        dets[i] = {"boxes": db, "scores": np.round(rng.random(m), 1), "labels": dl}
    return dets, gts


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("metric", ["voc07", "voc12"])
def test_matches_a_loop_transcription_of_the_devkit(seed, metric):
    for integer, off in ((False, 0.0), (True, 1.0)):
        dets, gts = random_set(seed, integer=integer)
        r = voc_ap(dets, gts, 4, metric, pixel_offset=off)
        ref = [devkit_ap(dets, gts, c, metric, off) for c in range(4)]
        np.testing.assert_allclose(r["ap"], ref, rtol=0, atol=1e-12, equal_nan=True)
        assert r["map"] == pytest.approx(np.nanmean(ref), abs=1e-12)
        # The sets exercise what they should: difficult objects, duplicates, ties, empty images.
        assert any(g[2].any() for g in gts.values())
        assert any(len(d["scores"]) == 0 for d in dets.values())


def test_400_images_of_100_detections_well_under_a_second():
    rng = np.random.default_rng(0)
    dets, gts = {}, {}
    for i in range(400):
        n = int(rng.integers(1, 8))
        xy = rng.uniform(0, 300, (n, 2))
        b = np.concatenate([xy, xy + rng.uniform(20, 150, (n, 2))], 1)
        labels = rng.integers(0, 20, n)
        gts[i] = (b, labels, rng.random(n) < 0.17)
        k = rng.integers(0, n, 100)
        dets[i] = {"boxes": b[k] + rng.normal(0, 15, (100, 4)), "scores": rng.random(100),
                   "labels": np.where(rng.random(100) < 0.8, labels[k], rng.integers(0, 20, 100))}
    voc_ap(dets, gts, 20)  # warm-up (imports)
    t0 = time.perf_counter()
    r = voc_ap(dets, gts, 20, "voc07")
    took = time.perf_counter() - t0
    assert 0.0 < r["map"] < 1.0
    assert took < 1.0, f"voc_ap took {took:.2f} s for 40000 detections"
