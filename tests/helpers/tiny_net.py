"""A seeded conv-BN-linear net small enough for bit-level EMA checks (test_ema, test_ema_hook)."""
from __future__ import annotations

import torch
from torch import nn


def tiny_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))
