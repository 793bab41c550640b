"""Hand-off to the GTI SDK (chip 5801): from an exported ChipModel, the files the GTI converter
(``gnetmdk/gti/converter.py``) writes before GTI's closed libraries make ``chip.dat`` and the chip
``.model``, in its layout and number formatting, plus ``relu_cap.txt`` (docs/pipeline.md, Hand-off
to the GTI SDK). Byte-identical to the converter's text except where mdk.quant.gti_converter warns.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Optional, Sequence

import numpy as np
import torch

from mdk.atomic_file import replacing, write_text
from mdk.quant.chip_model import ChipModel
from mdk.quant.chips import CHIP_INPUT_SIZES, chip_takes
from mdk.quant.gti_converter import FloatLayers, warn_where_the_converter_differs
from mdk.quant.weights import five_bit_coefficients

log = logging.getLogger(__name__)

GTI_CHIPS = ("5801",)
FILTER_FILE, BIAS_FILE, DAT_FILE, CAP_FILE = "filter.txt", "bias.txt", "chip.dat", "relu_cap.txt"
MODEL_VERSION = 100  # the converter adds this to the model JSON
TILE = 14  # the SDK's default output tile size


@dataclass
class SdkMajorLayer:
    """A major layer as the GTI SDK's layer spec describes it (sublayers of one width, mask
    width and pooling; a new one after a pool or where the mask width changes)."""
    first: int  # index of its first sublayer in ChipModel.layers
    sublayers: int
    coef_bits: int
    image_size: int
    input_channels: int
    output_channels: int
    pooling: bool


def sdk_major_layers(cm: ChipModel, image_size: int) -> list[SdkMajorLayer]:
    """Group the chip layers into the GTI SDK's major layers; ValueError for what the layout
    cannot express."""
    out: list[SdkMajorLayer] = []
    size = int(image_size)
    for i, L in enumerate(cm.layers):
        if tuple(L.weight.shape[2:]) != (3, 3):
            raise ValueError(f"GTI layout: layer {i} has a {tuple(L.weight.shape[2:])} kernel; the "
                             "chip runs 3x3 convolutions only")
        if not out or out[-1].pooling or cm.layers[i - 1].mask_bits != L.mask_bits:  # a new one
            out.append(SdkMajorLayer(i, 0, L.mask_bits, size, int(L.weight.shape[1]), 0, False))
        m = out[-1]
        m.sublayers += 1
        m.output_channels = max(m.output_channels, int(L.weight.shape[0]))
        m.pooling = bool(L.pool)
        if L.pool:
            size //= 2
    last = len(cm.layers) - 1
    for k, m in enumerate(out):
        span = range(m.first, m.first + m.sublayers)
        widths = {int(cm.layers[j].weight.shape[0]) for j in span if j != last}
        if len(widths) > 1:
            raise ValueError(f"GTI layout: the sublayers of major layer {k + 1} (layers "
                             f"{m.first}..{m.first + m.sublayers - 1}) have different output "
                             f"channels {sorted(widths)}; the chip needs one width per major layer")
        if last in span and widths:
            # the output conv is zero-padded to its major layer's width (GNetDet-448: 30 -> 256)
            m.output_channels = widths.pop()
            if int(cm.layers[last].weight.shape[0]) > m.output_channels:
                raise ValueError(f"GTI layout: the output layer has {cm.layers[last].weight.shape[0]} "
                                 f"channels, more than the {m.output_channels} of the other "
                                 f"sublayers of its major layer (the converter pads it to that width)")
    return out


def negative_zeros(w: torch.Tensor, b: torch.Tensor, mask_bits: int,
                   w_int: torch.Tensor, b_int: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """Where the GTI quantizer gives ``-0.0``: a negative value whose mantissa is 0 (5-bit masks:
    only if its coefficient ``R(w/step)`` is not 0, as a zero coefficient comes out +0.0)."""
    w = w.detach().cpu()
    neg_w = (w_int == 0) & (w < 0)
    if mask_bits == 5:
        neg_w &= five_bit_coefficients(w)[0] != 0
    return neg_w.numpy(), ((b_int == 0) & (b.detach().cpu() < 0)).numpy()


def _format(values: np.ndarray, negzero: np.ndarray) -> str:
    uniq, inv = np.unique(values, return_inverse=True)
    text = np.array(["%.16e" % v for v in uniq.tolist()], dtype=object)[inv.reshape(-1)]
    zero = values == 0  # np.unique merges 0.0 and -0.0: give each zero its sign explicitly
    text[zero & ~negzero] = "%.16e" % 0.0
    text[zero & negzero] = "%.16e" % -0.0
    return "\n".join(text.tolist())


def layer_values(cm: ChipModel, majors: Sequence[SdkMajorLayer],
                 negzeros: Optional[Sequence[tuple[np.ndarray, np.ndarray]]] = None
                 ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
    """Per layer: (weights, their -0 mask, biases, their -0 mask) as the converter writes them."""
    last = len(cm.layers) - 1
    for i, L in enumerate(cm.layers):
        w = L.weight.to(torch.float64).numpy() / 2.0 ** L.shift  # exact: mantissas < 2^53
        b = L.bias.to(torch.float64).numpy() / 2.0 ** L.shift
        nw, nb = negzeros[i] if negzeros else (np.zeros(w.shape, bool), np.zeros(b.shape, bool))
        pad = majors[-1].output_channels - w.shape[0] if i == last else 0
        if pad:  # zeros (False) after the last output channel
            w, nw = (np.pad(a, [(0, pad), (0, 0), (0, 0), (0, 0)]) for a in (w, nw))
            b, nb = (np.pad(a, (0, pad)) for a in (b, nb))
        yield w.ravel(), nw.ravel(), b.ravel(), nb.ravel()


def _write_values(path: Path, pieces: Iterable[tuple[np.ndarray, np.ndarray]]) -> None:
    """One layer at a time (GNetDet-448's filter.txt is 165 MB of text), through a temp file."""
    with replacing(path) as f:
        first = True
        for values, negzero in pieces:
            if values.size:
                f.write(("" if first else "\n") + _format(values, negzero))
                first = False


def dat_json(cm: ChipModel, majors: Sequence[SdkMajorLayer]) -> dict:
    layers = [{"coef_bits": m.coef_bits, "image_size": m.image_size,
               "input_channels": m.input_channels, "last_layer_out": False, "learning": False,
               "major_layer": k + 1, "output_channels": m.output_channels, "pooling": m.pooling,
               "scaling": [int(L.shift) for L in cm.layers[m.first:m.first + m.sublayers]],
               "sublayer_number": m.sublayers} for k, m in enumerate(majors)]
    return {"layer": layers, "model": [{"ChipType": int(cm.chip), "MajorLayerNumber": len(majors)}]}


def model_json(cm: ChipModel, majors: Sequence[SdkMajorLayer], image_size: int, dat_path: str) -> dict:
    last = majors[-1]
    size, channels, tile = last.image_size, last.output_channels, min(last.image_size, TILE)
    if last.pooling:  # the SDK reads the pooled output; a 7x7 one in fc mode
        size, tile = size >> 1, TILE >> 1
    fc = last.pooling and size == 7
    post, scaledown = ("fc77_decode", 3) if fc else ("interlace_tile_decode", 0)
    out_bytes = size * size * channels * (64 if fc else 32) // 49
    reader = {"data file": None, "data offset": None, "input format": "CS_BGR24_PLANAR",
              "name": "image reader", "operation": "IMAGEREADER", "output channels": 3,
              "output format": "CS_BGR24_PLANAR", "output height": int(image_size),
              "output width": int(image_size)}
    cnn = {"data file": dat_path, "data offset": 0,
           "device": {"chip": str(cm.chip), "name": None, "type": 0},
           "inputs": [{"format": "byte", "prefilter": "interlace_tile_encode",
                       "shape": [int(image_size), int(image_size), majors[0].input_channels]}],
           "mode": 0, "name": "cnn", "operation": "GTICNN", "output channels": channels,
           "output height": size, "output width": size,
           "outputs": [{"format": "byte", "layer scaledown": scaledown, "postfilter": post,
                        "shape": [size, size, channels, tile * tile, out_bytes], "upsampling": 0}]}
    return {"layer": [reader, cnn], "name": f"gti_{cm.chip}_gnetdet", "version": MODEL_VERSION}


def _dump(doc: dict) -> str:
    return json.dumps(doc, indent=4, separators=(",", ": "), sort_keys=True)


def write_gti_files(cm: ChipModel, out_dir: str | Path, float_layers: Optional[FloatLayers] = None,
                    check_size: bool = True) -> Path:
    """Write the hand-off files into ``out_dir`` (created).

    ``float_layers``: the fused float (weight, bias) per layer, for the sign of zeros and the
    converter warnings; without it every zero is +0. ``check_size=False``: any input size (tests).
    """
    chip = str(cm.chip)
    if chip not in GTI_CHIPS:
        raise ValueError(f"the GTI SDK hand-off exists for chip {'/'.join(GTI_CHIPS)} only (the GTI "
                         f"PyTorch MDK converts for it), not chip {chip}")
    size = int(cm.meta.get("image_size") or 0)
    if size <= 0:
        raise ValueError("write_gti_files needs the model's image size (meta['image_size'])")
    if check_size and not chip_takes(chip, size):
        raise ValueError(f"the GTI chip spec takes input sizes {CHIP_INPUT_SIZES[chip]}, not {size}")
    majors = sdk_major_layers(cm, size)
    negz = None
    if float_layers is not None:
        negz = [negative_zeros(w, b, L.mask_bits, L.weight, L.bias)
                for (w, b), L in zip(float_layers, cm.layers, strict=True)]
        warn_where_the_converter_differs(cm, float_layers, FILTER_FILE)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    _write_values(out / FILTER_FILE, ((w, nw) for w, nw, _, _ in layer_values(cm, majors, negz)))
    _write_values(out / BIAS_FILE, ((b, nb) for _, _, b, nb in layer_values(cm, majors, negz)))
    suffix = "_448" if size == 448 else ""  # the names of the GTI MDK's templates
    write_text(out / f"{chip}_gnetdet_dat{suffix}.json", _dump(dat_json(cm, majors)))
    write_text(out / f"{chip}_gnetdet_model{suffix}.json",
               _dump(model_json(cm, majors, size, os.path.realpath(out / DAT_FILE))))
    cap = str(np.float32(cm.out_scale * 31.0))  # c_last, as the shortest float32 text
    write_text(out / CAP_FILE, f"{cap}\n")
    log.info("GTI SDK hand-off (%d major layers, CAP %s) written to %s", len(majors), cap, out)
    return out


def set_dat_path(gti_dir: str | Path, dat_path: str) -> Path:
    """Point the hand-off's model JSON at ``dat_path`` (``chip.dat`` on the machine that runs GTI's
    tools), keeping the rest; returns the JSON's path."""
    found = sorted(Path(gti_dir).glob("*_gnetdet_model*.json"))
    if len(found) != 1:
        raise FileNotFoundError(f"{gti_dir} holds {len(found)} GTI model JSON files "
                                "(*_gnetdet_model*.json), not 1: not a GTI hand-off folder")
    doc = json.loads(found[0].read_text())
    cnn = [layer for layer in doc.get("layer", []) if layer.get("operation") == "GTICNN"]
    if len(cnn) != 1:
        raise ValueError(f"{found[0]} has {len(cnn)} GTICNN layers, not 1")
    cnn[0]["data file"] = str(dat_path)
    write_text(found[0], _dump(doc))
    return found[0]
