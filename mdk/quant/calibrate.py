"""Calibration (step ``cal``): per-layer activation caps from the pre-activation conv outputs.

Each ChipConv gets an observer (``ChipConv.observer``) that sees every batch's conv(+BN) output
before the activation. Per batch it computes a statistic; the layer's cap is the max over batches
(and, under DDP, the MAX all-reduce over ranks of those per-rank maxima):

- ``percentile`` (default, p=99): the **nearest-rank** percentile of all values of the batch tensor,
  i.e. the k-th smallest value with ``k = ceil(p/100 * N)`` (clamped to 1..N, computed in exact
  rational arithmetic from the decimal ``p``). This equals ``numpy.percentile(x, p,
  method="inverted_cdf")`` except when ``p/100 * N`` is an exact integer, where numpy's float
  product may land just above it and pick the next value. The values are the whole batch tensor
  when it has at most ``max_values`` elements (default ``2**20``); a larger tensor is read at a
  deterministic odd stride ``s = ceil(N / max_values) | 1`` (``y.flatten()[::s]``, at least
  ``max_values / 2`` values, so the rank error is ~1e-4 of a percent) and the percentile is exact
  for that subsample. ``max_values=None`` always uses every value (slower on 448x448 inputs). It is computed exactly but fast: a strided
  sample gives a threshold a bit below the target, one comparison pass keeps the few values above
  it, and ``kthvalue`` on those gives the exact answer (full ``kthvalue`` if the sample misled).
- ``max``: the batch maximum.
- ``mse``: the cap minimising the mean squared error between ReLU(y) and its 5-bit quantization,
  searched over ``mse_candidates`` fractions of the batch max on a strided sample of at most
  ``2**18`` values (a search, so a sample is enough; documented as approximate).

A cap <= 0 (a layer whose outputs are mostly negative) would make the 5-bit grid meaningless; the
observed positive max is used instead, or 1.0 if the layer never fires, with a warning.
"""
from __future__ import annotations

import json
import logging
import math
from contextlib import contextmanager
from fractions import Fraction
from pathlib import Path
from typing import Iterator, Optional

import torch
from torch import nn

from mdk import dist
from mdk.quant.activation import LEVELS
from mdk.quant.rounding import pred_half
from mdk.quant.bn_fold import chip_layers

log = logging.getLogger(__name__)

METHODS = ("percentile", "max", "mse")
_SAMPLE = 1 << 14  # values in the strided sample that guides the exact percentile selection
_MSE_SAMPLE = 1 << 18
DEFAULT_MAX_VALUES = 1 << 20


def subsample(x: torch.Tensor, max_values: Optional[int]) -> torch.Tensor:
    """All values of ``x`` (flattened), or every s-th one with odd ``s = ceil(N / max_values) | 1``.

    An odd stride does not line up with the power-of-two feature-map sizes, so it visits all
    rows, columns and channels evenly.
    """
    x = x.detach()
    n = x.numel()
    if max_values is None or n <= max_values:
        return x.reshape(-1)
    step = math.ceil(n / max_values) | 1
    if x.is_contiguous():
        return x.reshape(-1)[::step]
    # channels_last (or any other layout): the same elements, in the same logical order, read
    # through the strides (reshape would first copy the whole activation: 822 MB at layer 1 of
    # GNetDet-448 for a batch of 32 in bf16)
    return torch.take(x, torch.arange(0, n, step, device=x.device))


def nearest_rank(p: float, n: int) -> int:
    """1-based rank ``ceil(p/100 * n)`` in exact rational arithmetic (no float ceil surprises)."""
    k = math.ceil(Fraction(str(p)) * n / 100)
    return min(max(k, 1), n)


