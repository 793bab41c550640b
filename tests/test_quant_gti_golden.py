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
from mdk.quant.gti_sdk import dat_json, sdk_major_layers, model_json, write_gti_files
from helpers.gti import FILTER, NZ, Z, _layer, model_text, tiny_chip_model

# filter.txt by hand: values / 2^shift in %.16e, C order, layer after layer; the last layer is
# padded from 1 to 2 output channels (its major layer's width) with +0.
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
    doc = dat_json(cm, sdk_major_layers(cm, 448))
    got = [(m["coef_bits"], m["image_size"], m["input_channels"], m["output_channels"],
            m["pooling"], m["sublayer_number"]) for m in doc["layer"]]
    assert got == [(3, 448, 3, 64, True, 1), (3, 224, 64, 64, True, 1), (3, 112, 64, 128, True, 2),
                   (3, 56, 128, 256, True, 3), (3, 28, 256, 256, True, 3),
                   (3, 14, 256, 256, False, 3), (8, 14, 256, 256, False, 3)]
    assert [s for m in doc["layer"] for s in m["scaling"]] == [k % 5 for k in range(15)] + [7]
    assert doc["model"] == [{"ChipType": 5801, "MajorLayerNumber": 7}]
    # the model JSON: 14x14x256 output, tile 14*14 = 196, 14*14*256*32 // 49 = 32768 bytes
    text = json.dumps(model_json(cm, sdk_major_layers(cm, 448), 448, "/x/chip.dat"), indent=4,
                      separators=(",", ": "), sort_keys=True)
    assert text == model_text("/x/chip.dat", 448, 14, 256, 196, 32768)


def test_layout_errors():
    z = lambda o, i: np.zeros((o, i, 3, 3), np.int64)  # noqa: E731
    cm = ChipModel([_layer(z(2, 1), [0, 0], 0, False, 8), _layer(z(3, 2), [0] * 3, 0, False, 8),
                    _layer(z(1, 3), [0], 0, False, 8)], 1.0, "5801", {"image_size": 8})
    with pytest.raises(ValueError, match=r"sublayers of major layer 1 \(layers 0..2\) have different "
                                         r"output channels \[2, 3\]"):
        sdk_major_layers(cm, 8)
    cm = ChipModel([_layer(z(2, 1), [0, 0], 0, False, 8), _layer(z(3, 2), [0] * 3, 0, False, 8)],
                   1.0, "5801", {"image_size": 8})
    with pytest.raises(ValueError, match="output layer has 3 channels, more than the 2"):
        sdk_major_layers(cm, 8)
    cm, _ = tiny_chip_model()
    cm.chip = "2803"
    with pytest.raises(ValueError, match="chip 5801 only .* not chip 2803"):
        write_gti_files(cm, "/nonexistent")
