"""GTI SDK hand-off (issue #16 part 4): values and signed zeros against a reference written from
the GTI quantizer's behaviour, the files of a real step4 export, and the last-layer warning.
Golden files: test_quant_gti_golden.py."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

from mdk.quant.chip_model import chip_model_from
from mdk.quant.export import export_chip_model
from mdk.quant.gti_sdk import negative_zeros, write_gti_files
from mdk.quant.weights import conv_mantissas
from test_quant_gti_golden import tiny_chip_model
from test_quant_gti_shift import _fused_model


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


def test_step4_export_writes_the_hand_off(tmp_path):
    # 16-wide layers: the 11-channel output conv (2 boxes, 1 class) is padded to 16
    model, _ = _fused_model([1, 3, 8, 8], channels=(16, "M", 16, "M", 16), num_classes=1)
    cm = export_chip_model(model, tmp_path / "chip", "5801", onnx=False)
    gti = tmp_path / "chip" / "gti"
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
    model, _ = _fused_model([1, 3, 8, 8])  # 8-wide layers, a 12-channel output conv
    export_chip_model(model, tmp_path / "chip", "5801", onnx=False)
    assert (tmp_path / "chip" / "chip_model.json").is_file()
    assert not (tmp_path / "chip" / "gti").exists()
    assert "no GTI SDK hand-off" in caplog.text and "output layer has 12 channels" in caplog.text


def test_warns_when_the_converter_would_shift_the_last_layer_otherwise(tmp_path, caplog):
    """The GTI converter evaluates the last layer's shift in float64: at max|w| = 127/8 float32
    gives 3 (what training used) and float64 gives 2 (the epsilon is not absorbed)."""
    from mdk.quant.gti_sdk import converter_shift
    from mdk.quant.weights import compute_shift

    w = torch.zeros(1, 2, 3, 3)
    w[0, 1, 2, 2] = 127 / 8
    assert int(compute_shift(w, torch.zeros(1), 8, 20)) == 3
    assert converter_shift(w, torch.zeros(1), 8, 20) == 2
    cm, floats = tiny_chip_model()
    cm.layers[2].shift = 3
    cm.layers[2].weight = (w * 8).to(torch.int64)
    floats[2] = (w, torch.zeros(1))
    write_gti_files(cm, tmp_path / "gti", float_layers=floats)
    assert "GTI converter would compute shift 2" in caplog.text
    caplog.clear()
    cm, floats = tiny_chip_model()  # 100/16 = 6.25 is no boundary: both give 4, no warning
    write_gti_files(cm, tmp_path / "gti2", float_layers=floats)
    assert "would compute shift" not in caplog.text
