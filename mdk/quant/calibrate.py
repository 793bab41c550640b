"""Calibration (step ``cal``): per-layer activation caps from the pre-activation conv outputs.
The methods are the classes here, each owning (and checking) its settings; the config names one
by a ``_target_`` node (conf/step/calibration/, read and built by mdk/calibration_config.py; how to add
one: docs/pipeline.md, Calibration methods).

World-size invariance relies on rank r holding the contiguous slice r of each global batch
(mdk.data.samplers.GlobalBatchSampler): the strided sample is gathered in rank order and ``kl``'s
integer histograms add up exactly, so any ``dist.gpus`` gives the same caps, bit for bit, as long
as the conv outputs are the same bits.
"""
from __future__ import annotations

import logging
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch
from torch import nn

from mdk import dist
from mdk.checks import integer, number
from mdk.atomic_file import write_json
from mdk.quant.bn_fold import chip_layers
from mdk.quant.cal_stats import (KL_BINS, MSE_SAMPLE, histogram, kl_threshold, mse_cap,
                                 percentile_and_max, pow2_range, rebin, sample_stride, strided)

log = logging.getLogger(__name__)
MAX_VALUES = 1 << 20  # a larger tensor is read at a stride (``max_values``; null: every value)


KEY = "step.calibration"  # a method's settings are step.calibration.<name> (the stage's node)


def _count(key: str, value: Any, more: str) -> None:
    integer(f"{KEY}.{key}", value, 1, more)


