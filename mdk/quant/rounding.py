"""Chip rounding: round half **away from zero** (DESIGN §3), not torch.round (half to even).

``floor(|x| + 0.5)`` is the textbook formula but is wrong in floating point: for the largest float
below 0.5 (0.49999997 in float32) ``x + 0.5`` rounds up to 1.0. We instead split ``x`` into its
integer part and fraction, both of which are exact in IEEE arithmetic, and decide on the fraction.
"""
from __future__ import annotations

import torch


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """R(x): nearest integer, ties away from zero (R(2.5)=3, R(-2.5)=-3). Works for any float dtype."""
    t = torch.trunc(x)
    frac = x - t  # exact: |frac| < 1 and t shares x's exponent range
    return torch.where(frac.abs() >= 0.5, t + torch.sign(x), t)


def round_half_up_nonneg_(v: torch.Tensor) -> torch.Tensor:
    """In-place R(v) for ``v >= 0`` (the activation path): fewer passes than ``round_half_away``.

    For non-negative values "half away from zero" is "half up"; the fraction test keeps it exact.
    """
    f = torch.floor(v)
    v.sub_(f)  # v now holds the exact fractional part in [0, 1)
    return f.add_(v.ge_(0.5))


def round_shift_int(acc: torch.Tensor, shift: int) -> torch.Tensor:
    """Integer R(acc / 2**shift) with ties away from zero, for int64 tensors (integer reference)."""
    if shift == 0:
        return acc.clone()
    half = 1 << (shift - 1)
    mag = (acc.abs() + half) >> shift
    return torch.where(acc < 0, -mag, mag)
