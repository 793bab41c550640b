"""GTI SDK hand-off (issue #16 part 4), golden files: written by hand from the GTI converter's
documented format for a tiny model, and the GNetDet-448 layout of its published layer spec."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from conftest import REPO
from mdk.quant.chip_model import ChipLayer, ChipModel
from mdk.quant.gti_sdk import dat_json, major_layers, model_json, write_gti_files

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
    out = write_gti_files(cm, tmp_path / "gti", float_layers=floats, check_size=False)  # 8 px
    assert sorted(p.name for p in out.iterdir()) == ["5801_gnetdet_dat.json",
                                                     "5801_gnetdet_model.json", "bias.txt",
                                                     "filter.txt", "relu_cap.txt"]
    assert (out / "relu_cap.txt").read_bytes() == b"15.5\n"  # CAP = 31 * output.scale 0.5
    assert (out / "filter.txt").read_bytes() == FILTER.encode()
    assert (out / "bias.txt").read_bytes() == BIAS.encode()
    assert (out / "5801_gnetdet_dat.json").read_bytes() == DAT.encode()
    # last major layer 4x4, no pool: tile min(4, 14)^2 = 16; bytes 4*4*2*32 // 49 = 20
    dat_path = os.path.realpath(out / "chip.dat")
    want = model_text(dat_path, 8, 4, 2, 16, 20)
    assert (out / "5801_gnetdet_model.json").read_text() == want
    # without the float weights the sign of zeros is unknown: every zero is +0
    plain = write_gti_files(cm, tmp_path / "plain", check_size=False)
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