def rank_share(n_local: int, stride: int, rank: int, world: int) -> tuple[int, list[int]]:
    """Where ``rank``'s part of the global strided sample starts in its slice, and how many sample
    values every rank holds."""
    starts = [(-r * n_local) % stride for r in range(world)]
    counts = [max(0, -(-(n_local - s) // stride)) for s in starts]
    return starts[rank], counts


class CapObserver:
    """A calibration method (what a subclass defines: docs/pipeline.md, Calibration methods).
    ``finish`` is collective, layer by layer. ``max_values``: ``sample`` reads a larger global
    batch at a stride (null: every value). ``rank`` / ``world`` (this process's slice of each
    global batch) come from the code that builds it, never from the config."""

    def __init__(self, max_values: Optional[int] = MAX_VALUES, *, rank: int = 0,
                 world: int = 1) -> None:
        if max_values is not None:
            _count("max_values", max_values, ", or null to read every value")
        self.max_values = max_values
        self.rank, self.world = rank, world
        self.stat: Optional[torch.Tensor] = None  # running max of the per-batch statistic
        self.top: Optional[torch.Tensor] = None  # running max of the raw values (fallback)
        self.kept: list = []  # what a method keeps of each batch for ``finish`` (kl: histograms)

    def batch(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def finish(self) -> None:
        pass

    def stride(self, n: int) -> int:  # of a global batch of n values
        return sample_stride(n, self.max_values)

    def share(self, y: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
        """This rank's part of the global batch's values at flat positions 0, s, 2s, ... (``s =
        self.stride(global count)``), and how many of them every rank holds."""
        stride = self.stride(y.numel() * self.world)
        start, counts = rank_share(y.numel(), stride, self.rank, self.world)
        return strided(y, start, stride), counts

    def sample(self, y: torch.Tensor) -> torch.Tensor:
        """The global batch's strided sample on every rank: what one process holding it reads."""
        part, counts = self.share(y)
        # float32 is exact for every activation dtype, and every backend gathers it
        return part if self.world == 1 else dist.all_gather_cat(part.float(), counts)

    @torch.no_grad()
    def __call__(self, y: torch.Tensor) -> None:
        s, top = (t.float() for t in self.batch(y))
        self.stat = s if self.stat is None else torch.maximum(self.stat, s)
        self.top = top if self.top is None else torch.maximum(self.top, top)


class PercentileCap(CapObserver):
    """``percentile`` (default p=99): per batch, the exact nearest-rank percentile of the sample."""

    def __init__(self, percentile: float = 99.0, max_values: Optional[int] = MAX_VALUES, *,
                 rank: int = 0, world: int = 1) -> None:
        p = number(f"{KEY}.percentile", percentile, 0.0, 100.0, low_open=True)
        super().__init__(max_values, rank=rank, world=world)
        self.percentile = p

    def batch(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return percentile_and_max(self.sample(y), self.percentile)


class MaxCap(CapObserver):
    """``max``: the max over all values (no setting: nothing is sampled)."""

    def __init__(self, *, rank: int = 0, world: int = 1) -> None:
        super().__init__(None, rank=rank, world=world)

    def batch(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        top = y.max()
        return top, top


class MseCap(CapObserver):
    """``mse``: per batch, the cap of least squared 5-bit error of ReLU(y), on ~2**18 values,
    searched over ``mse_candidates`` fractions of the batch max (its own sample: no max_values)."""

    def __init__(self, mse_candidates: int = 64, *, rank: int = 0, world: int = 1) -> None:
        _count("mse_candidates", mse_candidates, " (caps tried)")
        super().__init__(None, rank=rank, world=world)
        self.mse_candidates = mse_candidates

    def stride(self, n: int) -> int:
        return max(1, n // MSE_SAMPLE)

    def batch(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return mse_cap(self.sample(y), self.mse_candidates), y.max()


class KlCap(CapObserver):
    """``kl``: the cap whose 32-level quantization of all batches' histogram is closest in KL
    divergence (TensorRT's entropy calibration); ``max_values`` as in CapObserver."""

    def batch(self, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        sample, _ = self.share(y)  # counted, not gathered
        top = y.max()
        span = pow2_range(sample.max() if sample.numel() else top)
        self.kept.append((span, histogram(sample, span)))
        return torch.zeros((), device=y.device), top  # the statistic comes from all batches

    def kl_counts(self) -> tuple[float, torch.Tensor]:
        """(span, counts) of every batch of every rank in one histogram over the widest span
        (collective)."""
        spans = torch.stack([s for s, _ in self.kept]).cpu()
        top = float(dist.all_reduce_max(spans.max().reshape(1)))
        local = torch.zeros(KL_BINS, dtype=torch.int64)
        for s, (_, h) in zip(spans.tolist(), self.kept):
            local += rebin(h.cpu(), s, top)
        return top, dist.all_reduce_sum(local)

    def finish(self) -> None:
        span, counts = self.kl_counts()
        self.stat = torch.tensor(kl_threshold(counts, span), device=self.top.device)


@contextmanager
def observing(model: nn.Module, make: Callable[[], CapObserver] = PercentileCap
              ) -> Iterator[list[CapObserver]]:
    """``with observing(model, make): run batches; finalize_caps(model)``: a fresh ``make()`` per
    ChipConv (a stage's: mdk.calibration_config.observer of its node), removed on exit."""
    layers = chip_layers(model)
    for layer in layers:
        layer.observer = make()
    try:
        yield [layer.observer for layer in layers]
    finally:
        for layer in layers:
            layer.observer = None


@torch.no_grad()
def finalize_caps(model: nn.Module) -> list[float]:
    """Write every observer's statistic, maxed over ranks, into ``ChipConv.cap``; returns the caps.
    Collective: every rank must call it."""
    layers = chip_layers(model)
    for i, layer in enumerate(layers):
        if not isinstance(layer.observer, CapObserver) or layer.observer.stat is None:
            raise RuntimeError(f"layer {i} saw no calibration batch: run at least one "
                               "forward pass inside `with observing(model)` before finalize_caps")
    for layer in layers:
        layer.observer.finish()
    both = torch.stack([torch.stack([l.observer.stat, l.observer.top]) for l in layers])
    both = dist.all_reduce_max(both.to(layers[0].cap.device)).cpu()
    caps = []
    for i, (layer, (stat, top)) in enumerate(zip(layers, both.tolist())):
        cap = stat
        if not cap > 0:  # the 5-bit grid needs cap > 0
            cap = top if top > 0 else 1.0
            log.warning("layer %d: calibration statistic %.4g <= 0 (layer barely fires); "
                        "using cap %.4g", i, stat, cap)
        layer.cap.fill_(cap)
        caps.append(float(layer.cap))
    log.info("calibrated caps: %s", ", ".join(f"{c:.4g}" for c in caps))
    return caps


def save_caps(model: nn.Module, path: str | Path, meta: Optional[dict] = None) -> Path:
    """Write the per-layer caps to a JSON file (the caller decides which rank writes)."""
    return write_json(path, {"meta": meta or {}, "layers": [
        {"index": i, "mask_bits": int(l.mask_bits), "pool": bool(l.pool), "cap": float(l.cap)}
        for i, l in enumerate(chip_layers(model))]}, indent=2)
