"""GTI MDK checkpoints made from its key names, for the tests: its GNetDet is an ``nn.Sequential``
``features`` of ``conv{i}``, ``BatchNorm{i}`` (BN models, after every conv, the output conv too),
``relu{i}`` and ``pool{j}``; its float forward puts a ReLU after every conv and returns the grid
as ``[B, S, S, D]``; its images are BGR. Built from that description (docs/gti-compat.md), not
from its code, which stays outside the repository (the checks against it: the closing notes)."""
from __future__ import annotations

from collections import OrderedDict
from pathlib import Path
from typing import Optional, Sequence

import torch
from torch import nn

from mdk.quant.activation import quantize_input

GTI_448 = [64, "M", 64, "M", 128, 128, "M", 256, 256, 256, "M", 256, 256, 256, "M", 256, 256, 256,
           256, 256]
GTI_224 = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 256, 256, 256, "M", 256, 256, 256, 256,
           256]


def gti_features(channels: Sequence, out_ch: int, bn: bool, seed: int = 0) -> nn.Sequential:
    """The GTI MDK's layer naming over ``channels`` (+ the output conv), random weights and, with
    BN, random affine parameters and running statistics (so folding them shows)."""
    g = torch.Generator().manual_seed(seed)
    layers: OrderedDict[str, nn.Module] = OrderedDict()
    c_in, i, p = 3, 0, 0
    for c in [*channels, out_ch]:
        if c == "M":
            p += 1
            layers[f"pool{p}"] = nn.MaxPool2d(2, 2)
            continue
        conv = nn.Conv2d(c_in, c, 3, padding=1)
        with torch.no_grad():
            conv.weight.normal_(0, (2 / (9 * c_in)) ** 0.5, generator=g)
            conv.bias.normal_(0, 0.05, generator=g)
        layers[f"conv{i}"] = conv
        if bn:
            b = nn.BatchNorm2d(c)
            with torch.no_grad():
                b.weight.copy_(1 + 0.2 * torch.randn(c, generator=g))
                b.bias.copy_(0.1 * torch.randn(c, generator=g))
                b.running_mean.copy_(0.1 * torch.randn(c, generator=g))
                b.running_var.copy_(0.5 + torch.rand(c, generator=g))
            layers[f"BatchNorm{i}"] = b
        layers[f"relu{i}"] = nn.ReLU()
        c_in, i = c, i + 1
    return nn.Sequential(layers).eval()


def gti_state(features: nn.Sequential, ddp: bool = False,
              best_loss: Optional[float] = None) -> dict:
    """What the GTI MDK's checkpointer saves: ``features.*`` (``module.features.*`` from DDP)."""
    prefix = "module.features." if ddp else "features."
    out: dict = OrderedDict((prefix + k, v.clone()) for k, v in features.state_dict().items())
    if best_loss is not None:
        out["best_loss"] = best_loss
    return out


def save_gti(features: nn.Sequential, root: Path, step: int, **kw) -> Path:
    """``<root>/checkpoint/step<step>/best.pth``, the GTI MDK's layout."""
    path = Path(root) / "checkpoint" / f"step{step}" / "best.pth"
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(gti_state(features, **kw), path)
    return path


@torch.no_grad()
def gti_forward(features: nn.Sequential, u8_rgb: torch.Tensor) -> torch.Tensor:
    """The GTI MDK's float forward of an RGB uint8 batch (it reads BGR): ``[B, S, S, D]``, in
    ``features``' dtype (float64 for a comparison that no CPU's float32 kernels can tip)."""
    dtype = next(features.parameters()).dtype
    x = features(quantize_input(u8_rgb).flip(1).to(dtype))
    return x.permute(0, 2, 3, 1)


def write_caps(path: Path, caps: Sequence[float]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{float(c)!r}\n" for c in caps))
    return path
