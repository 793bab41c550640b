"""GTI SDK hand-off (issue #16 part 4): golden files written by hand from the GTI converter's
documented format, the GNetDet-448 layout of its published layer spec, the sign of zeros against
a reference written from the GTI quantizer's behaviour, and the files of a real step4 export."""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO
from mdk.quant.chip_model import ChipLayer, ChipModel, chip_model_from
from mdk.quant.export import export_chip_model
from mdk.quant.gti_sdk import (dat_json, major_layers, model_json, negative_zeros,
                               write_gti_files)
from mdk.quant.weights import conv_mantissas
from test_quant_gti_shift import _fused_model

Z, NZ = "0.0000000000000000e+00", "-0.0000000000000000e+00"


def _layer(w, b, shift, pool, mask):
    return ChipLayer(torch.tensor(w, dtype=torch.int64), torch.tensor(b, dtype=torch.int64), shift,
                     pool, mask, 8, 20)


def tiny_chip_model() -> tuple[ChipModel, list]:
    """Three layers on an 8x8 one-channel input: L0 3-bit 1->2 + pool (shift 3); L1 8-bit 2->2
    (shift 5) and L2 8-bit 2->1 (shift 4, the output layer) in one major layer."""
    w0 = np.zeros((2, 1, 3, 3), np.int64)
    w0[0, 0] = [[4, 0, -1], [2, 0, 0], [0, 0, -4]]
    w0[1, 0, 0, 0] = 1
    w1 = np.zeros((2, 2, 3, 3), np.int64)
    w1[0, 0, 1, 1], w1[1, 1, 0, 0] = 7, -127
    w2 = np.zeros((1, 2, 3, 3), np.int64)
    w2[0, 1, 2, 2] = 100
    cm = ChipModel([_layer(w0, [3, -5], 3, True, 3), _layer(w1, [0, 1], 5, False, 8),
                    _layer(w2, [-2], 4, False, 8)], out_scale=0.5, chip="5801",
                   meta={"image_size": 8})
    # the fused float weights: equal to the quantized ones except two negatives that round to 0
    floats = [((L.weight.double() / 2 ** L.shift).float(), (L.bias.double() / 2 ** L.shift).float())
              for L in cm.layers]
    floats[0][0][0, 0, 0, 1] = -0.01  # 3-bit: mantissa 0, weight < 0 -> the GTI quantizer gives -0.0
    floats[1][1][0] = -0.001  # a bias that rounds to 0 from below -> -0.0
    return cm, floats


# filter.txt by hand: values / 2^shift in %.16e, C order, layer after layer; the last layer is
# padded from 1 to 2 output channels (its major layer's width) with +0.
FILTER = "\n".join(
    ["5.0000000000000000e-01", NZ, "-1.2500000000000000e-01", "2.5000000000000000e-01", Z, Z, Z, Z,
     "-5.0000000000000000e-01",                                   # L0 kernel (0, 0), shift 3
     "1.2500000000000000e-01"] + [Z] * 8                          # L0 kernel (1, 0)
    + [Z] * 4 + ["2.1875000000000000e-01"] + [Z] * 4 + [Z] * 9    # L1 out 0: 7/32 at (1, 1)
    + [Z] * 9 + ["-3.9687500000000000e+00"] + [Z] * 8             # L1 out 1: -127/32
    + [Z] * 9 + [Z] * 8 + ["6.2500000000000000e+00"]              # L2 out 0: 100/16 at in 1 (2, 2)
    + [Z] * 18)                                                   # L2 padding channel
BIAS = "\n".join(["3.7500000000000000e-01", "-6.2500000000000000e-01",  # 3/8, -5/8
                  NZ, "3.1250000000000000e-02",                           # L1: -0.001 -> -0, 1/32
                  "-1.2500000000000000e-01", Z])                          # L2: -2/16, padding
DAT = """{
    "layer": [
        {
            "coef_bits": 3,
            "image_size": 8,
            "input_channels": 1,
            "last_layer_out": false,
            "learning": false,
            "major_layer": 1,
            "output_channels": 2,
            "pooling": true,
            "scaling": [
                3
            ],
            "sublayer_number": 1
        },
        {
            "coef_bits": 8,
            "image_size": 4,
            "input_channels": 2,
            "last_layer_out": false,
            "learning": false,
            "major_layer": 2,
            "output_channels": 2,
            "pooling": false,
            "scaling": [
                5,
                4
            ],
            "sublayer_number": 2
        }
    ],
    "model": [
        {
            "ChipType": 5801,
            "MajorLayerNumber": 2
        }
    ]
}"""


def model_text(dat: str, size: int, grid: int, channels: int, tile: int, out_bytes: int) -> str:
    """The SDK model JSON by hand: image reader + the chip CNN layer (the GTI converter's template
    with the inputs/outputs and data file it fills in, and version 100)."""
    return """{
    "layer": [
        {
            "data file": null,
            "data offset": null,
            "input format": "CS_BGR24_PLANAR",
            "name": "image reader",
            "operation": "IMAGEREADER",
            "output channels": 3,
            "output format": "CS_BGR24_PLANAR",
            "output height": %(size)d,
            "output width": %(size)d
        },
        {
            "data file": "%(dat)s",
            "data offset": 0,
            "device": {
                "chip": "5801",
                "name": null,
                "type": 0
            },
            "inputs": [
                {
                    "format": "byte",
                    "prefilter": "interlace_tile_encode",
                    "shape": [
                        %(size)d,
                        %(size)d,
                        %(inch)d
                    ]
                }
            ],
            "mode": 0,
            "name": "cnn",
            "operation": "GTICNN",
            "output channels": %(ch)d,
            "output height": %(grid)d,
            "output width": %(grid)d,
            "outputs": [
                {
                    "format": "byte",
                    "layer scaledown": 0,
                    "postfilter": "interlace_tile_decode",
                    "shape": [
                        %(grid)d,
                        %(grid)d,
                        %(ch)d,
                        %(tile)d,
                        %(bytes)d
                    ],
                    "upsampling": 0
                }
            ]
        }
    ],
    "name": "gti_5801_gnetdet",
    "version": 100
}""" % {"dat": dat, "size": size, "grid": grid, "ch": channels, "tile": tile,
        "bytes": out_bytes, "inch": 3 if size == 448 else 1}