def percentile_and_max(x: torch.Tensor, p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(nearest-rank p-th percentile, max) of all values of ``x``, as 0-dim tensors.

    The max comes for free from the kept values on the fast path (they include the largest).
    """
    flat = x.detach().reshape(-1)
    n = flat.numel()
    k = nearest_rank(p, n)
    if k == n:
        top = flat.max()
        return top, top
    if flat.is_cuda:
        # The k-th smallest is the smallest of the n - k + 1 largest: one top-k (a radix select
        # on the GPU), without the shortcut below, which reads sizes back to the host several
        # times per layer and batch. (kthvalue on CUDA: the cal pass at 6x the eval pass's time
        # on an H100, measured with benchmarks/bench_gpu.py.)
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


def percentile_exact(x: torch.Tensor, p: float) -> torch.Tensor:
    """Nearest-rank p-th percentile of all values of ``x`` (0-dim tensor, same dtype/device)."""
    return percentile_and_max(x, p)[0]


def mse_cap(x: torch.Tensor, candidates: int = 64) -> torch.Tensor:
    """Cap minimising E[(Q(relu(y), cap) - relu(y))^2] over ``candidates`` fractions of max(y).

    All candidates at once on the tensor's device, in chunks of candidates (no host read: the
    first of equal errors wins, as a loop over them would choose)."""
    flat = x.detach().reshape(-1)
    sample = flat[:: max(1, flat.numel() // _MSE_SAMPLE)].float().clamp_min(0)
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


class CapObserver:
    """Running max over batches of a per-batch statistic of one layer's pre-activation output."""

    def __init__(self, method: str = "percentile", percentile: float = 99.0,
                 mse_candidates: int = 64, max_values: Optional[int] = DEFAULT_MAX_VALUES) -> None:
        if method not in METHODS:
            raise ValueError(f"calibration method={method!r} is unknown; use one of {METHODS}")
        if not 0 < float(percentile) <= 100:
            raise ValueError(f"calibration percentile={percentile} must be in (0, 100]")
        if max_values is not None and max_values < 1:
            raise ValueError(f"calibration max_values={max_values} must be >= 1 or null (all)")
        self.method, self.percentile, self.mse_candidates = method, float(percentile), mse_candidates
        self.max_values = max_values
        self.stat: Optional[torch.Tensor] = None  # running max of the per-batch statistic
        self.top: Optional[torch.Tensor] = None  # running max of the raw values (fallback)
        self.batches = 0

    @torch.no_grad()
    def __call__(self, y: torch.Tensor) -> None:
        if self.method == "max":
            s = y.max()
            top = s
        elif self.method == "percentile":
            s, top = percentile_and_max(subsample(y, self.max_values), self.percentile)
        else:
            s, top = mse_cap(y, self.mse_candidates), y.max()
        s, top = s.float(), top.float()
        self.stat = s if self.stat is None else torch.maximum(self.stat, s)
        self.top = top if self.top is None else torch.maximum(self.top, top)
        self.batches += 1


def attach_observers(model: nn.Module, method: str = "percentile", percentile: float = 99.0,
                     mse_candidates: int = 64,
                     max_values: Optional[int] = DEFAULT_MAX_VALUES) -> list[CapObserver]:
    """Give every ChipConv a fresh CapObserver; returns them in layer order."""
    observers = []
    for layer in chip_layers(model):
        layer.observer = CapObserver(method, percentile, mse_candidates, max_values)
        observers.append(layer.observer)
    return observers


def detach_observers(model: nn.Module) -> None:
    for layer in chip_layers(model):
        layer.observer = None


@contextmanager
def observing(model: nn.Module, method: str = "percentile", percentile: float = 99.0,
              mse_candidates: int = 64,
              max_values: Optional[int] = DEFAULT_MAX_VALUES) -> Iterator[list[CapObserver]]:
    """``with observing(model): run batches; finalize_caps(model)`` - observers removed on exit."""
    obs = attach_observers(model, method, percentile, mse_candidates, max_values)
    try:
        yield obs
    finally:
        detach_observers(model)


@torch.no_grad()
def finalize_caps(model: nn.Module) -> list[float]:
    """MAX-all-reduce every observer's statistic across ranks and write it into ``ChipConv.cap``.

    Every rank must call it (collective). Returns the caps in layer order.
    """
    layers = chip_layers(model)
    for i, layer in enumerate(layers):
        if not isinstance(layer.observer, CapObserver) or layer.observer.stat is None:
            raise RuntimeError(f"layer {i} saw no calibration batch: attach_observers(model) and "
                               "run at least one forward pass before finalize_caps")
    both = torch.stack([torch.stack([l.observer.stat, l.observer.top]) for l in layers])
    both = dist.all_reduce_max(both.to(layers[0].cap.device)).cpu()
    caps = []
    for i, (layer, (stat, top)) in enumerate(zip(layers, both.tolist())):
        cap = stat
        if not cap > 0:
            cap = top if top > 0 else 1.0
            log.warning("layer %d: calibration statistic %.4g <= 0 (layer barely fires); "
                        "using cap %.4g", i, stat, cap)
        layer.cap.fill_(cap)
        caps.append(float(layer.cap))
    log.info("calibrated caps: %s", ", ".join(f"{c:.4g}" for c in caps))
    return caps


def save_caps(model: nn.Module, path: str | Path, meta: Optional[dict] = None) -> Path:
    """Write the per-layer caps to a human-readable JSON file (rank 0 decides; caller's choice)."""
    path = Path(path)
    layers = chip_layers(model)
    doc = {"meta": meta or {},
           "layers": [{"index": i, "mask_bits": int(l.mask_bits), "pool": bool(l.pool),
                       "cap": float(l.cap)} for i, l in enumerate(layers)]}
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(path)
    return path


@torch.no_grad()
def load_caps(model: nn.Module, path: str | Path) -> list[float]:
    """Read caps written by ``save_caps`` into the model (layer count must match)."""
    doc = json.loads(Path(path).read_text())
    layers = chip_layers(model)
    entries = doc.get("layers", [])
    if len(entries) != len(layers):
        raise ValueError(f"{path}: has {len(entries)} layer caps but the model has {len(layers)} "
                         "chip layers; was it written for another model config?")
    for layer, e in zip(layers, entries):
        layer.cap.fill_(float(e["cap"]))
    return [float(e["cap"]) for e in entries]
