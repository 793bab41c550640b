"""5-bit unsigned chip activation (docs/pipeline.md): ``y_q = R(clamp(y, 0, cap) * 31 / cap) * cap / 31``.

A custom autograd function keeps step3 cheap: four forward passes and one fused
``hardtanh_backward`` pass (the STE) instead of the ~10 temporaries autograd would record.

Rounding: ``floor(v + 0.5)`` is wrong in floating point (``pred(0.5) + 0.5`` rounds to 1); adding
``h = pred(0.5)`` instead is exact for every ``v >= 0``: a fraction of exactly 0.5 gives
``k + 1 - ulp/2``, which rounds to ``k + 1``, and any smaller one stays below ``k + 1``.
``floor(clamp(y*31/cap + h, h, 31 + h))`` is the same function; ``h + y * (31/cap)`` is within an
ulp of ``y*31/cap`` (only exact ties can differ), and the fused cap 31 needs no scaling.

Devices: ``h`` and the scales are cached 0-dim tensors (a host-to-device copy per forward would
make CUDA wait). On CUDA the forward is one torch.compile'd kernel (eager ops, with a warning, if
that fails); inside a compiled model the cap stays a tensor, so no host value is read.
"""
from __future__ import annotations

import logging
from typing import Any, Callable, Optional

import torch

from mdk.quant.rounding import pred_half as _pred_half

log = logging.getLogger(__name__)

LEVELS = 31  # 5-bit unsigned: integers 0..31
_CONST: dict[tuple[float, torch.dtype, torch.device], torch.Tensor] = {}
_FUSED: dict[str, Any] = {"fn": None, "failed": False}


def quantize_input(images: torch.Tensor) -> torch.Tensor:
    """Chip input: 8-bit pixels become 5-bit integers ``((u8 >> 2) + 1) >> 1`` clipped to 0..31.

    Returned as floats 0..31 (the activation domain with c_0 = 31, so fusion needs no special
    first layer); float images are taken as 0..255 and truncated to uint8 first.
    """
    u8 = images if images.dtype == torch.uint8 else images.clamp(0, 255).to(torch.uint8)
    q = ((u8.to(torch.int16) >> 2) + 1) >> 1
    return q.clamp_(0, LEVELS).to(torch.float32)


def _const(value: float, dtype: torch.dtype, device: torch.device, role: str = "") -> torch.Tensor:
    """A cached 0-dim device tensor, so a forward makes no host-to-device copy. One per ``role``:
    the compiled kernel's arguments are never one tensor twice (scale and rescale are both 1.0 at
    cap 31), which torch.compile would guard on and compile a second kernel for."""
    key = (value, dtype, device, role)
    if key not in _CONST:
        if len(_CONST) > 4096:  # caps change between stages/runs; keep the table small
            _CONST.clear()
        _CONST[key] = torch.tensor(value, dtype=dtype, device=device)
    return _CONST[key]


def _eager_levels(y: torch.Tensor, h: torch.Tensor, scale: float, rescale: float) -> torch.Tensor:
    """floor(clamp(h + scale * y, h, 31 + h)) * rescale, in four passes (scale 1: three)."""
    hv = _pred_half(y.dtype)
    v = y + h if scale == 1.0 else torch.add(h, y, alpha=scale)
    v.clamp_(hv, LEVELS + hv).floor_()
    return v.mul_(rescale) if rescale != 1.0 else v


def _fused_levels() -> Optional[Callable[..., torch.Tensor]]:
    """The same expression as one CUDA kernel (torch.compile, built on first use)."""
    if _FUSED["failed"]:
        return None
    if _FUSED["fn"] is None:
        # Tensors for the per-layer scales (not floats): one compiled kernel serves every layer
        # (a float argument would be specialised: one recompile per cap).
        def levels(y: torch.Tensor, h: torch.Tensor, hv: float, scale: torch.Tensor,
                   rescale: torch.Tensor) -> torch.Tensor:
            return torch.floor(torch.clamp(h + y * scale, hv, LEVELS + hv)) * rescale

        _FUSED["fn"] = torch.compile(levels, dynamic=True)
    return _FUSED["fn"]

def _cap_value(cap: torch.Tensor) -> float:
    """Python float of the cap, cached on its version counter: reading a CUDA cap every forward
    would sync the device once per layer."""
    hit = getattr(cap, "_mdk_cap_cache", None)
    if hit is not None and hit[0] == cap._version:
        return hit[1]
    value = float(cap)
    cap._mdk_cap_cache = (cap._version, value)
    return value


class _QuantAct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, y: torch.Tensor, cap: float) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(y)
        ctx.cap = cap
        scale, rescale = (1.0, 1.0) if cap == LEVELS else (LEVELS / cap, cap / LEVELS)
        h = _const(_pred_half(y.dtype), y.dtype, y.device, "half")
        fused = _fused_levels() if y.is_cuda else None
        if fused is not None:
            try:
                return fused(y, h, _pred_half(y.dtype), _const(scale, y.dtype, y.device, "scale"),
                             _const(rescale, y.dtype, y.device, "rescale"))
            except Exception as e:  # noqa: BLE001 - a missing compiler must not stop training
                _FUSED["failed"] = True
                log.warning("fused 5-bit activation kernel unavailable (%s); using eager ops",
                            str(e).splitlines()[0] if str(e) else type(e).__name__)
        return _eager_levels(y, h, scale, rescale)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return torch.ops.aten.hardtanh_backward(grad, y, 0.0, ctx.cap), None


class _QuantActTensor(torch.autograd.Function):
    """The same quantizer with the cap as a tensor, for a ``torch.compile``d model."""

    @staticmethod
    def forward(ctx, y: torch.Tensor, cap: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        ctx.save_for_backward(y, cap)
        hv = _pred_half(y.dtype)
        c = cap.to(y.dtype)
        return torch.floor(torch.clamp(y * (LEVELS / c) + hv, hv, LEVELS + hv)) * (c / LEVELS)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):  # type: ignore[override]
        y, cap = ctx.saved_tensors
        return grad * ((y > 0) & (y < cap.to(y.dtype))).to(grad.dtype), None


def quantize_activation(y: torch.Tensor, cap: torch.Tensor | float) -> torch.Tensor:
    """Clip to [0, cap] and round to the grid {k * cap / 31, k = 0..31}; STE inside (0, cap)."""
    if torch.is_tensor(cap) and torch.compiler.is_compiling():
        return _QuantActTensor.apply(y, cap)
    c = _cap_value(cap) if torch.is_tensor(cap) else float(cap)
    if not c > 0:
        raise ValueError(f"activation cap must be > 0 (got {c}); calibrate first (step=cal)")
    return _QuantAct.apply(y, c)
