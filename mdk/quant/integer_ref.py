"""Integer-only reference forward of an exported chip model, and the exactness check (docs/pipeline.md).

``integer_forward`` uses only int64 tensors: int64 conv, add the bias mantissa, shift with round
half away from zero, clamp 0..31, 2x2 max-pool. It must equal the step4 fake-quant forward with 0
mismatching activations.

Float exactness. The fake-quant layer computes ``sum(x * W/2^s) + B/2^s`` in floating point; every
term is a multiple of ``2^-s`` and so is every partial sum, so the float result is exact as long as
each partial sum fits the significand: ``|acc| < 2^53`` (float64, always true here) or ``2^24``
(float32, checked by ``float32_is_exact`` from the worst case ``31 * sum|W| + |B|`` per output
channel). This assumes a direct-summation conv (CPU im2col/GEMM); Winograd/FFT/TF32 GPU kernels
are not exact, which is why ``fake_quant_forward`` defaults to float64 on the CPU.
"""
from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from mdk.quant.bn_fold import chip_layers
from mdk.quant.chip_model import ChipModel
from mdk.quant.rounding import round_shift_int

LEVEL_MAX = 31


def quantize_input_int(images: torch.Tensor) -> torch.Tensor:
    """``((u8 >> 2) + 1) >> 1`` clipped to 0..31, as int64 (float images: 0..255, truncated)."""
    u8 = images if images.dtype == torch.uint8 else images.clamp(0, 255).to(torch.uint8)
    return (((u8.to(torch.int64) >> 2) + 1) >> 1).clamp_(0, LEVEL_MAX)


def _pool2x2(x: torch.Tensor) -> torch.Tensor:
    # max_pool2d has no int64 CPU kernel; floor mode like F.max_pool2d(x, 2).
    b, c, h, w = x.shape
    x = x[:, :, : h // 2 * 2, : w // 2 * 2]
    return x.reshape(b, c, h // 2, 2, w // 2, 2).amax(dim=(3, 5))


def integer_forward(cm: ChipModel, images: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Returns (float64 output = last activation * out_scale, int64 activation of every layer)."""
    x = quantize_input_int(images.cpu())
    acts = []
    for L in cm.layers:
        acc = F.conv2d(x, L.weight, None, padding=1) + L.bias.view(1, -1, 1, 1)
        x = round_shift_int(acc, L.shift).clamp_(0, LEVEL_MAX)
        if L.pool:
            x = _pool2x2(x)
        acts.append(x)
    return x.to(torch.float64) * cm.out_scale, acts


@torch.no_grad()
def fake_quant_forward(model: nn.Module, images: torch.Tensor,
                       dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The model's own ChipConv forwards, chained on the CPU in ``dtype``; returns every activation.

    The quantized weights are computed from the float32 parameters exactly as in training and only
    the arithmetic is widened (ChipConv casts weights to the input dtype).
    """
    core = getattr(model, "module", model)
    if any(t.device.type != "cpu" for t in core.state_dict().values()):
        core = copy.deepcopy(core).cpu()  # never move the caller's (training) model
    layers = chip_layers(core)
    if not all(layer.quant_weight and layer.quant_act for layer in layers):
        raise ValueError("fake_quant_forward needs the step4 configuration (quantized weights and "
                         "activations): mdk.stage.apply_stage into the stage whose record fuses "
                         "gains")
    x = quantize_input_int(images.cpu()).to(dtype)
    acts = []
    for layer in layers:
        x = layer(x)
        acts.append(x)
    return x * core.out_scale.to(dtype), acts


def max_accumulator(cm: ChipModel) -> int:
    """Largest possible |conv + bias| mantissa sum over all layers for inputs in 0..31."""
    worst = 0
    for L in cm.layers:
        per_out = L.weight.abs().flatten(1).sum(1) * LEVEL_MAX + L.bias.abs()
        worst = max(worst, int(per_out.max()))
    return worst


def float32_is_exact(cm: ChipModel) -> bool:
    """True if a float32 direct-summation conv reproduces the integer accumulators exactly."""
    return max_accumulator(cm) < 2 ** 24


def count_mismatches(model: nn.Module, cm: ChipModel, images: torch.Tensor,
                     dtype: torch.dtype = torch.float64) -> list[int]:
    """Per layer: activations where the fake-quant level (act * 31 / cap) != the integer level."""
    _, ref = integer_forward(cm, images)
    _, fq = fake_quant_forward(model, images, dtype)
    out = []
    for L, a_int, a_fq in zip(cm.layers, ref, fq):
        levels = a_fq * (LEVEL_MAX / L.cap)
        out.append(int((levels != a_int.to(dtype)).sum()))
    return out
