"""Where the GTI converter would write other numbers than mdk's hand-off: the last layer's shift
(``converter_shift``) and float32 rounding slips (``rounding_slips``), docs/gti-compat.md, 2 and 4.
The files keep the trained values; the export logs one warning per affected layer.
"""
from __future__ import annotations

import logging
from typing import Optional, Sequence

import torch

from mdk.quant.chip_model import ChipModel
from mdk.quant.rounding import gti_round, round_half_away
from mdk.quant.weights import compute_shift, weight_mantissas

log = logging.getLogger(__name__)

FloatLayers = Sequence[tuple[torch.Tensor, Optional[torch.Tensor]]]


def converter_shift(w: torch.Tensor, b: Optional[torch.Tensor], weight_bits: int,
                    bias_bits: int) -> int:
    """The shift the GTI converter gives the last layer: its formula on the float32 values,
    evaluated in float64."""
    w32, b32 = (None if t is None else t.detach().cpu().float() for t in (w, b))
    return int(compute_shift(w32, b32, weight_bits, bias_bits, torch.float64))


def rounding_slips(w: torch.Tensor, b: Optional[torch.Tensor], mask_bits: int, shift: int) -> int:
    """How many of a layer's written weights and biases the GTI tools round otherwise than mdk."""
    w32 = w.detach().cpu().to(torch.float32)
    scale = torch.tensor(2.0 ** shift, dtype=torch.float32)
    ours = weight_mantissas(w32, int(mask_bits), scale, rnd=round_half_away)
    theirs = weight_mantissas(w32, int(mask_bits), scale, rnd=gti_round)
    n = int((ours != theirs).sum())
    if b is not None:
        x = b.detach().cpu().to(torch.float32) * scale
        n += int((round_half_away(x) != gti_round(x)).sum())
    return n


def warn_where_the_converter_differs(cm: ChipModel, float_layers: FloatLayers,
                                     filter_file: str) -> None:
    for i, ((w, b), L) in enumerate(zip(float_layers[:-1], cm.layers[:-1], strict=True)):
        slips = rounding_slips(w, b, L.mask_bits, L.shift)  # the last layer: its shift, below
        if slips:
            log.warning("layer %d: %d written value(s) where the GTI tools' float32 floor(x + 0.5) "
                        "rounds otherwise (it rounds ±0.49999997 to ±1); %s holds the trained "
                        "values", i, slips, filter_file)
    (w, b), L = float_layers[-1], cm.layers[-1]
    conv = converter_shift(w, b, L.weight_bits, L.bias_bits)
    if conv != L.shift:
        log.warning("last layer: the GTI converter would compute shift %d (it evaluates the "
                    "last layer in float64) where the model was trained with %d (float32, an "
                    "exact power-of-two boundary); %s holds the trained values", conv,
                    L.shift, filter_file)
