"""A tiny chip model, a fused random model, and the GTI model-text and filter fixtures shared by
the GTI hand-off tests."""
from __future__ import annotations

import numpy as np
import torch

from mdk.models.gnetdet import GNetDet
from mdk.quant import calibrate
from mdk.quant.chip_model import ChipLayer, ChipModel
from mdk.stage import apply_stage

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


FILTER = "\n".join(
    ["5.0000000000000000e-01", NZ, "-1.2500000000000000e-01", "2.5000000000000000e-01", Z, Z, Z, Z,
     "-5.0000000000000000e-01",                                   # L0 kernel (0, 0), shift 3
     "1.2500000000000000e-01"] + [Z] * 8                          # L0 kernel (1, 0)
    + [Z] * 4 + ["2.1875000000000000e-01"] + [Z] * 4 + [Z] * 9    # L1 out 0: 7/32 at (1, 1)
    + [Z] * 9 + ["-3.9687500000000000e+00"] + [Z] * 8             # L1 out 1: -127/32
    + [Z] * 9 + [Z] * 8 + ["6.2500000000000000e+00"]              # L2 out 0: 100/16 at in 1 (2, 2)
    + [Z] * 18)                                                   # L2 padding channel


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


def _fused_model(mask_bits, seed=0, channels=(8, "M", 8, "M", 8), num_classes=2, image_size=32):
    torch.manual_seed(seed)
    cfg = dict(num_classes=num_classes, channels=list(channels), mask_bits=mask_bits,
               image_size=image_size, batch_norm=False)
    model = GNetDet(**cfg).eval()
    g = torch.Generator().manual_seed(seed)
    u8 = lambda n: torch.randint(0, 256, (n, 3, image_size, image_size), dtype=torch.uint8,  # noqa
                                 generator=g)
    apply_stage(model, "cal", "5801")
    with calibrate.observing(model), torch.no_grad():
        model(u8(4))
        calibrate.finalize_caps(model)
    apply_stage(model, "step3", "5801")
    apply_stage(model, "step4", "5801")
    return model, u8
