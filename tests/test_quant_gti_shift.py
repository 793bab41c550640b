"""Issue #16, part 1: the shift as the GTI tools compute it, 1-bit weights as signs, and fake-quant
== export == integer reference at exact boundaries and exact zeros."""
import pytest
import torch

from mdk.quant import integer_ref
from mdk.quant.chip_model import chip_model_from
try:  # the stage switch moved to mdk.stage in the engine rewrite
    from mdk.stage import apply_stage
except ImportError:
    from mdk.quant.stages import apply_stage
from mdk.quant.weights import compute_shift, conv_mantissas, quantize_conv
from helpers.gti import _fused_model


def gti_expression(t: torch.Tensor, bits: int) -> int:
    """The GTI MDK's documented shift term, evaluated the way it is written there: float32 CPU
    tensors, ``(2.**(bits-1)-1) / (1e-6 + max|x|)``, ``log2``, ``int`` (truncation)."""
    m = torch.max(torch.abs(t.to(torch.float32)))
    return int(torch.log2((2.0 ** (bits - 1) - 1) / (1e-6 + m)).int())


def layer_with_max(value: float, shape=(2, 2, 3, 3)) -> torch.Tensor:
    w = torch.full(shape, value / 7)
    w[1, 0, 2, 1] = -value  # the layer's max |w| is exactly `value` (a negative weight)
    return w


# shift chosen by the GTI tools when max|w| is exactly (2^(bits-1)-1)/2^k, for k = 0..12.
# 8-bit: 1e-6 is less than one ulp of 127/2^k for k <= 1 (absorbed); for k = 2, 3 it moves the
# max by one ulp but reciprocal * 127 rounds back to exactly 2^k; from k = 4 the ratio stays
# 2..542 ulps below 2^k and log2 < k, so int() gives k - 1.
# 12-bit: for k = 8, 9 the ratio is 2-4 ulps below 2^k but float32 log2 rounds to exactly k;
# from k = 10 it is one less.
GTI_BOUNDARY = {
    8: [0, 1, 2, 3, 3, 4, 5, 6, 7, 8, 9, 10, 11],
    12: [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 9, 10, 11],
}


@pytest.mark.parametrize("bits", [8, 12])
def test_shift_at_exact_weight_boundaries_matches_gti(bits):
    for k, want in enumerate(GTI_BOUNDARY[bits]):
        w = layer_with_max((2 ** (bits - 1) - 1) / 2 ** k)
        got = compute_shift(w, torch.zeros(2), bits, 20)
        assert int(got) == want == gti_expression(w, bits), (bits, k)
        # the exact value would be k: at k >= 4 (8-bit) mdk now follows the GTI tools instead
        assert want in (k, k - 1)


@pytest.mark.parametrize("bias_bits", [12, 16, 18, 20])
def test_shift_at_exact_bias_boundaries_matches_gti(bias_bits):
    """A bias at (2^(bb-1)-1)/2^k limits the shift; 16..20-bit biases are never moved by the
    epsilon in 0..12 (it is below half an ulp of such large maxima), 12-bit ones are from k=10."""
    w = torch.full((2, 2, 3, 3), 1e-4)  # weights allow shift 12
    for k in range(13):
        b = torch.tensor([(2 ** (bias_bits - 1) - 1) / 2 ** k, -0.5])
        want = GTI_BOUNDARY[12][k] if bias_bits == 12 else k
        assert int(compute_shift(w, b, 8, bias_bits)) == want == gti_expression(b, bias_bits)


def test_shift_equals_gti_expression_near_every_boundary():
    """Maxima a few ulps around every boundary of 8/12/16/20-bit tensors, plus random maxima over 30
    decades: mdk's device-independent evaluation equals the GTI expression on the CPU."""
    g = torch.Generator().manual_seed(0)
    for bits in (8, 12, 16, 20):
        for k in range(-2, 15):
            centre = torch.tensor((2 ** (bits - 1) - 1) / 2 ** k, dtype=torch.float32)
            up, down = centre.clone(), centre.clone()
            for _ in range(40):
                for m in (up, down):
                    t = m.view(1)
                    assert int(compute_shift(t, None, bits, 20)) == \
                        min(max(gti_expression(t, bits), 0), 12), (bits, k, float(m))
                up = torch.nextafter(up, torch.tensor(1e30))
                down = torch.nextafter(down, torch.tensor(0.0))
    for m in torch.exp(torch.empty(500).uniform_(-35, 35, generator=g)).tolist():
        t = torch.tensor([m])
        assert int(compute_shift(t, None, 8, 20)) == min(max(gti_expression(t, 8), 0), 12)


def test_shift_needs_no_host_sync():
    """On the meta device any data-dependent host read (.item(), int()) would raise."""
    w, b = torch.randn(4, 3, 3, 3, device="meta"), torch.randn(4, device="meta")
    s = compute_shift(w, b, 8, 20)
    assert s.device.type == "meta" and s.dtype == torch.int64 and s.dim() == 0
    w_q, b_q = quantize_conv(w.requires_grad_(), b, 1, 8, 20)
    assert w_q.device.type == "meta"


