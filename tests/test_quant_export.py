"""Integer reference == fake-quant step4 forward exactly; export files; ONNX vs torch."""
import json

import numpy as np
import pytest
import torch

from mdk.models.gnetdet import GNetDet
from mdk.quant import calibrate, integer_ref
from mdk.quant.chip_model import chip_model_from, load_chip_model
from mdk.quant.export import export_chip_model
from mdk.quant.chip_model_net import ChipModelNet
from mdk.stage import apply_stage

CFG = dict(num_classes=3, channels=[8, "M", 8, "M", 16, 16, "M", 16, "M", 16, "M", 16],
           mask_bits=[3] * 6 + [8, 8], image_size=64, batch_norm=True)


def _u8(n, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, 3, 64, 64), dtype=torch.uint8, generator=g)


def _step4_model(chip="5801", cfg=CFG, seed=0):
    torch.manual_seed(seed)
    model = GNetDet(**cfg)
    with torch.no_grad():
        model.train()
        for i in range(3):
            model(_u8(4, 100 + i))
    model.eval()
    apply_stage(model, "cal", chip)
    with calibrate.observing(model), torch.no_grad():
        for i in range(2):
            model(_u8(4, 200 + i))
        calibrate.finalize_caps(model)
    apply_stage(model, "step3", chip)
    apply_stage(model, "step4", chip)
    return model


@pytest.fixture(scope="module")
def fused():
    return _step4_model()


def test_integer_reference_equals_fake_quant_exactly(fused):
    cm = chip_model_from(fused, "5801")
    val = _u8(6, 7)
    assert integer_ref.count_mismatches(fused, cm, val, torch.float64) == [0] * len(cm.layers)
    # the float32 training forward is exact too here, and the bound proves why
    assert integer_ref.float32_is_exact(cm)
    assert integer_ref.count_mismatches(fused, cm, val, torch.float32) == [0] * len(cm.layers)
    out_int, acts = integer_ref.integer_forward(cm, val)
    with torch.no_grad():
        out = fused(val)
    assert torch.equal(out.double(), out_int.float().double())
    assert all(a.dtype == torch.int64 and a.min() >= 0 and a.max() <= 31 for a in acts)
    assert sum(int((a > 0).sum()) for a in acts) > 0  # not a trivially all-zero network


def test_integer_reference_independent_of_model_code(fused):
    """The first layer recomputed by hand from the mantissas: conv, + bias, shift, R, clamp, pool."""
    cm = chip_model_from(fused, "5801")
    x = _u8(1, 3)
    q = (((x.long() >> 2) + 1) >> 1).clamp(0, 31)  # 255 -> 32 -> 31
    L = cm.layers[0]
    acc = torch.zeros(L.weight.shape[0], 64, 64, dtype=torch.int64)
    pad = torch.nn.functional.pad(q[0], (1, 1, 1, 1))
    for dy in range(3):
        for dx in range(3):
            acc += torch.einsum("oc,chw->ohw", L.weight[:, :, dy, dx], pad[:, dy:dy + 64, dx:dx + 64])
    acc += L.bias.view(-1, 1, 1)
    half = 2 ** (L.shift - 1) if L.shift else 0
    y = torch.sign(acc) * ((acc.abs() + half) // 2 ** L.shift)
    y = y.clamp(0, 31).reshape(-1, 32, 2, 32, 2).amax((2, 4))
    assert torch.equal(integer_ref.integer_forward(cm, x)[1][0][0], y)


def test_other_chip_masks_2803_exact_in_float64():
    cfg = dict(CFG, mask_bits=[2, 5, 12, 2, 5, 12, 5, 12])
    model = _step4_model("2803", cfg, seed=1)
    cm = chip_model_from(model, "2803")
    assert {L.weight_bits for L in cm.layers} == {12}
    assert integer_ref.count_mismatches(model, cm, _u8(3, 8)) == [0] * len(cm.layers)


def _random_chip_model(weight_max: int, bias_max: int, seed: int):
    """Chip layers of random mantissas, shifts and pools (no training behind them)."""
    from mdk.quant.chip_model import ChipLayer, ChipModel

    g = torch.Generator().manual_seed(seed)
    layers, c_in = [], 3
    for i, (c, pool) in enumerate([(16, True), (64, False), (32, True), (8, False)]):
        w = torch.randint(-weight_max, weight_max + 1, (c, c_in, 3, 3), generator=g)
        b = torch.randint(-bias_max, bias_max + 1, (c,), generator=g)
        layers.append(ChipLayer(w, b, int(torch.randint(0, 13, (1,), generator=g)), pool, 8, 12,
                                20))
        c_in = c
    return ChipModel(layers, out_scale=0.25, chip="2803", meta={"image_size": 32})


@pytest.mark.parametrize("weight_max, bias_max, fast", [(127, 2 ** 19, "float32"),
                                                        (2047, 2 ** 19, "float64")])
def test_the_fast_integer_reference_equals_the_int64_one(weight_max, bias_max, fast):
    """The accumulators in float32 where the bound allows it (8-bit weights), else float64
    (12-bit weights times 31 over 576 inputs pass 2^24): the same integers as int64 arithmetic."""
    cm = _random_chip_model(weight_max, bias_max, seed=weight_max)
    assert integer_ref.float32_is_exact(cm) == (fast == "float32")
    x = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8,
                      generator=torch.Generator().manual_seed(5))
    out, acts = integer_ref.integer_forward(cm, x)
    ref, ref_acts = integer_ref.integer_forward(cm, x, arithmetic="int64")
    assert torch.equal(out, ref) and all(torch.equal(a, b) for a, b in zip(acts, ref_acts))
    assert all(0 < int((a > 0).sum()) < a.numel() for a in acts)  # neither all 0 nor all 31
    lean, none = integer_ref.integer_forward(cm, x, keep=False)
    assert torch.equal(lean, out) and none == []


