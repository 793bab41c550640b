"""Rounding, shift rule and every mask quantizer vs straightforward per-kernel references (docs/pipeline.md)."""
import math
from fractions import Fraction

import pytest
import torch

from mdk.quant.rounding import round_half_away, round_shift_int
from mdk.quant.chips import CHIP_BITS, chip_bits
from mdk.quant.weights import compute_shift, conv_mantissas, quantize_conv


def R(v: float) -> float:  # reference: half away from zero, in exact rational arithmetic
    return math.copysign(float(math.floor(Fraction(abs(v)) + Fraction(1, 2))), v)


def sgn(v: float) -> float:
    return (v > 0) - (v < 0)


def ref_shift(w, b, wb, bb):
    terms = []
    for t, bits in ((w, wb), (b, bb)):
        mx = float(t.abs().max())
        if mx > 0:
            terms.append(int(math.log2((2 ** (bits - 1) - 1) / mx)))
    return min(max(min(terms), 0), 12) if terms else 12


def ref_quant(w, b, mask, wb, bb):
    s = ref_shift(w, b, wb, bb)
    sc = 2.0 ** s
    QS = lambda v: R(v * sc) / sc  # noqa: E731
    out = torch.zeros(w.shape, dtype=torch.float64)
    for o in range(w.shape[0]):
        for i in range(w.shape[1]):
            k = [float(v) for v in w[o, i].flatten()]
            m = sum(abs(v) for v in k) / len(k)
            q = []
            for v in k:
                if mask == 1:  # a sign bit: w == 0 gets +QS(m) (issue #16; was 0 before)
                    q.append((1.0 if v >= 0 else -1.0) * QS(m))
                elif mask == 2:
                    q.append(sgn(v) * QS(m) if abs(v) >= QS(m) / 4 else 0.0)
                elif mask == 3:
                    step = m / 4
                    c = math.trunc(abs(v) / step) if step > 0 else 0
                    q.append(sgn(v) * (4 if c >= 3 else c) * QS(step))
                elif mask == 5:
                    step = max(abs(x) for x in k) / 15
                    q.append((R(v / step) if step > 0 else 0.0) * QS(step))
                else:
                    q.append(QS(v))
            out[o, i] = torch.tensor(q, dtype=torch.float64).view(w.shape[2:])
    bq = torch.tensor([QS(float(v)) for v in b], dtype=torch.float64)
    return out, bq, s


def test_round_half_away():
    x = torch.tensor([2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 2.4999998, -2.4999998, 0.49999997,
                      -0.49999997, 3.0, -7.0, 0.0, 1e20, -1e20])
    want = torch.tensor([3.0, -3, 1, -1, 2, -2, 2, -2, 0, 0, 3, -7, 0, 1e20, -1e20])
    assert torch.equal(round_half_away(x), want)
    assert torch.equal(round_half_away(x.double()), want.double())
    assert round_half_away(torch.tensor(2.5)) == 3 and round_half_away(torch.tensor(-2.5)) == -3
    # differs from torch.round (half to even) exactly on even ties
    assert torch.round(torch.tensor(2.5)) == 2


def test_round_shift_int():
    acc = torch.arange(-40, 41, dtype=torch.int64)
    for s in (0, 1, 2, 3):
        want = torch.tensor([R(v / 2 ** s) for v in acc.tolist()], dtype=torch.int64)
        assert torch.equal(round_shift_int(acc, s), want)


@pytest.mark.parametrize("scale", [1.0, 1e-6, 300.0, 1e-2])
@pytest.mark.parametrize("wb,bb", [(8, 20), (12, 12), (12, 18)])
def test_compute_shift_matches_formula(scale, wb, bb):
    g = torch.Generator().manual_seed(int(scale * 1000) + wb + bb)
    for _ in range(5):
        w = torch.randn(4, 3, 3, 3, generator=g) * scale
        b = torch.randn(4, generator=g) * scale * 3
        assert int(compute_shift(w, b, wb, bb)) == ref_shift(w, b, wb, bb)


def test_compute_shift_zero_and_truncation():
    z = torch.zeros(2, 2, 3, 3)
    assert int(compute_shift(z, torch.zeros(2), 8, 20)) == 12
    assert int(compute_shift(z, None, 8, 20)) == 12
    w = torch.zeros(2, 2, 3, 3)
    w[0, 0, 0, 0] = 127 / 8  # log2(127 / max) = 3 exactly
    assert int(compute_shift(w, torch.zeros(2), 8, 20)) == 3
    w[0, 0, 0, 0] = 127 / 8 * 1.001  # log2 = 2.998 -> int() truncates to 2
    assert int(compute_shift(w, torch.zeros(2), 8, 20)) == 2
    w[0, 0, 0, 0] = 1000.0  # log2 < 0 -> truncates toward zero, then clamped at 0
    assert int(compute_shift(w, torch.zeros(2), 8, 20)) == 0
    # the bias term limits the shift when it is the larger one relative to its bits
    assert int(compute_shift(torch.full((1, 1, 3, 3), 1e-3), torch.tensor([2.0 ** 10]), 8, 12)) == 0


