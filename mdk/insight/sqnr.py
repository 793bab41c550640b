"""Signal-to-quantization-noise ratios of a model's chip layers, and how much each clips (what each
number means: docs/pipeline.md, "Finding where accuracy goes"). The clipping is counted in the
float model, free of the other layers' errors. A ratio with no noise at all is ``None`` (infinite).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Iterable, Optional

import torch
from torch import nn

from mdk.insight.layer_modes import mask_bits_of, quantized_only
from mdk.quant.bn_fold import chip_layers
from mdk.quant.chips import chip_bits
from mdk.quant.weights import conv_mantissas


def db(signal: float, noise: float) -> Optional[float]:
    """``10 log10(signal / noise)``; None when there is no noise."""
    if noise <= 0:
        return None
    if signal <= 0:
        return -math.inf
    return 10.0 * math.log10(signal / noise)


def weight_sqnr(layer: nn.Module, mask_bits: int, chip: str) -> tuple[Optional[float], int]:
    """(weight SQNR in dB, shift) of one chip layer's float weights quantized at ``mask_bits``."""
    w = layer.conv.weight.detach()
    w_int, _, shift = conv_mantissas(w, layer.conv.bias, int(mask_bits),
                                     *chip_bits(str(chip), int(mask_bits)))
    w64 = w.double()
    noise = float(((w64 - w_int.double() / 2 ** shift) ** 2).sum())
    return db(float((w64 ** 2).sum()), noise), shift


@dataclass
class _Sums:
    signal: float = 0.0
    noise_isolated: float = 0.0
    noise_cumulative: float = 0.0
    clipped: int = 0
    values: int = 0


def _outputs(model: nn.Module, images: torch.Tensor, pre: Optional[list] = None
             ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every chip layer's (input, output) of one forward; ``pre`` receives (values above the cap,
    values) of each layer's pre-activation."""
    layers = chip_layers(model)
    seen: list[tuple[torch.Tensor, torch.Tensor]] = []
    hooks = [layer.register_forward_hook(lambda _m, args, out: seen.append((args[0], out)))
             for layer in layers]
    if pre is not None:
        for layer in layers:
            layer.observer = lambda y, cap=layer.cap: pre.append((int((y > cap).sum()), y.numel()))
    try:
        model(images)
    finally:
        for h in hooks:
            h.remove()
        for layer in layers:
            layer.observer = None
    return seen


@torch.no_grad()
def layer_table(model: nn.Module, batches: Iterable[torch.Tensor], chip: str
                ) -> list[dict[str, Any]]:
    """Per chip layer at the model's own mask widths: its bits, shift, cap, weight SQNR, and the
    isolated and cumulative activation SQNR and clipped fraction over ``batches`` (uint8 images)."""
    layers = chip_layers(model)
    bits = mask_bits_of(model)
    sums = [_Sums() for _ in layers]
    for images in batches:
        pre: list[tuple[int, int]] = []
        with quantized_only(model, {}, chip):
            ref = _outputs(model, images, pre)
        with quantized_only(model, bits, chip):
            full = _outputs(model, images)
        for i, (layer, s) in enumerate(zip(layers, sums)):
            with quantized_only(model, {i: bits[i]}, chip):  # alone, on the float model's input
                q = layer(ref[i][0])
            r = ref[i][1].double()
            s.signal += float((r ** 2).sum())
            s.noise_isolated += float(((q.double() - r) ** 2).sum())
            s.noise_cumulative += float(((full[i][1].double() - r) ** 2).sum())
            s.clipped += pre[i][0]
            s.values += pre[i][1]
    out = []
    for i, (layer, s) in enumerate(zip(layers, sums)):
        w_db, shift = weight_sqnr(layer, bits[i], chip)
        out.append({"index": i, "mask_bits": bits[i], "shift": shift, "cap": float(layer.cap),
                    "weight_sqnr_db": w_db,
                    "act_sqnr_db_isolated": db(s.signal, s.noise_isolated),
                    "act_sqnr_db_cumulative": db(s.signal, s.noise_cumulative),
                    "clipped_fraction": s.clipped / s.values if s.values else 0.0})
    return out
