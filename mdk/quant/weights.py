"""Chip weight quantizers, vectorised over all 3x3 kernels of a layer (the formulas:
docs/pipeline.md, the chip quantization contract; against the GTI tools: docs/gti-compat.md, 4-6).

Every quantizer yields integer *mantissas* over one per-layer power of two (``w_q = w_int /
2**shift``). Training (``quantize_conv``) and export (``conv_mantissas``) share the code, so the
exported integers reproduce the trained weights bit for bit.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch

from mdk.quant.chips import SUPPORTED_MASKS
from mdk.quant.rounding import round_half_away

MAX_SHIFT = 12


# The GTI tools add this to max|x| before dividing (it keeps an all-zero tensor finite).
GTI_EPSILON = 1e-6


def _log2_term(max_abs: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """``int(log2((2^(bits-1)-1) / (max_abs + 1e-6)))`` with the GTI tools' ``dtype`` operations
    (docs/gti-compat.md, 4): torch's ``number / tensor`` is ``tensor.reciprocal() * number``, and
    ``log2`` runs in float64 rounded to ``dtype`` (float32: the same on every device and, truncated,
    equal to CPU torch's float32 log2)."""
    ratio = (max_abs.to(dtype) + GTI_EPSILON).reciprocal() * float(2 ** (bits - 1) - 1)
    return torch.log2(ratio.to(torch.float64)).to(dtype).trunc()


def compute_shift(w: torch.Tensor, b: Optional[torch.Tensor], weight_bits: int, bias_bits: int,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The per-layer shift (docs/pipeline.md) as the GTI tools evaluate it in ``dtype`` (float64:
    the converter's last layer). A 0-dim int64 tensor on ``w``'s device (no host sync). An
    all-zero ``w`` or ``b`` (or ``b=None``) does not constrain it; both zero give 12."""
    with torch.no_grad():
        s = _log2_term(w.detach().abs().max(), weight_bits, dtype)
        if b is not None and b.numel():
            s = torch.minimum(s, _log2_term(b.detach().abs().max(), bias_bits, dtype))
        return s.clamp(0, MAX_SHIFT).to(torch.int64)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)),
                       torch.zeros_like(num))


Rounding = Callable[[torch.Tensor], torch.Tensor]


def five_bit_coefficients(w: torch.Tensor, rnd: Rounding = round_half_away
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """5-bit mask: ``(R(w / step), step)`` with ``step = max|w| / 15`` per 3x3 kernel."""
    step = w.abs().amax(dim=(2, 3), keepdim=True) / 15
    return rnd(_safe_div(w, step)), step


def weight_mantissas(w: torch.Tensor, mask_bits: int, scale: torch.Tensor,
                     rnd: Rounding = round_half_away) -> torch.Tensor:
    """Integer-valued (float dtype) mantissas of the ``mask_bits`` quantizer, ``scale = 2**shift``."""
    if mask_bits in (8, 12):
        return rnd(w * scale)
    if mask_bits not in SUPPORTED_MASKS:
        raise ValueError(f"mask_bits={mask_bits} is not a chip mask; use one of {SUPPORTED_MASKS}")
    a = w.abs()
    sign = torch.sign(w)
    if mask_bits == 5:
        coef, step = five_bit_coefficients(w, rnd)
        return coef * rnd(step * scale)
    m = a.mean(dim=(2, 3), keepdim=True)  # per (out, in) kernel
    if mask_bits == 1:
        # A sign bit, never 0: w == 0 gets +QS(m), as in the GTI tools.
        q = rnd(m * scale)
        return torch.where(w >= 0, q, -q)
    if mask_bits == 2:
        qm_int = rnd(m * scale)
        keep = a >= (qm_int / scale) / 4  # |w| >= QS(m)/4, all exact power-of-two divisions
        return torch.where(keep, sign * qm_int, torch.zeros_like(w))
    # 3 bit
    step = m / 4
    coef = torch.trunc(_safe_div(a, step))
    coef = torch.where(coef >= 3, torch.full_like(coef, 4.0), coef)
    return sign * coef * rnd(step * scale)


def _quantize(w: torch.Tensor, b: torch.Tensor, mask_bits: int, weight_bits: int, bias_bits: int
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight mantissas, bias mantissas, shift, 2**shift) of a chip conv (it always has a bias)."""
    with torch.no_grad():
        shift = compute_shift(w, b, weight_bits, bias_bits)
        scale = torch.exp2(shift.to(w.dtype))
        return (weight_mantissas(w.detach(), int(mask_bits), scale),
                round_half_away(b.detach() * scale), shift, scale)


def quantize_conv(w: torch.Tensor, b: torch.Tensor, mask_bits: int, weight_bits: int,
                  bias_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fake-quantized (w_q, b_q) with straight-through gradients.

    ``w_q + (w - w.detach())``, not ``w + (w_q - w).detach()``: the latter is not exactly ``w_q``
    in floating point, and the integer reference needs exact values.
    """
    w_int, b_int, _, scale = _quantize(w, b, mask_bits, weight_bits, bias_bits)
    return w_int / scale + (w - w.detach()), b_int / scale + (b - b.detach())


def conv_mantissas(w: torch.Tensor, b: torch.Tensor, mask_bits: int, weight_bits: int,
                   bias_bits: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Export form: int64 weight and bias mantissas and the shift, ``w_q == w_int / 2**shift`` exactly."""
    w_int, b_int, shift, _ = _quantize(w, b, mask_bits, weight_bits, bias_bits)
    return w_int.to(torch.int64), b_int.to(torch.int64), int(shift)
