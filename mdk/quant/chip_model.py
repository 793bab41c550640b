"""The exported chip model: integer mantissas + per-layer shifts + layer spec, in an open format
readable without mdk (every key: docs/pipeline.md, The chip model format): ``chip_model.json``,
the spec, and ``weights.npz``, ``layer{i}.weight`` int64 [out, in, 3, 3] and ``layer{i}.bias``
int64 [out] (plain numpy arrays, no pickle).

Layer semantics: ``y = clamp(R((conv(x, W) + B) / 2**shift), 0, 31)`` with R rounding half away
from zero, then 2x2/2 max-pool if ``pool``; input ``x0 = ((u8 >> 2) + 1) >> 1``; network output =
last activation * ``output.scale``. The float weight is exactly ``W / 2**shift``.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from mdk.atomic_file import write_json
from mdk.quant.bn_fold import chip_layers
from mdk.quant.fusion import is_fused
from mdk.quant.chips import chip_bits
from mdk.quant.weights import MAX_SHIFT, conv_mantissas

FORMAT, VERSION = "mdk-chip-model", 1
SPEC_FILE, WEIGHTS_FILE = "chip_model.json", "weights.npz"
LAYER_SEMANTICS = ("y = clamp(R((conv2d(x, W, stride 1, pad 1) + B) / 2**shift), 0, 31), "
                   "R = round half away from zero; then 2x2 stride-2 max-pool if pool")
INPUT_SEMANTICS = "x0 = ((u8 >> 2) + 1) >> 1 clipped to 0..31, u8 = uint8 RGB image NCHW"


@dataclass
class ChipLayer:
    weight: torch.Tensor  # int64 [out, in, kh, kw] mantissas
    bias: torch.Tensor  # int64 [out] mantissas
    shift: int
    pool: bool
    mask_bits: int
    weight_bits: int
    bias_bits: int
    cap: float = 31.0


@dataclass
class ChipModel:
    layers: list[ChipLayer]
    out_scale: float
    chip: str
    meta: dict[str, Any] = field(default_factory=dict)
    simulation_only: bool = False  # an input size the chip does not take (export.allow_any_size)


def chip_model_from(model: nn.Module, chip: str) -> ChipModel:
    """Integer form of a fused (step4) model; the same mantissas its fake-quant forward uses."""
    layers = chip_layers(model)
    if not is_fused(model):
        raise ValueError("chip export needs a gain-fused step4 model (mdk.stage.apply_stage into the "
                         "stage whose record fuses gains, after loading that stage's input)")
    out = []
    for i, layer in enumerate(layers):
        if layer.bn is not None:
            raise ValueError(f"layer {i} still has BatchNorm; fold it before export")
        wb, bb = chip_bits(chip, layer.mask_bits)
        if layer.quant_weight and tuple(layer.chip_bits) != (wb, bb):
            raise ValueError(f"layer {i} was trained with (weight, bias) bits {layer.chip_bits} "
                             f"but chip {chip} uses {(wb, bb)} for {layer.mask_bits}-bit masks")
        w, b, s = conv_mantissas(layer.conv.weight, layer.conv.bias, layer.mask_bits, wb, bb)
        out.append(ChipLayer(w.cpu(), b.cpu(), s, bool(layer.pool), int(layer.mask_bits), wb, bb,
                             float(layer.cap)))
    core = getattr(model, "module", model)
    meta = {k: getattr(core, k) for k in ("num_classes", "boxes_per_cell", "image_size", "grid")
            if isinstance(getattr(core, k, None), int)}
    if hasattr(getattr(core, "head", None), "config"):  # how a user's program reads the output
        meta["head"] = core.head.config()
    return ChipModel(out, float(core.out_scale), str(chip), meta)


def save_chip_model(cm: ChipModel, out_dir: str | Path) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    arrays, specs = {}, []
    for i, L in enumerate(cm.layers):
        arrays[f"layer{i}.weight"] = L.weight.numpy().astype(np.int64)
        arrays[f"layer{i}.bias"] = L.bias.numpy().astype(np.int64)
        specs.append({"name": f"layer{i}", "in_channels": int(L.weight.shape[1]),
                      "out_channels": int(L.weight.shape[0]), "kernel": list(L.weight.shape[2:]),
                      "stride": 1, "padding": 1, "mask_bits": L.mask_bits,
                      "weight_bits": L.weight_bits, "bias_bits": L.bias_bits, "shift": L.shift,
                      "pool": "max2x2" if L.pool else None, "cap": L.cap,
                      "weight": f"layer{i}.weight", "bias": f"layer{i}.bias",
                      "weight_range": [int(L.weight.min()), int(L.weight.max())],
                      "bias_range": [int(L.bias.min()), int(L.bias.max())]})
    doc = {"format": FORMAT, "version": VERSION, "chip": cm.chip,
           "simulation_only": bool(cm.simulation_only), "input": INPUT_SEMANTICS,
           "layer_semantics": LAYER_SEMANTICS,
           "output": {"scale": cm.out_scale, "formula": "output = y_last * scale"},
           "meta": cm.meta, "layers": specs}
    np.savez(out_dir / WEIGHTS_FILE, **arrays)
    write_json(out_dir / SPEC_FILE, doc, indent=2)
    return out_dir


def load_chip_model(path: str | Path) -> ChipModel:
    """Read a directory written by ``save_chip_model`` / ``export_chip_model``, validating it."""
    d = Path(path)
    spec_path, w_path = d / SPEC_FILE, d / WEIGHTS_FILE
    for p in (spec_path, w_path):
        if not p.is_file():
            raise FileNotFoundError(f"{p} is missing: not a chip model directory (run step=step4 "
                                    "to export one)")
    doc = json.loads(spec_path.read_text())
    if doc.get("format") != FORMAT or doc.get("version") != VERSION:
        raise ValueError(f"{spec_path}: format/version {doc.get('format')}/{doc.get('version')} "
                         f"is not {FORMAT}/{VERSION}")
    layers = []
    with np.load(w_path, allow_pickle=False) as npz:
        for i, s in enumerate(doc["layers"]):
            for key in ("weight", "bias"):
                if s[key] not in npz:
                    raise ValueError(f"{w_path}: array {s[key]!r} (layers[{i}].{key}) is missing")
            w, b = (torch.from_numpy(npz[s[key]].astype(np.int64)) for key in ("weight", "bias"))
            want = (s["out_channels"], s["in_channels"], *s["kernel"])
            if tuple(w.shape) != tuple(want) or tuple(b.shape) != (s["out_channels"],):
                raise ValueError(f"{spec_path}: layers[{i}] shapes {tuple(w.shape)}/"
                                 f"{tuple(b.shape)} do not match the spec {want}")
            if not 0 <= int(s["shift"]) <= MAX_SHIFT:
                raise ValueError(f"{spec_path}: layers[{i}].shift={s['shift']} not in 0..{MAX_SHIFT}")
            layers.append(ChipLayer(w, b, int(s["shift"]), s["pool"] is not None,
                                    int(s["mask_bits"]), int(s["weight_bits"]),
                                    int(s["bias_bits"]), float(s["cap"])))
    return ChipModel(layers, float(doc["output"]["scale"]), str(doc["chip"]), doc.get("meta", {}),
                     bool(doc.get("simulation_only", False)))