def test_export_files_load_and_onnx(fused, tmp_path):
    # 64 px is no chip input size: a simulation-only chip model (no GTI hand-off)
    cm = export_chip_model(fused, tmp_path / "chip", "5801", allow_any_size=True)
    spec = json.loads((tmp_path / "chip" / "chip_model.json").read_text())
    assert spec["format"] == "mdk-chip-model" and len(spec["layers"]) == 8
    assert spec["simulation_only"] is True and not (tmp_path / "chip" / "gti").exists()
    assert spec["layers"][0]["pool"] == "max2x2" and spec["layers"][-1]["pool"] is None
    assert all(0 <= s["shift"] <= 12 and s["cap"] == 31.0 for s in spec["layers"])
    loaded = load_chip_model(tmp_path / "chip")
    for a, b in zip(cm.layers, loaded.layers):
        assert torch.equal(a.weight, b.weight) and torch.equal(a.bias, b.bias) and a.shift == b.shift
    assert loaded.out_scale == cm.out_scale and loaded.simulation_only
    val = _u8(5, 11)
    with torch.no_grad():
        want = fused(val).numpy()
    got = ChipModelNet(tmp_path / "chip", "onnx")(val).numpy()  # onnxruntime on model.onnx
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(np.abs(want).max()))


def test_export_errors(fused, tmp_path):
    with pytest.raises(FileNotFoundError, match="chip_model.json is missing"):
        load_chip_model(tmp_path)
    export_chip_model(fused, tmp_path / "c", "5801", onnx=False, allow_any_size=True)
    np.savez(tmp_path / "c" / "weights.npz", x=np.zeros(1))
    with pytest.raises(ValueError, match="'layer0.weight' .* is missing"):
        load_chip_model(tmp_path / "c")
    unfused = GNetDet(**CFG)
    with pytest.raises(ValueError, match="needs a gain-fused step4 model"):
        chip_model_from(unfused, "5801")
    with pytest.raises(ValueError, match=r"layer 0 was trained with .* \(8, 20\) but chip 2801"):
        chip_model_from(fused, "2801")
    fused.layers[0].chip_bits = (12, 18)  # trained for other bits than the export chip's table
    try:
        with pytest.raises(ValueError, match="layer 0 was trained with"):
            chip_model_from(fused, "5801")
    finally:
        fused.layers[0].chip_bits = (8, 20)
