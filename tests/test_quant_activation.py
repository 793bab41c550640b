"""5-bit activation quantizer: grid, clipping, rounding exactness, straight-through gradient."""
import pytest
import torch

from mdk.quant.activation import quantize_activation
from mdk.quant.rounding import round_half_away


def test_grid_and_clipping():
    g = torch.Generator().manual_seed(0)
    y = torch.randn(4, 8, 16, 16, generator=g) * 3
    for cap in (0.37, 1.0, 2.9, 31.0, 250.0):
        q = quantize_activation(y, torch.tensor(cap))
        k = q * 31 / cap
        assert (k - k.round()).abs().max() < 1e-4  # on the grid k * cap / 31
        assert q.min() >= 0 and q.max() <= cap * (1 + 1e-6)
        assert torch.all(q[y >= cap] == torch.tensor(cap))  # above the cap: clipped to cap
        assert torch.all(q[y <= 0] == 0)
        ref = round_half_away(y.clamp(0, cap).double() * 31 / cap) * cap / 31
        assert (q.double() - ref).abs().max() <= cap * 1e-6
        assert k.round().max() <= 31  # integer levels 0..31


def test_half_away_at_ties_fused_cap():
    # cap 31 (after fusion): output is R(clamp(y, 0, 31)) exactly, ties go up
    y = torch.tensor([0.5, 1.5, 2.5, 30.5, 0.49999997, 1.4999999, 31.7, -0.5, 7.0])
    q = quantize_activation(y, torch.tensor(31.0))
    assert q.tolist() == [1.0, 2.0, 3.0, 31.0, 0.0, 1.0, 31.0, 0.0, 7.0]


def test_rounding_trick_is_exact_near_every_tie():
    # every float within 2000 ulps of k and k + 0.5 for k = 0..31, in float32 and float64
    for dtype in (torch.float32, torch.float64):
        centers = torch.arange(0, 32, 0.5, dtype=dtype)
        vals = [centers]
        up, down = centers.clone(), centers.clone()
        for _ in range(2000):
            up = torch.nextafter(up, torch.full_like(up, 100))
            down = torch.nextafter(down, torch.full_like(down, -100))
            vals += [up, down]
        v = torch.cat(vals).clamp(0, 31)
        v = torch.cat([v, torch.rand(200000, dtype=dtype) * 31])
        got = quantize_activation(v, torch.tensor(31.0))
        assert torch.equal(got, round_half_away(v)), dtype


def test_ste_inside_zero_outside():
    y = torch.tensor([-1.0, 1e-6, 0.3, 1.7, 1.9999, 2.5, 9.0], requires_grad=True)
    q = quantize_activation(y, torch.tensor(2.0))
    q.backward(torch.arange(1.0, 8.0))
    assert y.grad.tolist() == [0.0, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0]


def test_cap_cache_follows_in_place_updates():
    cap = torch.tensor(2.0)
    y = torch.tensor([1.5, 3.0])
    assert quantize_activation(y, cap)[1] == 2.0
    cap.fill_(4.0)  # e.g. load_state_dict / calibration writing the buffer
    assert quantize_activation(y, cap)[1] == torch.tensor(23.0) * 4 / 31  # R(3*31/4) = 23
    with pytest.raises(ValueError, match="cap must be > 0"):
        quantize_activation(y, torch.tensor(0.0))


def test_float_cap_and_dtype():
    y = torch.linspace(-1, 5, 101, dtype=torch.float64)
    q = quantize_activation(y, 4.0)
    assert q.dtype == torch.float64
    assert torch.allclose(q, round_half_away(y.clamp(0, 4) * 31 / 4) * 4 / 31)


@pytest.mark.slow
def test_fused_kernel_expression_equals_the_eager_ops():
    """The one-kernel form used on CUDA (compiled with torch.compile) gives the same levels as the
    eager four passes; checked here with the CPU compiler on values around every tie. With the
    fused cap 31 (no scaling: the step4 case the integer reference checks) they are identical;
    with a scale, ``h + scale * y`` may be computed with or without a fused multiply-add, so a
    value within an ulp of a half level may land one level apart (only there)."""
    from mdk.quant.activation import _const, _eager_levels, _fused_levels
    from mdk.quant.rounding import pred_half

    fused = _fused_levels()
    if fused is None:
        pytest.skip("torch.compile is not available here")
    g = torch.Generator().manual_seed(0)
    base = torch.arange(0, 32, 0.5).repeat_interleave(5)
    for cap in (31.0, 2.9, 0.37):
        y = torch.cat([base * cap / 31, torch.randn(4096, generator=g) * cap])
        scale, rescale = (1.0, 1.0) if cap == 31.0 else (31 / cap, cap / 31)
        h = _const(pred_half(y.dtype), y.dtype, y.device, "half")
        want = _eager_levels(y, h, scale, rescale)
        # the arguments _QuantAct passes; one compiled kernel serves every cap (no recompile)
        with torch._dynamo.config.patch(error_on_recompile=cap != 31.0):
            got = fused(y, h, pred_half(y.dtype), _const(scale, y.dtype, y.device, "scale"),
                        _const(rescale, y.dtype, y.device, "rescale"))
        if cap == 31.0:
            assert torch.equal(got, want)
            continue
        diff = got != want
        v = y.double() * 31 / cap
        at_tie = (v - v.floor() - 0.5).abs() < 1e-5 * v.abs().clamp(min=1)
        assert bool((at_tie | ~diff).all()), (cap, y[diff & ~at_tie][:5])
        assert ((got - want).abs()[diff] <= cap / 31 * 1.0001).all()
        assert diff.float().mean() < 0.05
