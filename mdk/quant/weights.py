"""Chip weight quantizers (docs/pipeline.md), vectorised over all 3x3 kernels of a layer.

Every quantizer is computed as integer *mantissas* times one per-layer power of two:
``w_q = w_int / 2**shift`` and ``b_q = b_int / 2**shift``. The fake-quant training path
(``quantize_conv``) and the export path (``conv_mantissas``) share the same code, so the exported
integers reproduce the trained fake-quant weights bit for bit (dividing an integer below 2**24 by a
power of two is exact in float32).

Formulas, with ``QS(v) = R(v * 2**shift) / 2**shift`` and ``m`` = mean |w| of one 3x3 kernel:

- 1 bit: ``+QS(m)`` where ``w >= 0``, ``-QS(m)`` where ``w < 0`` (a chip 1-bit weight is a sign,
  never 0; ``w = 0`` gives ``+QS(m)`` as in the GTI tools)
- 2 bit: ``sign(w) * QS(m)`` where ``|w| >= QS(m)/4``, else 0
- 3 bit: ``step = m/4``, ``c = trunc(|w|/step)``, ``c >= 3 -> 4``: ``sign(w) * c * QS(step)``
- 5 bit: ``step = max|w|/15`` per kernel: ``R(w/step) * QS(step)``
- 8 / 12 bit: ``QS(w)``;  bias: ``QS(b)``

An all-zero kernel gives step 0; its 0/0 coefficients are defined as 0 (the kernel stays zero).

The per-layer shift is computed the way the GTI tools compute it (``compute_shift``), so at an exact
power-of-two boundary a model gets the same shift, and the same chip integers, from mdk and GTI.
"""
from __future__ import annotations

import logging
from typing import Callable, Optional

import torch

from mdk.quant.chips import SUPPORTED_MASKS
from mdk.quant.rounding import round_half_away

log = logging.getLogger(__name__)

MAX_SHIFT = 12


# The GTI tools add this to max|x| before dividing (it keeps an all-zero tensor finite).
GTI_EPSILON = 1e-6


def _log2_term(max_abs: torch.Tensor, bits: int) -> torch.Tensor:
    """``int(log2((2^(bits-1)-1) / (max_abs + 1e-6)))`` evaluated as the GTI tools evaluate it.

    The GTI MDK computes ``(2.**(bits-1)-1) / (1e-6 + max|x|)`` on float32 parameters; torch
    evaluates ``number / tensor`` as ``tensor.reciprocal() * number``, so the ratio here is made
    with the same float32 operations (IEEE: the same on CPU and CUDA). Then a float32 ``log2`` and
    ``int`` (truncation). Both float32 steps matter at an exact boundary ``max|w| = 127/2^k``
    (8-bit weights): the epsilon leaves the ratio a few ulps below ``2^k`` and for k >= 4 its
    float32 log2 stays below k (shift k-1); for k <= 3 the ratio or its log2 rounds back to
    exactly 2^k or k (shift k). ``log2`` runs here in float64 and is rounded to float32, i.e. the
    correctly rounded float32 log2: the same on every device, and after truncation equal to CPU
    torch's float32 ``log2`` (what the GTI converter runs) on every float32 within 3000 ulps of
    each power of two 2^-10..2^45 (checked exhaustively; further away a last-ulp difference
    cannot cross an integer). An all-zero tensor gives ``log2((2^(bits-1)-1) / 1e-6) >= 26``: no
    limit below the clamp at 12.
    """
    denom = max_abs.to(torch.float32) + GTI_EPSILON
    ratio = denom.reciprocal() * float(2 ** (bits - 1) - 1)
    return torch.log2(ratio.to(torch.float64)).to(torch.float32).trunc()


