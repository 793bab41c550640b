"""torchvision's VGG weight files as a starting point: the leading convs that fit (docs/pipeline.md,
"Start from weights").

``torchvision.models.vgg16(weights="IMAGENET1K_V1")`` leaves ``vgg16-397923af.pth`` in the torch
hub cache: a ``state_dict`` of ``features.{k}`` (convs, and BatchNorms in the ``_bn`` variants)
and ``classifier.{k}``. Its convs are taken in order into mdk's chip layers while their shapes fit
(GNetDet-448 and the GTI MDK's 224 structure share VGG-16's first 7); the classifier never fits.
VGG saw ``(rgb / 255 - mean) / std``, mdk's first layer sees the 5-bit input ``q ~ u8 / 8``: that
affine map is folded into the first conv, so its filters answer the same images as in VGG (up to
the 5-bit rounding and the zero padding at the border, which VGG saw as the mean colour).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import torch

from mdk.errors import CheckpointError
from mdk.quant.bn_fold import BN_KEYS

KEY = re.compile(r"^(features|classifier)\.(\d+)\.(weight|bias|running_mean|running_var|"
                 r"num_batches_tracked)$")
# torchvision's ImageNet normalisation (IMAGENET1K_V1 transforms), RGB
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
INPUT_STEP = 8.0  # one 5-bit input level is 8 of the uint8 image: q = ((u8 >> 2) + 1) >> 1


def is_vgg(obj: Any) -> bool:
    """A torchvision VGG ``state_dict``: ``features.{k}`` and ``classifier.{k}`` tensors only."""
    if not isinstance(obj, dict) or not obj:
        return False
    ok = all(isinstance(k, str) and KEY.match(k) and torch.is_tensor(v) for k, v in obj.items())
    return ok and any(k.startswith("classifier.") for k in obj) and any(
        k.startswith("features.") and v.dim() == 4 for k, v in obj.items())


def _layers(obj: dict[str, torch.Tensor]) -> list[dict[str, Any]]:
    """VGG's convs in order, each ``{"weight", "bias", "bn": {...} or None}``."""
    mods: dict[int, dict[str, torch.Tensor]] = {}
    for k, v in obj.items():
        m = KEY.match(k)
        if m.group(1) == "features":
            mods.setdefault(int(m.group(2)), {})[m.group(3)] = v
    convs: list[dict[str, Any]] = []
    for idx in sorted(mods):
        part = mods[idx]
        if "running_mean" in part and convs:
            convs[-1]["bn"] = part
        elif part.get("weight") is not None and part["weight"].dim() == 4:
            convs.append({"weight": part["weight"], "bias": part.get("bias"), "bn": None})
    return convs


def _input_folded(w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The first conv on mdk's 5-bit input: ``x = q * 8/(255 std) - mean/std`` per RGB channel."""
    mean = torch.tensor(MEAN, dtype=torch.float64).view(1, 3, 1, 1)
    std = torch.tensor(STD, dtype=torch.float64).view(1, 3, 1, 1)
    w64 = w.to(torch.float64)
    w_new = w64 * (INPUT_STEP / 255.0) / std
    b_new = b.to(torch.float64) - (w64 * mean / std).sum(dim=(1, 2, 3))
    return w_new.to(w.dtype), b_new.to(b.dtype)


def to_mdk(obj: dict[str, torch.Tensor], path: Path, own: dict[str, torch.Tensor],
           model_layers: int, preset: str) -> tuple[dict[str, torch.Tensor], list[str]]:
    """mdk's tensors for the leading VGG convs that fit the model's chip layers (``own``: the
    model's state_dict), and the note for the log; CheckpointError when none fits."""
    convs = _layers(obj)
    out: dict[str, torch.Tensor] = {}
    taken = 0
    for i, c in enumerate(convs[:model_layers - 1]):  # never the output conv
        key = f"layers.{i}.conv"
        if own.get(f"{key}.weight") is None or c["bias"] is None or \
                c["weight"].shape != own[f"{key}.weight"].shape or \
                c["bias"].shape != own[f"{key}.bias"].shape:
            break
        w, b = _input_folded(c["weight"], c["bias"]) if i == 0 else (c["weight"], c["bias"])
        out[f"{key}.weight"], out[f"{key}.bias"] = w, b
        if c["bn"] is not None and f"layers.{i}.bn.running_mean" in own:
            out.update({f"layers.{i}.bn.{k}": v for k, v in c["bn"].items() if k in BN_KEYS})
        taken += 1
    if taken == 0:
        first = convs[0]["weight"].shape if convs else None
        mine = own.get("layers.0.conv.weight")
        raise CheckpointError(
            f"{path} is a torchvision VGG ({len(convs)} convs) and none of its layers fits "
            f"model={preset}: its first conv is {tuple(first) if first is not None else None}, "
            f"the model's layer 0 {tuple(mine.shape) if mine is not None else None}; start from "
            "it with model=gnetdet (GNetDet-448) or model=gnetdet_224 (their first 7 convs are "
            "VGG-16's), or without it")
    note = (f"torchvision VGG: its first {taken} of {len(convs)} convs (the ones that fit, in "
            "order; the ImageNet input normalisation folded into the first)")
    return out, [note]
