"""Fold BatchNorm (which the chip lacks) into the preceding chip conv, once before step2, in
float64 with one final rounding (the formula: docs/gti-compat.md, 8)."""
from __future__ import annotations

import logging
from typing import Optional

import torch
from torch import nn

from mdk.quant.layers import ChipConv

log = logging.getLogger(__name__)

# The tensors of a BatchNorm2d's state_dict (mdk's, the GTI MDK's and torchvision's alike)
BN_KEYS = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")


def chip_layers(model: nn.Module) -> list[ChipConv]:
    """All ChipConv layers in forward order (also through DDP / other wrappers)."""
    return [m for m in model.modules() if isinstance(m, ChipConv)]


@torch.no_grad()
def folded(weight: torch.Tensor, bias: torch.Tensor, running_mean: torch.Tensor,
           running_var: torch.Tensor, gamma: Optional[torch.Tensor] = None,
           beta: Optional[torch.Tensor] = None, eps: float = 1e-5
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """A conv's (weight, bias) with the BatchNorm after it folded in, in float64 with one final
    rounding to the weight's dtype: ``W g/s``, ``(b - mu) g/s + beta``, ``s = sqrt(var + eps)``."""
    mu = running_mean.to(torch.float64)
    s = torch.sqrt(running_var.to(torch.float64) + eps)
    g = gamma.to(torch.float64) if gamma is not None else torch.ones_like(mu)
    bb = beta.to(torch.float64) if beta is not None else torch.zeros_like(mu)
    w = weight.to(torch.float64) * (g / s).view(-1, 1, 1, 1)
    b = (bias.to(torch.float64) - mu) * g / s + bb
    return w.to(weight.dtype), b.to(bias.dtype)


@torch.no_grad()
def fold_bn(model: nn.Module) -> int:
    """Fold every ChipConv's BN into its conv and remove it; returns how many. Call it after
    loading the float checkpoint and before building the optimizer / DDP wrapper: the BN
    parameters disappear."""
    n = 0
    for layer in chip_layers(model):
        bn, conv = layer.bn, layer.conv  # a ChipConv's conv always has a bias
        if bn is None:
            continue
        if bn.running_mean is None or bn.running_var is None:
            raise ValueError("cannot fold a BatchNorm built with track_running_stats=False: it has "
                             "no running statistics to fold")
        w, b = folded(conv.weight, conv.bias, bn.running_mean, bn.running_var, bn.weight, bn.bias,
                      bn.eps)
        conv.weight.copy_(w)
        conv.bias.copy_(b)
        layer.bn = None
        n += 1
    if n:
        log.info("folded %d BatchNorm layers into their convs", n)
    return n