def test_golden_files_of_a_tiny_model(tmp_path):
    cm, floats = tiny_chip_model()
    out = write_gti_files(cm, tmp_path / "gti", float_layers=floats)
    assert sorted(p.name for p in out.iterdir()) == ["5801_gnetdet_dat.json",
                                                     "5801_gnetdet_model.json", "bias.txt",
                                                     "filter.txt"]
    assert (out / "filter.txt").read_bytes() == FILTER.encode()
    assert (out / "bias.txt").read_bytes() == BIAS.encode()
    assert (out / "5801_gnetdet_dat.json").read_bytes() == DAT.encode()
    # last major layer 4x4, no pool: tile min(4, 14)^2 = 16; bytes 4*4*2*32 // 49 = 20
    dat_path = os.path.realpath(out / "chip.dat")
    want = model_text(dat_path, 8, 4, 2, 16, 20)
    assert (out / "5801_gnetdet_model.json").read_text() == want
    # without the float weights the sign of zeros is unknown: every zero is +0
    plain = write_gti_files(cm, tmp_path / "plain")
    assert (plain / "filter.txt").read_text() == FILTER.replace(NZ, Z)


def gnetdet448() -> ChipModel:
    """Shapes of conf/model/gnetdet.yaml with VOC's 20 classes (meta tensors: no memory)."""
    net = OmegaConf.load(REPO / "conf" / "model" / "gnetdet.yaml").net
    spec, masks = list(net.channels), list(net.mask_bits)
    layers, cin, k = [], 3, 0
    for j, c in enumerate(spec):
        if c == "M":
            continue
        pool = j + 1 < len(spec) and spec[j + 1] == "M"
        layers.append(ChipLayer(torch.empty(c, cin, 3, 3, device="meta"), torch.empty(c, device="meta"),
                                k % 5, pool, masks[k], 8, 20))
        cin, k = c, k + 1
    layers.append(ChipLayer(torch.empty(30, cin, 3, 3, device="meta"), torch.empty(30, device="meta"),
                            7, False, masks[k], 8, 20))
    return ChipModel(layers, 1.0, "5801", {"image_size": 448})


def test_gnetdet448_layout_is_the_published_gti_layer_spec():
    """The GTI MDK's 5801_gnetdet_dat_448.json: 7 major layers with these (coef_bits, image_size,
    input_channels, output_channels, pooling, sublayer_number); the 30-channel output conv is
    padded to 256."""
    cm = gnetdet448()
    doc = dat_json(cm, major_layers(cm, 448))
    got = [(m["coef_bits"], m["image_size"], m["input_channels"], m["output_channels"],
            m["pooling"], m["sublayer_number"]) for m in doc["layer"]]
    assert got == [(3, 448, 3, 64, True, 1), (3, 224, 64, 64, True, 1), (3, 112, 64, 128, True, 2),
                   (3, 56, 128, 256, True, 3), (3, 28, 256, 256, True, 3),
                   (3, 14, 256, 256, False, 3), (8, 14, 256, 256, False, 3)]
    assert [s for m in doc["layer"] for s in m["scaling"]] == [k % 5 for k in range(15)] + [7]
    assert doc["model"] == [{"ChipType": 5801, "MajorLayerNumber": 7}]
    # the model JSON: 14x14x256 output, tile 14*14 = 196, 14*14*256*32 // 49 = 32768 bytes
    text = json.dumps(model_json(cm, major_layers(cm, 448), 448, "/x/chip.dat"), indent=4,
                      separators=(",", ": "), sort_keys=True)
    assert text == model_text("/x/chip.dat", 448, 14, 256, 196, 32768)


def test_layout_errors():
    z = lambda o, i: np.zeros((o, i, 3, 3), np.int64)  # noqa: E731
    cm = ChipModel([_layer(z(2, 1), [0, 0], 0, False, 8), _layer(z(3, 2), [0] * 3, 0, False, 8),
                    _layer(z(1, 3), [0], 0, False, 8)], 1.0, "5801", {"image_size": 8})
    with pytest.raises(ValueError, match=r"sublayers of major layer 1 \(layers 0..2\) have different "
                                         r"output channels \[2, 3\]"):
        major_layers(cm, 8)
    cm = ChipModel([_layer(z(2, 1), [0, 0], 0, False, 8), _layer(z(3, 2), [0] * 3, 0, False, 8)],
                   1.0, "5801", {"image_size": 8})
    with pytest.raises(ValueError, match="output layer has 3 channels, more than the 2"):
        major_layers(cm, 8)
    cm, _ = tiny_chip_model()
    cm.chip = "2803"
    with pytest.raises(ValueError, match="chip 5801 only .* not chip 2803"):
        write_gti_files(cm, "/nonexistent")


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
