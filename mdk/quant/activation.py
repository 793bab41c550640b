"""5-bit unsigned chip activation (DESIGN §3): ``y_q = R(clamp(y, 0, cap) * 31 / cap) * cap / 31``.

A custom autograd function keeps the step3 iteration cheap: the forward is four passes over the
activation and the backward is one fused ``hardtanh_backward`` pass (straight-through for
``0 < y < cap``, zero gradient where the clamp is active; y exactly 0 or cap, a measure-zero set,
gets zero), instead of the ~10 temporaries autograd would record for the composed expression.

Rounding. For ``v >= 0`` round-half-away is ``floor(v + 0.5)`` in exact arithmetic, but in floating
point ``pred(0.5) + 0.5`` rounds up to 1. Adding ``h = pred(0.5)`` (largest float below 0.5)
instead is exact for every ``v >= 0`` of the dtype: a fraction of exactly 0.5 gives
``k + 1 - ulp/2`` which rounds (ties-to-even, or a coarser ulp for k >= 1) to ``k + 1``, and any
smaller fraction stays strictly below ``k + 1``. ``tests/test_quant_activation.py`` checks this
against ``round_half_away`` on every float near each tie and integer in 0..31. Clamping after
scaling, ``floor(clamp(y*31/cap + h, h, 31 + h))``, is the same function. The scale is applied as
``h + y * (31/cap)`` in one pass, within an ulp of ``y*31/cap`` (so only exact ties can differ);
for the fused cap 31 no scaling happens and the result is exactly ``R(clamp(y, 0, 31))``.
"""
from __future__ import annotations

import torch

from mdk.quant.rounding import pred_half as _pred_half

LEVELS = 31  # 5-bit unsigned: integers 0..31

def _cap_value(cap: torch.Tensor) -> float:
    """Python float of the cap, cached on the tensor until it is modified in place.

    ``hardtanh`` and ``torch.add(alpha=)`` take Python numbers; reading a CUDA cap every forward
    would sync the device once per layer, so the value is cached and keyed on the tensor's
    version counter (``fill_`` / ``load_state_dict`` bump it).
    """
    hit = getattr(cap, "_mdk_cap_cache", None)
    if hit is not None and hit[0] == cap._version:
        return hit[1]
    value = float(cap)
    cap._mdk_cap_cache = (cap._version, value)
    return value


class _QuantAct(torch.autograd.Function):
    """Forward: 4 passes (scale+offset, clamp, floor, rescale). Backward: one fused
    ``hardtanh_backward`` pass (gradient passes where 0 < y < cap), like ReLU's one pass."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, cap: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(y)
        ctx.cap = cap
        h = _pred_half(y.dtype)
        # floor(clamp(y*31/cap, 0, 31) + h) == R(clamp(y, 0, cap) * 31/cap) (see module doc)
        if cap == LEVELS:  # fused model: y + h exactly, no scaling
            v = y + h
        else:  # h + (31/cap) * y in one pass
            v = torch.add(torch.tensor(h, dtype=y.dtype, device=y.device), y, alpha=LEVELS / cap)
        v.clamp_(h, LEVELS + h).floor_()
        return v.mul_(cap / LEVELS) if cap != LEVELS else v

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return torch.ops.aten.hardtanh_backward(grad, y, 0.0, ctx.cap), None


def quantize_activation(y: torch.Tensor, cap: torch.Tensor | float) -> torch.Tensor:
    """Clip to [0, cap] and round to the grid {k * cap / 31, k = 0..31}; STE inside (0, cap)."""
    c = _cap_value(cap) if torch.is_tensor(cap) else float(cap)
    if not c > 0:
        raise ValueError(f"activation cap must be > 0 (got {c}); calibrate first (step=cal)")
    return _QuantAct.apply(y, c)


def activation_levels(y_q: torch.Tensor, cap: torch.Tensor | float) -> torch.Tensor:
    """Integer level k (0..31) of an activation on the grid (for checks and the integer reference)."""
    return torch.round(y_q * LEVELS / cap).to(torch.int64)
