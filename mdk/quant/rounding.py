"""Chip rounding: round half **away from zero**, not torch.round (half to even), exact for every
float by adding ``pred(0.5)``, not 0.5 (docs/gti-compat.md, 2; the argument: mdk.quant.activation).
"""
from __future__ import annotations

import torch


def _pred(dtype: torch.dtype) -> float:
    half = torch.tensor(0.5, dtype=dtype)
    return float(torch.nextafter(half, torch.zeros_like(half)))


# Computed at import for every float dtype: a lookup inside a torch.compile'd model is then a
# constant, not a tensor read that would split the graph.
_PRED_HALF: dict[torch.dtype, float] = {d: _pred(d) for d in (torch.float16, torch.bfloat16,
                                                               torch.float32, torch.float64)}


def pred_half(dtype: torch.dtype) -> float:
    """Largest ``dtype`` value below 0.5 (a Python float holds it exactly)."""
    return _PRED_HALF[dtype] if dtype in _PRED_HALF else _pred(dtype)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """R(x): nearest integer, ties away from zero, any float dtype; zeros may come out as -0.0."""
    return torch.copysign(torch.floor(x.abs().add_(pred_half(x.dtype))), x)


def gti_round(x: torch.Tensor) -> torch.Tensor:
    """The GTI tools' R, ``floor(x + 0.5)`` / ``ceil(x - 0.5)``: only to find where the GTI
    converter writes another value than :func:`round_half_away` (mdk.quant.gti_converter)."""
    return torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5))


def round_shift_int(acc: torch.Tensor, shift: int) -> torch.Tensor:
    """Integer R(acc / 2**shift) with ties away from zero, for int64 tensors (integer reference)."""
    mag = (acc.abs() + ((1 << shift) >> 1)) >> shift  # shift 0: adds 0, shifts by 0
    return torch.where(acc < 0, -mag, mag)
