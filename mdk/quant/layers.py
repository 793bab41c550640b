"""ChipConv: one layer of the CNN accelerator (3x3 conv, optional BN, ReLU / 5-bit activation, 2x2 pool).

One module serves step1 (float) to step4: the stage switches it through plain attributes
(``quant_weight``, ``quant_act``, and ``observer``, fed the pre-activation output during
calibration; mdk.quant.modes). ``cap`` and ``fused`` are buffers and a folded BN is absent, so
checkpoints carry the structure; a layer built with BN drops it on loading a checkpoint without
``bn.*`` keys, so a model built from the config loads any stage's checkpoint.
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import nn

from mdk.quant.activation import quantize_activation
from mdk.quant.weights import quantize_conv


class ChipConv(nn.Module):
    def __init__(self, in_ch: int, out_ch: int, mask_bits: int = 8, pool: bool = False,
                 batch_norm: bool = False, relu: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_ch, out_ch, 3, padding=1, bias=True)
        self.bn: Optional[nn.BatchNorm2d] = nn.BatchNorm2d(out_ch) if batch_norm else None
        # False: the output layer, linear until activations are quantized (a ReLU lets its
        # confidence channels die: pushed to 0 on empty cells, zero gradient ever after)
        self.relu = relu
        self.pool = pool
        self.mask_bits = mask_bits
        self.chip_bits: tuple[int, int] = (8, 20)
        # 0 means "not calibrated"; a buffer so it travels with state_dict and checkpoints.
        self.register_buffer("cap", torch.tensor(0.0))
        # True once step4 gain fusion scaled this layer; checkpoints without it load as False.
        self.register_buffer("fused", torch.tensor(False))
        self.quant_weight = False
        self.quant_act = False
        self.observer: Optional[Callable[[torch.Tensor], None]] = None

    def effective_weight_bias(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Conv weight and bias as the chip sees them in the current mode."""
        w, b = self.conv.weight, self.conv.bias
        if not self.quant_weight:
            return w, b
        if torch.is_grad_enabled():
            return quantize_conv(w, b, self.mask_bits, *self.chip_bits)
        # Without grad the weights are fixed, so quantize once; in-place version counters
        # (bumped by optimizer steps, load_state_dict, fusion) and storage key the cache.
        key = (w._version, b._version, w.data_ptr(), w.dtype, w.device,
               self.mask_bits, tuple(self.chip_bits))
        cache = self.__dict__.get("_wq_cache")
        if cache is None or cache[0] != key:
            cache = (key, quantize_conv(w, b, self.mask_bits, *self.chip_bits))
            self.__dict__["_wq_cache"] = cache
        return cache[1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w, b = self.effective_weight_bias()
        # Cast so a float64 input (exact fake-quant check, mdk.quant.integer_ref) runs in float64.
        y = F.conv2d(x, w.to(x.dtype), b.to(x.dtype), padding=1)
        if self.bn is not None:
            y = self.bn(y)
        if self.observer is not None:
            self.observer(y)
        if self.quant_act:
            y = quantize_activation(y, self.cap)
        else:
            y = F.relu(y) if self.relu else y
        if self.pool:
            y = F.max_pool2d(y, 2)
        return y

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys,
                              unexpected_keys, error_msgs) -> None:
        has_bn_keys = any(k.startswith(prefix + "bn.") for k in state_dict)
        if self.bn is not None and not has_bn_keys:
            # The checkpoint was saved after BN folding (step2 and later): match its structure.
            self.bn = None
        elif self.bn is None and has_bn_keys:
            error_msgs.append(
                f"{prefix}bn.*: the checkpoint has BatchNorm but this layer has none (it was folded "
                "or the model was built without batch_norm). Load the checkpoint before "
                "mdk.stage.apply_stage (which folds BN), or set the model's batch_norm=true.")
            return
        if prefix + "fused" not in state_dict:
            state_dict = {**state_dict, prefix + "fused": torch.tensor(False)}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