@pytest.mark.parametrize("mask,wb,bb", [(1, 8, 20), (2, 12, 12), (3, 8, 20), (3, 12, 18),
                                        (5, 12, 16), (8, 8, 20), (12, 12, 20)])
@pytest.mark.parametrize("scale", [1.0, 1e-5, 1e4, 0.05])
def test_quantizers_match_reference(mask, wb, bb, scale):
    g = torch.Generator().manual_seed(mask * 100 + wb + int(math.log10(scale) + 10))
    w = torch.randn(6, 5, 3, 3, generator=g) * scale
    w[1, 2] = 0.0  # all-zero kernel
    w[2, 3, 1, 1] = 0.0  # an exact zero weight
    w[3, :, :, :2] *= 100  # kernels with very different magnitudes inside one layer
    b = torch.randn(6, generator=g) * scale
    b[0] = 0.0
    want_w, want_b, want_s = ref_quant(w, b, mask, wb, bb)
    w_q, b_q = quantize_conv(w, b, mask, wb, bb)
    assert torch.equal(w_q.double(), want_w), (w_q.double() - want_w).abs().max()
    assert torch.equal(b_q.double(), want_b)
    assert torch.all(w_q[1, 2] == 0)
    w_int, b_int, s = conv_mantissas(w, b, mask, wb, bb)
    assert s == want_s and w_int.dtype == torch.int64 and b_int.dtype == torch.int64
    assert torch.equal(w_int.double() / 2 ** s, w_q.double())  # exact mantissa form
    assert torch.equal(b_int.double() / 2 ** s, b_q.double())


def test_mask_value_sets():
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8, 8, 3, 3, generator=g)
    b = torch.zeros(8)
    for mask, allowed in ((1, {-1, 1}), (2, {-1, 0, 1}), (3, {-4, -2, -1, 0, 1, 2, 4})):
        w_int, _, _ = conv_mantissas(w, b, mask, 8, 20)
        per_kernel = w_int.flatten(2)
        unit = per_kernel.abs().amax(-1, keepdim=True)  # the kernel's largest mantissa
        top = max(allowed)
        ratio = per_kernel * top / unit.clamp_min(1)
        assert set(ratio.unique().tolist()) <= allowed, mask
    w_int, _, _ = conv_mantissas(w, b, 5, 12, 16)
    assert w_int.flatten(2).abs().amax(-1).gt(0).all()


def test_ste_gradient_is_identity():
    g = torch.Generator().manual_seed(0)
    for mask in (1, 2, 3, 5, 8, 12):
        w = torch.randn(3, 2, 3, 3, generator=g, requires_grad=True)
        b = torch.randn(3, generator=g, requires_grad=True)
        w_q, b_q = quantize_conv(w, b, mask, 12, 20)
        gw, gb = torch.randn_like(w), torch.randn_like(b)
        ((w_q * gw).sum() + (b_q * gb).sum()).backward()
        assert torch.equal(w.grad, gw) and torch.equal(b.grad, gb)


def test_chip_bits_table_and_errors():
    assert CHIP_BITS["5801"][3] == (8, 20) and CHIP_BITS["2801"][3] == (12, 18)
    assert chip_bits("2803", 12) == (12, 20) and chip_bits(5801, 8) == (8, 20)
    with pytest.raises(ValueError, match="chip 2801 does not support 8-bit"):
        chip_bits("2801", 8)
    with pytest.raises(ValueError, match="chip='9999' must be 5801, 2801 or 2803"):
        chip_bits("9999", 3)
    with pytest.raises(ValueError, match="mask_bits=4"):
        quantize_conv(torch.randn(1, 1, 3, 3), torch.zeros(1), 4, 8, 20)


def test_round_half_away_exact_near_ties_both_signs():
    for dtype in (torch.float32, torch.float64):
        c = torch.arange(-40, 40.5, 0.5, dtype=dtype)
        vals, up, down = [c], c.clone(), c.clone()
        for _ in range(300):
            up = torch.nextafter(up, torch.full_like(up, 1e3))
            down = torch.nextafter(down, torch.full_like(down, -1e3))
            vals += [up, down]
        v = torch.cat(vals)
        want = torch.tensor([R(x) for x in v.tolist()], dtype=dtype)
        assert torch.equal(round_half_away(v), want)


def test_eval_weight_cache_tracks_parameter_changes():
    from mdk.quant.layers import ChipConv
    layer = ChipConv(2, 3, mask_bits=8)
    layer.quant_weight = True
    x = torch.randn(1, 2, 5, 5)
    with torch.no_grad():
        a = layer(x)
        assert torch.equal(layer(x), a)
        layer.conv.weight.mul_(2)  # in-place change (optimizer step, fusion) must invalidate
        b = layer(x)
    want_w, want_b = quantize_conv(layer.conv.weight, layer.conv.bias, 8, 8, 20)
    want = torch.nn.functional.relu(torch.nn.functional.conv2d(x, want_w, want_b, padding=1))
    assert not torch.equal(a, b) and torch.equal(b, want.detach())
