"""BN folding (float64, 1e-10), gain fusion equivalence, stage flags, checkpoint round trips."""
import copy
from pathlib import Path

import pytest
import torch

from mdk.models.gnetdet import GNetDet
from mdk.quant.activation import quantize_input
from mdk.quant import calibrate
from mdk.quant.bn_fold import fold_bn
from mdk.quant.fusion import fuse_gains, is_fused
from mdk.stage import apply_stage
from mdk.checkpoint.weights_file import OWN, of_checkpoint

CFG = dict(num_classes=3, channels=[8, "M", 8, "M", 16, 16, "M", 16, "M", 16, "M", 16],
           mask_bits=[3] * 6 + [8, 8], image_size=64, batch_norm=True)


def _trained_bn_model(seed=0):
    torch.manual_seed(seed)
    model = GNetDet(**CFG)
    with torch.no_grad():
        for layer in model.layers:
            if layer.bn is not None:  # non-trivial BN parameters and statistics
                layer.bn.weight.uniform_(0.5, 1.5)
                layer.bn.bias.uniform_(-0.2, 0.2)
                layer.conv.bias.uniform_(-0.1, 0.1)
        model.train()
        for _ in range(3):
            model(torch.randint(0, 256, (4, 3, 64, 64), dtype=torch.uint8))
    return model.eval()


def _images(n=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8, generator=g)


def _calibrated(seed=0):
    model = _trained_bn_model(seed)
    apply_stage(model, "cal", "5801")
    with calibrate.observing(model), torch.no_grad():
        model(_images(8, seed=5))
        calibrate.finalize_caps(model)
    return model


def test_bn_fold_float64_exact():
    model = _trained_bn_model().double()
    x = quantize_input(_images()).double()  # GNetDet.forward is float32; chain the layers in f64

    def run():
        h = x
        for layer in model.layers:
            h = layer(h)
        return h
    with torch.no_grad():
        want = run()
        assert fold_bn(model) == 7
        got = run()
    assert all(layer.bn is None for layer in model.layers)
    assert (got - want).abs().max() <= 1e-10 * max(1.0, float(want.abs().max()))
    assert fold_bn(model) == 0  # idempotent


def test_stage_flags_and_errors():
    model = _trained_bn_model()
    r = apply_stage(model, "step1", "5801")
    assert not r.fused and all(not l.quant_weight and not l.quant_act for l in model.layers)
    assert all(l.bn is not None for l in model.layers[:-1])
    r = apply_stage(model, "step2", "5801")
    assert r.folded_bn == 7 and all(l.quant_weight and not l.quant_act for l in model.layers)
    assert all(l.chip_bits == (8, 20) for l in model.layers)
    cfg = dict(CFG, mask_bits=[1, 3, 3, 1, 3, 3, 3, 1])
    m2801 = GNetDet(**cfg)
    apply_stage(m2801, "cal", "2801")
    assert [l.chip_bits for l in m2801.layers][:2] == [(12, 12), (12, 18)]
    with pytest.raises(ValueError, match="run step=cal first"):
        apply_stage(_trained_bn_model(), "step3", "5801")
    with pytest.raises(ValueError, match="layer 6 .*chip 2801 does not support 8-bit"):
        apply_stage(_trained_bn_model(), "step2", "2801")
    with pytest.raises(ValueError, match="step='step5' is unknown"):
        apply_stage(model, "step5", "5801")


def test_fusion_equivalent_to_step3_activations():
    """With float weights, the fused model (caps 31) equals step3 up to float rounding."""
    model = _calibrated()
    caps = [float(l.cap) for l in model.layers]
    step3 = copy.deepcopy(model)
    apply_stage(step3, "step3", "5801")
    fused = copy.deepcopy(step3)
    r = apply_stage(fused, "step4", "5801")
    assert r.fused_now and r.fused and is_fused(fused)
    assert all(float(l.cap) == 31.0 for l in fused.layers)
    assert float(fused.out_scale) == pytest.approx(caps[-1] / 31)
    for m in (step3, fused):
        for l in m.layers:
            l.quant_weight = False  # isolate the exact part of the fusion
    x = _images(6, seed=9)
    with torch.no_grad():
        a, b = step3(x), fused(x)
        h = quantize_input(x)
        for l in fused.layers:
            h = l(h)
            assert torch.equal(h, h.round()) and h.min() >= 0 and h.max() <= 31
    # rounding-boundary flips are possible in principle; require (nearly) all outputs identical
    close = (a - b).abs() <= 1e-4 * caps[-1]
    assert close.float().mean() >= 0.999 and (a - b).abs().max() <= 2 * caps[-1] / 31


def test_step4_is_fused_once_and_checkpoints_round_trip():
    model = _calibrated()
    apply_stage(model, "step3", "5801")
    sd3 = copy.deepcopy(model.state_dict())
    apply_stage(model, "step4", "5801")
    w = model.layers[0].conv.weight.clone()
    r = apply_stage(model, "step4", "5801")  # e.g. resumed: must not fuse again
    assert not r.fused_now and torch.equal(model.layers[0].conv.weight, w)
    with pytest.raises(ValueError, match="already gain-fused"):
        fuse_gains(model)
    with pytest.raises(ValueError, match="step=step3 got a gain-fused"):
        apply_stage(copy.deepcopy(model), "step3", "5801")
    x = _images()
    with torch.no_grad():
        want = model(x)
    # a freshly built model (with BN) loads the fused checkpoint: BN dropped, fused flag restored
    fresh = GNetDet(**CFG)
    fresh.load_state_dict(model.state_dict())
    assert is_fused(fresh) and all(l.bn is None for l in fresh.layers)
    assert not apply_stage(fresh, "step4", "5801").fused_now
    with torch.no_grad():
        assert torch.equal(fresh.eval()(x), want)
    # a step3 checkpoint loads (the engine's path: the structure of its stage first) and step4
    # fuses it
    fresh3 = GNetDet(**CFG)
    of_checkpoint(Path("step3/best.pth"), {"model": sd3, "stage": "step3"}).load(fresh3, OWN)
    assert all(l.bn is None for l in fresh3.layers)
    assert not is_fused(fresh3) and apply_stage(fresh3, "step4", "5801").fused_now
    with torch.no_grad():
        assert torch.equal(fresh3.eval()(x), want)


def test_loading_bn_checkpoint_into_folded_model_is_a_clear_error():
    model = _trained_bn_model()
    sd1 = model.state_dict()
    apply_stage(model, "step2", "5801")
    with pytest.raises(RuntimeError, match="Load the checkpoint before"):
        model.load_state_dict(sd1)
