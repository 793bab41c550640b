"""Fold BatchNorm (which the chip lacks) into the preceding chip conv, once before step2.

Eval-mode ``BN(conv(x))`` is a conv with ``W' = W * g / s`` and ``b' = (b - mu) * g / s + beta``,
``s = sqrt(var + eps)``; computed in float64 so folding adds only one final rounding.
"""
from __future__ import annotations

import logging

import torch
from torch import nn

from mdk.quant.layers import ChipConv

log = logging.getLogger(__name__)


def chip_layers(model: nn.Module) -> list[ChipConv]:
    """All ChipConv layers in forward order (also through DDP / other wrappers)."""
    return [m for m in model.modules() if isinstance(m, ChipConv)]


@torch.no_grad()
def fold_bn_layer(layer: ChipConv) -> bool:
    """Fold ``layer.bn`` into ``layer.conv`` and remove it; False if the layer has no BN."""
    bn = layer.bn
    if bn is None:
        return False
    if bn.running_mean is None or bn.running_var is None:
        raise ValueError("cannot fold a BatchNorm built with track_running_stats=False: it has no "
                         "running statistics to fold")
    conv = layer.conv
    dt = conv.weight.dtype
    mu = bn.running_mean.to(torch.float64)
    s = torch.sqrt(bn.running_var.to(torch.float64) + bn.eps)
    g = bn.weight.to(torch.float64) if bn.weight is not None else torch.ones_like(mu)
    beta = bn.bias.to(torch.float64) if bn.bias is not None else torch.zeros_like(mu)
    w = conv.weight.to(torch.float64) * (g / s).view(-1, 1, 1, 1)
    b0 = conv.bias.to(torch.float64) if conv.bias is not None else torch.zeros_like(mu)
    b = (b0 - mu) * g / s + beta
    conv.weight.copy_(w.to(dt))
    if conv.bias is None:
        conv.bias = nn.Parameter(b.to(dt))
    else:
        conv.bias.copy_(b.to(dt))
    layer.bn = None
    return True


def fold_bn(model: nn.Module) -> int:
    """Fold every ChipConv's BN; returns how many. Call it after loading the float checkpoint and
    before building the optimizer / DDP wrapper: the BN parameters disappear."""
    n = sum(fold_bn_layer(layer) for layer in chip_layers(model))
    if n:
        log.info("folded %d BatchNorm layers into their convs", n)
    return n
