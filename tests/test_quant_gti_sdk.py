"""GTI SDK hand-off: values and signed zeros against a reference written from the GTI quantizer's
behaviour, the files of a real step4 export (CAP value included), the input sizes a chip takes,
and the warnings where the converter would compute otherwise (the last layer's shift, float32
rounding). Golden files: test_quant_gti_golden.py; the path tool: test_quant_gti_handoff.py."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from mdk.errors import ConfigError
from mdk.quant.chip_model import chip_model_from, load_chip_model
from mdk.quant.chips import CHIP_INPUT_SIZES, chip_takes
from mdk.quant.export import export_chip_model
from mdk.quant.gti_converter import rounding_slips
from mdk.quant.gti_sdk import negative_zeros, write_gti_files
from mdk.quant.rounding import gti_round, round_half_away
from mdk.quant.weights import conv_mantissas
from helpers.gti import FILTER, tiny_chip_model
from helpers.gti import _fused_model


def gti_reference(w: torch.Tensor, b: torch.Tensor, mask: int, wb: int, bb: int):
    """The GTI quantizer's float32 output, written from its documented behaviour: rounding
    floor(x + .5) / ceil(x - .5), shift from the float32 expression, per-mask formulas with
    torch.where on ``w >= 0`` (which decides the sign of every zero)."""
    R = lambda x: torch.where(x >= 0, torch.floor(x + 0.5), torch.ceil(x - 0.5))  # noqa: E731
    term = lambda t, n: torch.log2((2.0 ** (n - 1) - 1) / (1e-6 + t.abs().max())).int().float()  # noqa
    s = float(torch.clamp(torch.min(term(w, wb), term(b, bb)), 0, 12))
    QS = lambda x: R(x * 2 ** s) / 2 ** s  # noqa: E731
    a = w.abs()
    if mask in (8, 12):
        q = QS(w)
    elif mask == 5:
        mx = a.amax((2, 3), keepdim=True)
        step = torch.where(mx == 0, torch.full_like(mx, 1e-6), mx) / 15
        q = R(w / step).int().float() * QS(step)
    else:
        m = a.mean((2, 3), keepdim=True)
        if mask == 1:
            q = torch.where(w >= 0, QS(m), -QS(m))
        elif mask == 2:
            kept = torch.where(a >= QS(m) / 4, QS(m), torch.zeros_like(w))
            q = torch.where(w >= 0, kept, -kept)
        else:
            step = torch.where(m == 0, torch.full_like(m, 1e-6), m) / 4
            c = (a / step).int().float()
            c = torch.where(c >= 3, torch.full_like(c, 4.0), c)
            q = torch.where(w >= 0, c * QS(step), c * -QS(step))
    return q, QS(b), int(s)


@pytest.mark.parametrize("mask,wb,bb", [(1, 8, 20), (2, 12, 12), (3, 8, 20), (5, 12, 16),
                                        (8, 8, 20), (12, 12, 20)])
def test_values_and_signed_zeros_equal_the_gti_quantizer(mask, wb, bb):
    g = torch.Generator().manual_seed(mask)
    w = torch.randn(6, 5, 3, 3, generator=g) * torch.logspace(-4, 0, 6).view(6, 1, 1, 1)
    w[0, 0] = 0.0  # all-zero kernel
    w[1, 1, 1, 1] = -0.0
    w[2, 2] = -1e-9  # a kernel of tiny negatives (QS(m) = 0 for 1/2/3 bits)
    b = torch.randn(6, generator=g) * 1e-3
    b[0] = -1e-7
    want_w, want_b, want_s = gti_reference(w, b, mask, wb, bb)
    w_int, b_int, s = conv_mantissas(w, b, mask, wb, bb)
    assert s == want_s
    assert torch.equal(w_int.double() / 2 ** s, want_w.double())
    assert torch.equal(b_int.double() / 2 ** s, want_b.double())
    neg_w, neg_b = negative_zeros(w, b, mask, w_int, b_int)
    assert np.array_equal(neg_w, ((want_w == 0) & torch.signbit(want_w)).numpy())
    assert np.array_equal(neg_b, ((want_b == 0) & torch.signbit(want_b)).numpy())
    assert neg_w.any() and neg_b.any()  # the case is exercised


def test_step4_export_writes_the_hand_off(tmp_path, caplog):
    # 16-wide layers: the 11-channel output conv (2 boxes, 1 class) is padded to 16; 224 px, a
    # size the chip takes
    model, _ = _fused_model([1, 3, 8, 8], channels=(16, "M", 16, "M", 16), num_classes=1,
                            image_size=224)
    cm = export_chip_model(model, tmp_path / "chip", "5801", onnx=False)
    gti = tmp_path / "chip" / "gti"
    assert not json.loads((tmp_path / "chip" / "chip_model.json").read_text())["simulation_only"]
    assert "rounds otherwise" not in caplog.text  # no rounding slip in a trained model
    # CAP: the last layer's calibrated cap, c_last = 31 * out_scale (its float32 text)
    cap = float((gti / "relu_cap.txt").read_text())
    assert (gti / "relu_cap.txt").read_text().endswith("\n")
    assert np.float32(cap) == np.float32(float(model.layers[-1].cap.new_tensor(31.0) *
                                               model.out_scale))
    assert cap == pytest.approx(31 * cm.out_scale, rel=1e-7) and cap != 31.0
    doc = json.loads((gti / "5801_gnetdet_dat.json").read_text())
    assert [s for m in doc["layer"] for s in m["scaling"]] == [L.shift for L in cm.layers]
    assert json.loads((gti / "5801_gnetdet_model.json").read_text())["layer"][1]["data file"] == \
        os.path.realpath(gti / "chip.dat")
    # filter.txt == numpy's tofile of the quantized values (the converter's writer), zeros signed
    width = doc["layer"][-1]["output_channels"]
    vals, cm2 = [], chip_model_from(model, "5801")
    for i, (L, layer) in enumerate(zip(cm2.layers, model.layers)):
        v = L.weight.double() / 2 ** L.shift
        neg, _ = negative_zeros(layer.conv.weight, layer.conv.bias, L.mask_bits, L.weight, L.bias)
        v = torch.where(torch.from_numpy(neg), torch.tensor(-0.0, dtype=torch.float64), v)
        if i == len(cm2.layers) - 1:
            v = torch.cat([v, torch.zeros(width - v.shape[0], *v.shape[1:], dtype=torch.float64)])
        vals.append(v.flatten().numpy())
    ref = tmp_path / "ref.txt"
    np.concatenate(vals).tofile(ref, sep="\n", format="%.16e")
    assert (gti / "filter.txt").read_bytes() == ref.read_bytes()
    assert width == 16 and len((gti / "filter.txt").read_text().split("\n")) == \
        sum(L.weight[0].numel() * 16 for L in cm.layers[2:]) + sum(L.weight.numel() for L in cm.layers[:2])
    no_gti = export_chip_model(model, tmp_path / "c2", "5801", onnx=False, gti=False)
    assert no_gti.layers[0].shift == cm.layers[0].shift and not (tmp_path / "c2" / "gti").exists()


def test_export_skips_a_layout_gti_cannot_take(tmp_path, caplog):
    model, _ = _fused_model([1, 3, 8, 8], image_size=224)  # 8-wide layers, a 12-channel output conv
    export_chip_model(model, tmp_path / "chip", "5801", onnx=False)
    assert (tmp_path / "chip" / "chip_model.json").is_file()
    assert not (tmp_path / "chip" / "gti").exists()
    assert "no GTI SDK hand-off" in caplog.text and "output layer has 12 channels" in caplog.text


def test_warns_when_the_converter_would_shift_the_last_layer_otherwise(tmp_path, caplog):
    """The GTI converter evaluates the last layer's shift in float64: at max|w| = 127/8 float32
    gives 3 (what training used) and float64 gives 2 (the epsilon is not absorbed)."""
    from mdk.quant.gti_converter import converter_shift
    from mdk.quant.weights import compute_shift

    w = torch.zeros(1, 2, 3, 3)
    w[0, 1, 2, 2] = 127 / 8
    assert int(compute_shift(w, torch.zeros(1), 8, 20)) == 3
    assert converter_shift(w, torch.zeros(1), 8, 20) == 2
    cm, floats = tiny_chip_model()
    cm.layers[2].shift = 3
    cm.layers[2].weight = (w * 8).to(torch.int64)
    floats[2] = (w, torch.zeros(1))
    write_gti_files(cm, tmp_path / "gti", float_layers=floats, check_size=False)
    assert "GTI converter would compute shift 2" in caplog.text
    caplog.clear()
    cm, floats = tiny_chip_model()  # 100/16 = 6.25 is no boundary: both give 4, no warning
    write_gti_files(cm, tmp_path / "gti2", float_layers=floats, check_size=False)
    assert "would compute shift" not in caplog.text


PRED_HALF = float(np.nextafter(np.float32(0.5), np.float32(0)))  # 0.49999997 = 0.5 - 2^-25


def test_gti_rounding_slips_at_the_float_below_one_half():
    """GTI's float32 floor(x + 0.5) rounds 0.49999997 to 1 (and -0.49999997 to -1); mdk's R
    gives 0. In float64 (the converter's last layer) the same value rounds right."""
    x = torch.tensor([PRED_HALF, -PRED_HALF, 0.5, -0.5, 2.5, 1.4999999], dtype=torch.float32)
    assert gti_round(x).tolist() == [1.0, -1.0, 1.0, -1.0, 3.0, 1.0]
    assert round_half_away(x).tolist() == [0.0, -0.0, 1.0, -1.0, 3.0, 1.0]
    assert gti_round(x.double()).tolist() == round_half_away(x.double()).tolist()


@pytest.mark.parametrize("mask", [5, 8, 12])
def test_rounding_slips_count_the_values_gti_would_write_otherwise(mask):
    """Shift 5 (max|w| = 3). Kernel 1's rounded product is 0.49999997: for 5-bit its coefficient
    w/step, for 8/12-bit the weight itself; the first bias too. The count equals the values where
    the GTI quantizer (gti_reference) and mdk's export differ. (The 1/2/3-bit masks round a
    kernel's mean |w| times 2^shift, and no float32 mean of 9 values is 0.49999997 * 2^-shift.)"""
    w = torch.zeros(2, 1, 3, 3)
    w[0, 0, 0, 0] = 3.0
    w[1, 0, 1, 1] = PRED_HALF / 32
    w[1, 0, 0, 0] = 15 / 32 if mask == 5 else 0.0  # the 5-bit step of kernel 1: 1/32
    b = torch.tensor([-PRED_HALF / 32, 0.25])
    w_int, b_int, shift = conv_mantissas(w, b, mask, 8, 20)
    assert shift == 5 and b_int[0] == 0  # mdk writes 0 for the -0.49999997 product
    gti_w, gti_b, _ = gti_reference(w, b, mask, 8, 20)
    differ = int((gti_w.double() != w_int.double() / 32).sum())
    assert differ == 1
    assert int((gti_b.double() != b_int.double() / 32).sum()) == 1
    assert rounding_slips(w, b, mask, shift) == 2
    assert rounding_slips(w, torch.tensor([0.0, 0.25]), mask, shift) == 1
    assert rounding_slips(w, None, mask, shift) == 1
    w[1, 0, 1, 1] = 0.25 / 32  # no slip anywhere
    assert rounding_slips(w, torch.tensor([0.0, 0.25]), mask, shift) == 0


def test_export_warns_where_gti_rounds_otherwise_and_keeps_the_trained_values(tmp_path, caplog):
    cm, floats = tiny_chip_model()
    floats[1][0][1, 0, 2, 2] = PRED_HALF / 32  # layer 1 (8-bit, shift 5): mantissa 0, GTI's 1
    floats[2][0][0, 0, 0, 0] = PRED_HALF / 16  # the last layer: float64 in the converter, no slip
    out = write_gti_files(cm, tmp_path / "gti", float_layers=floats, check_size=False)
    lines = [r.getMessage() for r in caplog.records if "rounds otherwise" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("layer 1: 1 written value(s)"), lines
    assert (out / "filter.txt").read_bytes() == FILTER.encode()  # the trained values


def test_chip_input_sizes_and_the_size_refusal(tmp_path):
    assert CHIP_INPUT_SIZES["5801"] == (224, 320, 448, 640)
    assert chip_takes("5801", 224) and chip_takes("2803", 448) and not chip_takes("5801", 192)
    cm, floats = tiny_chip_model()
    with pytest.raises(ValueError, match=r"takes input sizes \(224, 320, 448, 640\), not 8"):
        write_gti_files(cm, tmp_path / "gti", float_layers=floats)
    assert not (tmp_path / "gti").exists()
    model, _ = _fused_model([1, 3, 8, 8], channels=(16, "M", 16, "M", 16), num_classes=1)
    with pytest.raises(ConfigError, match=r"model.image_size=32 is no input size of chip 5801 "
                                          r"\(it takes 224, 320, 448, 640 px\)"):
        export_chip_model(model, tmp_path / "refused", "5801", onnx=False)
    assert not (tmp_path / "refused").exists()
    cm = export_chip_model(model, tmp_path / "sim", "5801", onnx=False, allow_any_size=True)
    assert cm.simulation_only and not (tmp_path / "sim" / "gti").exists()
    assert json.loads((tmp_path / "sim" / "chip_model.json").read_text())["simulation_only"] is True
    assert load_chip_model(tmp_path / "sim").simulation_only
