"""5-bit unsigned chip activation (DESIGN §3): ``y_q = R(clamp(y, 0, cap) * 31 / cap) * cap / 31``.

A custom autograd function keeps the step3 iteration cheap: the forward runs a handful of in-place
passes over the activation and the backward is one mask multiply (straight-through inside
``[0, cap]``, zero gradient where the clamp is active), instead of the ~10 temporaries autograd
would record for the composed expression.

Rounding. For ``v >= 0`` round-half-away is ``floor(v + 0.5)`` in exact arithmetic, but in floating
point ``pred(0.5) + 0.5`` rounds up to 1. Adding ``h = pred(0.5)`` (largest float below 0.5)
instead is exact for every ``v >= 0`` of the dtype: a fraction of exactly 0.5 gives
``k + 1 - ulp/2`` which rounds (ties-to-even, or a coarser ulp for k >= 1) to ``k + 1``, and any
smaller fraction stays strictly below ``k + 1``. ``tests/test_quant_activation.py`` checks this
against ``round_half_away`` on every float near each tie and integer in 0..31. The scale is
applied as ``v * (31/cap)``, one multiply instead of two (at most 1 ulp from ``v*31/cap``; exact
for the fused cap 31).
"""
from __future__ import annotations

import torch



LEVELS = 31  # 5-bit unsigned: integers 0..31
_PRED_HALF: dict[torch.dtype, float] = {}


def _pred_half(dtype: torch.dtype) -> float:
    """Largest ``dtype`` value below 0.5 (cached; a Python float holds it exactly)."""
    if dtype not in _PRED_HALF:
        half = torch.tensor(0.5, dtype=dtype)
        _PRED_HALF[dtype] = float(torch.nextafter(half, torch.zeros_like(half)))
    return _PRED_HALF[dtype]


class _QuantAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        cap = cap.to(y.dtype)
        ctx.save_for_backward(y, cap)
        v = torch.clamp(y, torch.zeros_like(cap), cap)
        # v >= 0, so R (half away from zero) is "half up": floor(v + pred(0.5)), see module doc.
        v.mul_(LEVELS / cap).add_(_pred_half(v.dtype)).floor_()
        return v.mul_(cap / LEVELS)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        y, cap = ctx.saved_tensors
        inside = (y >= 0) & (y <= cap)
        return grad * inside, None


def quantize_activation(y: torch.Tensor, cap: torch.Tensor | float) -> torch.Tensor:
    """Clip to [0, cap] and round to the grid {k * cap / 31, k = 0..31}; STE inside [0, cap]."""
    if not torch.is_tensor(cap):
        cap = torch.tensor(float(cap), device=y.device)
    return _QuantAct.apply(y, cap)


def activation_levels(y_q: torch.Tensor, cap: torch.Tensor | float) -> torch.Tensor:
    """Integer level k (0..31) of an activation on the grid (for checks and the integer reference)."""
    return torch.round(y_q * LEVELS / cap).to(torch.int64)
