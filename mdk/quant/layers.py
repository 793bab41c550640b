"""ChipConv: one layer of the CNN accelerator (3x3 conv, optional BN, ReLU / 5-bit activation, 2x2 pool).

The stage (DESIGN §3) switches quantization on per layer through plain attributes, so the same
module object serves step1 (float) to step4 (integer activations):

- ``quant_weight``: conv weight/bias go through the chip weight quantizer (STE) for ``mask_bits``
  with the chip's (weight bits, bias bits) in ``chip_bits``.
- ``observer``: a callable fed the pre-activation conv output during calibration.
- ``quant_act``: ReLU is replaced by clamp(0, cap) + 5-bit rounding with the calibrated ``cap``.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn


class ChipConv(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, mask_bits: int = 8, pool: bool = False,
                 batch_norm: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=True)
        self.bn: Optional[nn.BatchNorm2d] = nn.BatchNorm2d(out_ch) if batch_norm else None
        self.pool = pool
        self.mask_bits = mask_bits
        self.chip_bits: tuple[int, int] = (8, 20)
        # 0 means "not calibrated"; a buffer so it travels with state_dict and checkpoints.
        self.register_buffer("cap", torch.tensor(0.0))
        self.quant_weight = False
        self.quant_act = False
        self.observer: Optional[Callable[[torch.Tensor], None]] = None

    def effective_weight_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Conv weight and bias as the chip sees them in the current mode."""
        w, b = self.conv.weight, self.conv.bias
        if self.quant_weight:
            from mdk.quant.weights import quantize_conv  # local: float runs never pay for it

            w, b = quantize_conv(w, b, self.mask_bits, *self.chip_bits)
        return w, b

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.effective_weight_bias()
        y = F.conv2d(x, w, b, padding=1)
        if self.bn is not None:
            y = self.bn(y)
        if self.observer is not None:
            self.observer(y)
        if self.quant_act:
            from mdk.quant.activation import quantize_activation

            y = quantize_activation(y, self.cap)
        else:
            y = F.relu(y)
        if self.pool:
            y = F.max_pool2d(y, 2)
        return y
