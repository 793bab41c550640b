"""The kl calibration method: exact power-of-two histograms that merge in any order, and the
threshold of least KL divergence, checked against a plain loop over every candidate."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from mdk.quant.cal_stats import KL_BINS, histogram, kl_threshold, pow2_range, rebin
from mdk.quant.calibrate import KlCap


def _kl_loop(hist: np.ndarray, span: float) -> float:
    """The textbook algorithm, one candidate at a time (32 levels, tail clipped into bin i-1)."""
    h, bins, levels = hist.astype(np.float64), len(hist), 32
    best = (math.inf, None)
    for i in range(levels, bins + 1):
        p = h[:i].copy()
        p[i - 1] += h[i:].sum()
        q = np.zeros(i)
        for g in range(levels):
            lo, hi = math.ceil(g * i / levels), math.ceil((g + 1) * i / levels)
            nz = p[lo:hi] > 0
            if nz.any():
                q[lo:hi] = np.where(nz, h[lo:hi].sum() / nz.sum(), 0)
        pn, qn = p / p.sum(), q / q.sum()
        m = pn > 0
        kl = float((pn[m] * np.log(pn[m] / np.maximum(qn[m], 1e-12))).sum())
        if kl < best[0]:
            best = (kl, i)
    return best[1] * span / bins


@pytest.mark.parametrize("kind", ["normal", "cubed", "exponential", "two_bumps"])
def test_threshold_equals_the_loop_over_every_candidate(kind):
    g = torch.Generator().manual_seed(3)
    x = {"normal": lambda: torch.randn(50_000, generator=g),
         "cubed": lambda: torch.randn(50_000, generator=g) ** 3,
         "exponential": lambda: torch.empty(50_000).exponential_(1.0, generator=g),
         "two_bumps": lambda: torch.cat([torch.rand(40_000, generator=g),
                                         5 + torch.rand(400, generator=g)])}[kind]()
    span = pow2_range(x.max())
    hist = histogram(x, span, bins=256)
    assert int(hist.sum()) == int((x > 0).sum())  # every positive value, nothing else
    assert kl_threshold(hist, float(span)) == _kl_loop(hist.numpy(), float(span))


def test_histograms_of_any_span_merge_exactly():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(20_000, generator=g) * 3 - 0.5
    direct = histogram(x, torch.tensor(64.0))
    assert torch.equal(rebin(histogram(x, torch.tensor(4.0)), 4.0, 64.0), direct)
    assert torch.equal(rebin(histogram(x, torch.tensor(4.0)), 4.0, 2.0 ** 20),
                       histogram(x, torch.tensor(2.0 ** 20)))
    assert float(pow2_range(torch.tensor(3.0))) == 4.0 and float(pow2_range(torch.tensor(4.0))) == 8.0


def test_observer_counts_all_batches_and_clips_a_rare_tail():
    g = torch.Generator().manual_seed(1)
    batches = [torch.randn(2, 4, 32, 32, generator=g) * s for s in (1.0, 0.5, 2.0)]
    obs = KlCap()
    for b in batches:
        obs(b)
    span, counts = obs.kl_counts()
    assert span == 8.0 and counts.numel() == KL_BINS  # the widest batch's span: max 2*~4 < 8
    assert int(counts.sum()) == sum(int((b > 0).sum()) for b in batches)
    # all batches in one histogram at that span: the same counts
    assert torch.equal(counts, histogram(torch.cat([b.flatten() for b in batches]),
                                         torch.tensor(span)))
    cap = kl_threshold(counts, span)
    assert 0.5 * float(max(b.max() for b in batches)) < cap <= span
