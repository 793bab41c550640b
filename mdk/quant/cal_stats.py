"""Per-batch statistics of one layer's pre-activation values, from which mdk.quant.calibrate picks
a cap (the methods: docs/pipeline.md, Calibration methods). Every function is deterministic per
input and device, so equal samples give equal statistics on every rank.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Optional

import torch

from mdk.quant.activation import LEVELS
from mdk.quant.rounding import pred_half

_SAMPLE = 1 << 14  # values in the strided sample that guides the exact percentile selection
MSE_SAMPLE = 1 << 18
KL_BINS = 1024  # kl: bins over [0, 2**e >= max]; caps tried at every bin edge from 32 bins up


def sample_stride(n: int, max_values: Optional[int]) -> int:
    """Read stride of ``n`` values for a percentile or KL statistic: 1, or the odd
    ``ceil(n / max_values) | 1`` (odd, so it does not line up with power-of-two feature maps)."""
    if max_values is None or n <= max_values:
        return 1
    return math.ceil(n / max_values) | 1


def strided(x: torch.Tensor, start: int, step: int) -> torch.Tensor:
    """The values of ``x`` at flat (logical, row-major) positions ``start, start + step, ...``."""
    x = x.detach()
    if x.is_contiguous() or (start == 0 and step == 1):
        return x.reshape(-1)[start::step]
    # channels_last or other layouts: reshape would first copy the whole activation
    return torch.take(x, torch.arange(start, x.numel(), step, device=x.device))


def nearest_rank(p: float, n: int) -> int:
    """1-based rank ``ceil(p/100 * n)`` in exact rational arithmetic (no float ceil surprises)."""
    k = math.ceil(Fraction(str(p)) * n / 100)
    return min(max(k, 1), n)


def percentile_and_max(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(nearest-rank p-th percentile, max) of all values of ``x``, as 0-dim tensors."""
    flat = x.detach().reshape(-1)
    n = flat.numel()
    k = nearest_rank(p, n)
    if k == n:
        top = flat.max()
        return top, top
    if flat.is_cuda:
        # The k-th smallest is the smallest of the n - k + 1 largest: one top-k, no host reads
        # (the shortcut below reads sizes back, and CUDA kthvalue is slow).
        top = flat.topk(n - k + 1, sorted=False).values
        return top.min(), top.max()
    stride = max(1, n // _SAMPLE)
    sample = flat[::stride]
    # Aim 0.5% (of the population) below the target: > 6 standard deviations of the sample
    # fraction at p = 99 (sqrt(0.01 * 0.99 / 16384) = 0.08%), so the fallback is rare.
    ks = math.floor((k / n - 0.005) * sample.numel())
    if n > 4 * _SAMPLE and ks >= 1:
        thr = sample.kthvalue(ks).values
        # nonzero + index_select: boolean-mask indexing is ~6x slower on CPU
        above = flat.index_select(0, (flat >= thr).nonzero().squeeze(1))
        below = n - above.numel()
        if below < k:  # the target is among the kept values: exact answer from the small set
            return above.kthvalue(k - below).values, above.max()
    return flat.kthvalue(k).values, flat.max()


def mse_cap(x: torch.Tensor, candidates: int = 64) -> torch.Tensor:
    """Cap minimising E[(Q(relu(y), cap) - relu(y))^2] over ``candidates`` fractions of max(y);
    the first of equal errors wins."""
    flat = x.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // MSE_SAMPLE)].float().clamp_min(0)
    top = sample.max()
    fractions = torch.arange(1, candidates + 1, device=sample.device, dtype=torch.float32)
    caps = (top * fractions / candidates).clamp_min(torch.finfo(torch.float32).tiny)
    h = pred_half(torch.float32)
    errs = []
    for chunk in caps.split(8):
        c = chunk[:, None]
        q = torch.floor(torch.clamp(sample[None] * (LEVELS / c) + h, h, LEVELS + h)) * (c / LEVELS)
        errs.append((q - sample[None]).pow(2).mean(1))
    best = caps[torch.argmin(torch.cat(errs))]
    return torch.where(top > 0, best, top)


def pow2_range(top: torch.Tensor) -> torch.Tensor:
    """The power of two ``2**e >= top`` a batch's histogram spans, so histograms merge exactly."""
    return torch.ldexp(torch.ones_like(top, dtype=torch.float32),
                       torch.frexp(top.float().clamp(min=0)).exponent)


def histogram(x: torch.Tensor, span: torch.Tensor, bins: int = KL_BINS) -> torch.Tensor:
    """int64 counts of the positive values of ``x`` in ``bins`` equal bins over [0, span] (values
    <= 0 quantize to 0 whatever the cap)."""
    v = x.detach().reshape(-1).float()
    idx = (v * (bins / span)).floor_().clamp_(max=bins - 1).long()
    idx = torch.where(v > 0, idx, bins)  # a spare bin for the non-positive values, dropped
    return torch.bincount(idx, minlength=bins + 1)[:bins]


def rebin(hist: torch.Tensor, span: float, to_span: float) -> torch.Tensor:
    """``hist`` over [0, span] as counts over [0, to_span] (``to_span = span * 2**k``): bin j
    moves to ``j >> k``, exactly what binning the values at ``to_span`` gives."""
    k = round(math.log2(to_span / span))
    moved = torch.arange(hist.numel(), device=hist.device) >> min(k, 62)  # no over-wide shift
    return torch.zeros_like(hist).index_add_(0, moved, hist)


def kl_threshold(hist: torch.Tensor, span: float) -> float:
    """The cap ``t = i * span / bins`` (i >= 32) minimising KL(P || Q) for a histogram of the
    positive values over [0, span].

    P: the first i bins, the counts above added to bin i - 1 (clipping at ``t``). Q: those bins
    without the tail merged into 32 groups, one per 5-bit level, each group's count spread evenly
    over its bins where P is non-zero. float64 on the CPU from integer counts, so the same on every
    device; the first of equal scores wins.
    """
    hist = hist.detach().to("cpu", torch.int64)
    bins, levels = hist.numel(), LEVELS + 1
    if int(hist.sum()) == 0:
        return 0.0
    counts = torch.cat([hist.new_zeros(1), hist.cumsum(0)])    # counts[j] = values in bins < j
    cut = torch.arange(levels, bins + 1)[:, None]              # candidate i: keep bins < i
    j = torch.arange(bins)[None, :]
    tail = counts[-1] - counts[cut]                            # values clipped into bin i - 1
    p = torch.where(j < cut, hist[None, :], 0) + torch.where(j == cut - 1, tail, 0)
    # group g of cut i holds bins [ceil(g * i / L), ceil((g + 1) * i / L)) (g = floor(j * L / i))
    g = torch.arange(levels + 1)[None, :]
    edge = torch.div(g * cut + levels - 1, levels, rounding_mode="floor")
    group_count = counts[edge[:, 1:]] - counts[edge[:, :-1]]   # without the clipped tail
    nonzero = torch.cat([p.new_zeros(p.shape[0], 1), (p > 0).long().cumsum(1)], 1)
    group_filled = nonzero.gather(1, edge[:, 1:]) - nonzero.gather(1, edge[:, :-1])
    share = group_count.double() / group_filled.clamp(min=1).double()
    group = torch.div(j * levels, cut, rounding_mode="floor").clamp_(max=levels - 1)
    q = torch.where(p > 0, share.gather(1, group), 0.0)
    pd = p.double() / p.sum(1, keepdim=True).double()
    q = q / q.sum(1, keepdim=True).clamp(min=1e-300)
    # a clipped tail that Q has no mass for: a tiny floor keeps the divergence finite (and large)
    terms = torch.where(pd > 0, pd * (pd / q.clamp(min=1e-12)).log(), 0.0)
    best = int(torch.argmin(terms.sum(1)))
    return float(cut[best, 0]) * span / bins