def test_one_bit_weight_is_a_sign_never_zero():
    w = torch.tensor([[0.5, -0.25, 0.0, -0.0, 1.0, -1.0, 0.0, 0.25, -0.5]]).view(1, 1, 3, 3)
    # max|w| = 1 -> shift = int(log2(127 / 1.000001)) = int(6.99) = 6;
    # m = mean|w| = 3.5/9 = 0.3889 -> QS(m) mantissa = R(0.3889 * 64) = R(24.89) = 25
    w_int, b_int, s = conv_mantissas(w, torch.zeros(1), 1, 8, 20)
    assert s == 6
    want = torch.tensor([25, -25, 25, 25, 25, -25, 25, 25, -25]).view(1, 1, 3, 3)
    assert torch.equal(w_int, want)  # both zeros (+0.0 and -0.0) are +QS(m), as in the GTI tools
    w_q, _ = quantize_conv(w, torch.zeros(1), 1, 8, 20)
    assert torch.equal(w_q, want / 64.0)
    # an all-zero kernel: QS(0) = 0, so every weight is 0 whatever its sign
    z, _, _ = conv_mantissas(torch.zeros(1, 1, 3, 3), torch.zeros(1), 1, 8, 20)
    assert torch.equal(z, torch.zeros(1, 1, 3, 3, dtype=torch.int64))


@pytest.mark.parametrize("mask,wb,bb", [(1, 8, 20), (3, 8, 20), (8, 8, 20), (2, 12, 12),
                                        (5, 12, 16), (12, 12, 20)])
@pytest.mark.parametrize("k", [0, 3, 4, 7, 12])
def test_fake_quant_equals_export_at_boundaries(mask, wb, bb, k):
    w = layer_with_max((2 ** (wb - 1) - 1) / 2 ** k, (3, 4, 3, 3))
    w[0, 1] = torch.linspace(-1, 1, 9).view(3, 3) * w.abs().max() / 3
    w[2, 2, 1, 1] = 0.0
    w[2, 3] = 0.0  # an all-zero kernel
    b = torch.tensor([0.0, 0.3, -0.02])
    w_q, b_q = quantize_conv(w, b, mask, wb, bb)
    w_int, b_int, s = conv_mantissas(w, b, mask, wb, bb)
    assert s == int(compute_shift(w, b, wb, bb))
    assert torch.equal(w_int.double() / 2 ** s, w_q.double())  # bit for bit
    assert torch.equal(b_int.double() / 2 ** s, b_q.double())


def test_integer_reference_exact_with_one_bit_zeros_and_boundaries():
    model, u8 = _fused_model([1, 3, 8, 1])
    layers = model.layers
    with torch.no_grad():
        layers[0].conv.weight[0, 0, 1, 1] = 0.0  # exact zeros in a 1-bit layer
        layers[0].conv.weight[1, 2] = 0.0  # and an all-zero 1-bit kernel
        w = layers[2].conv.weight  # an 8-bit layer exactly at a GTI boundary (k = 5 -> shift 4)
        w.mul_(0.5 * (127 / 32) / w.abs().max())
        w[0, 0, 0, 0] = -127 / 32  # max|w| is exactly 127/2^5
        layers[2].conv.bias.clamp_(-1, 1)
    cm = chip_model_from(model, "5801")
    assert cm.layers[2].shift == 4
    L0 = cm.layers[0]
    assert L0.weight[0, 0, 1, 1] > 0  # the zero weight is +QS(m), not 0
    assert torch.equal(L0.weight[1, 2], torch.zeros(3, 3, dtype=torch.int64))
    assert integer_ref.count_mismatches(model, cm, u8(3)) == [0] * len(cm.layers)
    assert integer_ref.count_mismatches(model, cm, u8(3), torch.float32) == [0] * len(cm.layers)


def _near_powers_of_two(ulps: int) -> torch.Tensor:
    """Every float32 within ``ulps`` ulps of 2^k, k = -10..45 (where int(log2) can flip)."""
    out = []
    for k in range(-10, 46):
        c = torch.tensor(2.0 ** k, dtype=torch.float32)
        bits = c.view(torch.int32)
        out.append((bits + torch.arange(-ulps, ulps + 1, dtype=torch.int32)).view(torch.float32))
    return torch.cat(out)


def test_float64_log2_truncates_like_cpu_float32_log2():
    """mdk takes log2 in float64 and rounds it to float32 (device independent); after int() that
    equals CPU torch's float32 log2 (the GTI converter's) on every float32 near a power of two."""
    r = _near_powers_of_two(3000)
    assert torch.equal(torch.log2(r).trunc(), torch.log2(r.double()).float().trunc())


@pytest.mark.slow
def test_float64_log2_truncates_like_cpu_float32_log2_zero_dim():
    """The same through 0-dim tensors, the path the GTI expression takes (a max is 0-dim)."""
    r = _near_powers_of_two(3000)
    ref = torch.log2(r.double()).float().trunc()
    # one 0-dim log2 per value (the path under test); truncation and comparison in one go
    got = torch.stack([torch.log2(v.clone()) for v in r.unbind()]).trunc()
    bad = r[got != ref].tolist()
    assert not bad, bad[:5]
