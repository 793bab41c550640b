"""Quantize only some chip layers of a model, at chosen mask widths: the building block of the
per-layer sensitivity and of a bit-width plan. With every switch off the same model is the float
reference, so a difference measures quantization alone.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator, Mapping

from torch import nn

from mdk.insight.scoring import EvalSet, Score, score
from mdk.quant.bn_fold import chip_layers
from mdk.quant.chips import chip_bits


def mask_bits_of(model: nn.Module) -> dict[int, int]:
    """``{index: mask bits}`` of every chip layer."""
    return {i: int(layer.mask_bits) for i, layer in enumerate(chip_layers(model))}


@contextmanager
def quantized_only(model: nn.Module, mask_bits: Mapping[int, int], chip: str,
                   activations: bool = True) -> Iterator[nn.Module]:
    """``model`` with the layers in ``mask_bits`` quantized at those widths (activations too unless
    ``activations=False``), every other layer float; put back afterwards. ValueError for an
    unknown index, a width the chip lacks, or quantized activations without a cap."""
    layers = chip_layers(model)
    bad = sorted(set(mask_bits) - set(range(len(layers))))
    if bad:
        raise ValueError(f"layers {bad} do not exist: the model has {len(layers)} chip layers")
    wanted = {i: (int(b), chip_bits(str(chip), int(b))) for i, b in mask_bits.items()}
    uncalibrated = [i for i in wanted if activations and not float(layers[i].cap) > 0]
    if uncalibrated:
        raise ValueError(f"layers {uncalibrated} have no activation cap (cap 0): the caps must "
                         "come from a calibrated stage's checkpoint")
    saved = [(layer.quant_weight, layer.quant_act, layer.mask_bits, layer.chip_bits)
             for layer in layers]
    try:
        for i, layer in enumerate(layers):
            on = i in wanted
            layer.quant_weight, layer.quant_act = on, on and activations
            if on:
                layer.mask_bits, layer.chip_bits = wanted[i]
        yield model
    finally:
        for layer, (qw, qa, bits, cb) in zip(layers, saved):
            layer.quant_weight, layer.quant_act, layer.mask_bits, layer.chip_bits = qw, qa, bits, cb


def measure_quantized(model: nn.Module, mask_bits: Mapping[int, int], data: EvalSet,
                      chip: str, activations: bool = True) -> Score:
    """(mAP, loss) on ``data`` with only the layers of ``mask_bits`` quantized (``{}``: the float
    reference), in this process alone."""
    with quantized_only(model, mask_bits, chip, activations):
        return score(model, data)