def compute_shift(w: torch.Tensor, b: Optional[torch.Tensor], weight_bits: int,
                  bias_bits: int) -> torch.Tensor:
    """Per-layer shift ``clamp(min(int(log2((2^(wb-1)-1)/max|W|)), int(log2((2^(bb-1)-1)/max|b|))), 0, 12)``.

    Evaluated as the GTI tools do (float32, ``1e-6`` added to each max, see ``_log2_term``), so at
    exact power-of-two boundaries the shift can be one less than the exact formula gives. Returns a
    0-dim int64 tensor on ``w``'s device (no host sync in the training loop). ``int`` truncates
    toward zero. An all-zero ``w`` or ``b`` (or ``b=None``) does not constrain the shift; if both
    are zero the shift is the maximum, 12. A float64 parameter's max is first rounded to float32.
    """
    with torch.no_grad():
        s = _log2_term(w.detach().abs().max(), weight_bits)
        if b is not None and b.numel():
            s = torch.minimum(s, _log2_term(b.detach().abs().max(), bias_bits))
        return s.clamp(0, MAX_SHIFT).to(torch.int64)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    """num/den with 0/0 (all-zero kernel) defined as 0."""
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)),
                       torch.zeros_like(num))


Rounding = Callable[[torch.Tensor], torch.Tensor]


def five_bit_coefficients(w: torch.Tensor, rnd: Rounding = round_half_away
                          ) -> tuple[torch.Tensor, torch.Tensor]:
    """5-bit mask: ``(R(w / step), step)`` with ``step = max|w| / 15`` per 3x3 kernel (0 for an
    all-zero kernel, whose coefficients are 0)."""
    step = w.abs().amax(dim=(2, 3), keepdim=True) / 15
    return rnd(_safe_div(w, step)), step


def weight_mantissas(w: torch.Tensor, mask_bits: int, scale: torch.Tensor,
                     rnd: Rounding = round_half_away) -> torch.Tensor:
    """Integer-valued (float dtype) mantissas of the ``mask_bits`` quantizer; ``scale = 2**shift``.
    ``rnd``: the rounding (mdk.quant.rounding.gti_round replays the GTI tools' float formula)."""
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
        # A sign bit, never 0: w == 0 (either zero) gets +QS(m), as in the GTI tools.
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


def _quantize(w: torch.Tensor, b: Optional[torch.Tensor], mask_bits: int, weight_bits: int,
              bias_bits: int) -> tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]:
    with torch.no_grad():
        shift = compute_shift(w, b, weight_bits, bias_bits)
        scale = torch.exp2(shift.to(w.dtype))
        w_int = weight_mantissas(w.detach(), int(mask_bits), scale)
        b_int = round_half_away(b.detach() * scale) if b is not None else None
    return w_int, b_int, shift


def quantize_conv(w: torch.Tensor, b: Optional[torch.Tensor], mask_bits: int, weight_bits: int,
                  bias_bits: int) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """Fake-quantized (w_q, b_q) with straight-through gradients (d w_q / d w = identity).

    ``w_q.detach() + (w - w.detach())`` is used instead of ``w + (w_q - w).detach()`` because the
    latter is not exactly ``w_q`` in floating point, and the integer reference needs exact values.
    """
    w_int, b_int, shift = _quantize(w, b, mask_bits, weight_bits, bias_bits)
    scale = torch.exp2(shift.to(w.dtype))
    w_q = w_int / scale + (w - w.detach())
    b_q = None if b is None else b_int / scale + (b - b.detach())
    return w_q, b_q


def conv_mantissas(w: torch.Tensor, b: Optional[torch.Tensor], mask_bits: int, weight_bits: int,
                   bias_bits: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Export form: int64 weight and bias mantissas and the shift, ``w_q == w_int / 2**shift`` exactly."""
    w_int, b_int, shift = _quantize(w, b, mask_bits, weight_bits, bias_bits)
    if b_int is None:
        b_int = torch.zeros(w.shape[0], dtype=w.dtype, device=w.device)
    return w_int.to(torch.int64), b_int.to(torch.int64), int(shift)
