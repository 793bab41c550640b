"""Integer-only reference forward of an exported chip model, and the exactness check (docs/pipeline.md).

The float fake-quant conv is exact while every partial sum (a multiple of ``2^-s``) fits the
significand: ``|acc| < 2^53`` in float64 (always here) or ``2^24`` in float32
(``float32_is_exact``). That needs a direct-summation conv (CPU); Winograd/FFT/TF32 GPU kernels
are not exact, hence ``fake_quant_forward`` runs float64 on the CPU.

The reference's accumulators are integers (activations 0..31 times weight mantissas, plus the
bias mantissa): a CPU conv computes them exactly in float32 when ``float32_is_exact`` (any partial
sum is at most the sum of the magnitudes, below ``2^24``), else in float64 (below ``2^53``), and
at the speed of the fake-quant conv; ``arithmetic="int64"`` computes them on integers (slow: no
integer conv kernel), which the tests compare against. Rounding, clamping and pooling are integer.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from mdk.quant.activation import LEVELS, quantize_input
from mdk.quant.bn_fold import chip_layers
from mdk.quant.chip_model import ChipModel
from mdk.quant.rounding import round_shift_int


ARITHMETICS = ("auto", "int64")


def integer_forward(cm: ChipModel, images: torch.Tensor, arithmetic: str = "auto",
                    keep: bool = True) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Returns (float64 output = last activation * out_scale, int64 activation of every layer;
    none with ``keep=False``). ``arithmetic``: ``auto`` (float32 or float64, whichever holds
    ``cm``'s accumulators exactly) or ``int64``; the results are the same integers."""
    if arithmetic not in ARITHMETICS:
        raise ValueError(f"arithmetic={arithmetic!r}: use one of {ARITHMETICS}")
    if arithmetic == "int64":
        return _int64_forward(cm, images, keep)
    dtype = torch.float32 if float32_is_exact(cm) else torch.float64
    x = quantize_input(images.cpu()).to(dtype)  # integers 0..31
    acts = []
    for L in cm.layers:
        acc = F.conv2d(x, L.weight.to(dtype), L.bias.to(dtype), padding=1)  # exact integers
        # R(acc / 2^s) clamped to 0..31: the scaling is exact, and so is + 0.5 below 2^23 (a
        # larger value clamps to 31 whatever its last bit); a negative one clamps to 0 whichever
        # way its tie rounds, so floor(v + 0.5) is R here
        x = acc.mul_(2.0 ** -L.shift).add_(0.5).floor_().clamp_(0, LEVELS)
        if L.pool:
            x = F.max_pool2d(x, 2)
        if keep:
            acts.append(x.to(torch.int64))
    return x.to(torch.float64) * cm.out_scale, acts


def _int64_forward(cm: ChipModel, images: torch.Tensor, keep: bool
                   ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The same on integers: int64 conv (no fast kernel), integer rounding shift."""
    x = quantize_input(images.cpu()).to(torch.int64)
    acts = []
    for L in cm.layers:
        acc = F.conv2d(x, L.weight, None, padding=1) + L.bias.view(1, -1, 1, 1)
        x = round_shift_int(acc, L.shift).clamp_(0, LEVELS)
        if L.pool:  # via float64, exact for 0..31: older torch has no int64 CPU max_pool2d
            x = F.max_pool2d(x.double(), 2).long()
        if keep:
            acts.append(x)
    return x.to(torch.float64) * cm.out_scale, acts


@torch.no_grad()
def fake_quant_forward(model: nn.Module, images: torch.Tensor,
                       dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's own ChipConv forwards on the CPU in ``dtype`` (weights quantized as in training,
    only the arithmetic widened); returns the output and every activation."""
    core = getattr(model, "module", model)
    if any(t.device.type != "cpu" for t in core.state_dict().values()):
        core = copy.deepcopy(core).cpu()  # never move the caller's (training) model
    layers = chip_layers(core)
    if not all(layer.quant_weight and layer.quant_act for layer in layers):
        raise ValueError("fake_quant_forward needs the step4 configuration (quantized weights and "
                         "activations): mdk.stage.apply_stage into the stage whose record fuses "
                         "gains")
    x = quantize_input(images.cpu()).to(dtype)
    acts = []
    for layer in layers:
        x = layer(x)
        acts.append(x)
    return x * core.out_scale.to(dtype), acts


def float32_is_exact(cm: ChipModel) -> bool:
    """True if a float32 direct-summation conv reproduces the integer accumulators exactly: the
    largest possible |conv + bias| mantissa sum, for inputs in 0..31, stays below 2**24."""
    worst = max((int((L.weight.abs().flatten(1).sum(1) * LEVELS + L.bias.abs()).max())
                 for L in cm.layers), default=0)
    return worst < 2 ** 24


def count_mismatches(model: nn.Module, cm: ChipModel, images: torch.Tensor,
                     dtype: torch.dtype = torch.float64) -> list[int]:
    """Per layer: activations where the fake-quant level (act * 31 / cap) != the integer level."""
    _, ref = integer_forward(cm, images)
    _, fq = fake_quant_forward(model, images, dtype)
    return [int((a_fq * (LEVELS / L.cap) != a_int.to(dtype)).sum())
            for L, a_int, a_fq in zip(cm.layers, ref, fq)]
