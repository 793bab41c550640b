"""The GTI GNetDet MDK's checkpoints, read and written (docs/gti-compat.md, "Checkpoints").

Its checkpoint is a plain ``state_dict`` of ``features``, an ``nn.Sequential`` named ``conv{i}``,
``BatchNorm{i}`` (BN models, after every conv, the output conv too), ``relu{i}`` and ``pool{j}``;
saved from DDP its keys start with ``module.``, and some hold a ``best_loss`` number. Its caps are
one number per conv, in order, in ``relu_cap.txt`` (``model/relu_cap.txt`` under its root). Its
step N writes ``checkpoint/step{N}/best.pth`` and calibration ``checkpoint/step2/cal-best.pth``.
Its convs are numbered like mdk's chip layers, so conv i is ``layers.{i}``: the pools are no
tensors, and which structure (224 or 448) a file has is the preset's to say. Its images are BGR by
default (OpenCV), mdk's RGB: the first conv's input channels are swapped on the way in and out.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from mdk.atomic_file import write_text
from mdk.errors import CheckpointError
from mdk.quant.activation import LEVELS
from mdk.quant.bn_fold import BN_KEYS, folded
from mdk.stage_config import GTI_STEPS, QuantMode

KEY = re.compile(r"^(module\.)?features\.(conv|BatchNorm)(\d+)\.(\w+)$")
NUMBERS = ("best_loss",)  # plain numbers some of its checkpoints hold beside the tensors
BN_EPS = 1e-5  # torch's BatchNorm2d default, which the GTI MDK builds (eps is not in a state_dict)
CAP_FILE = "relu_cap.txt"
# What the file of each GTI step holds (its STEP_SETTINGS, and step 4's gain fusion)
STEPS: dict[int, QuantMode] = dict(zip(GTI_STEPS, (
    QuantMode(),
    QuantMode(fold_bn=True, weights=True),
    QuantMode(fold_bn=True, weights=True, activations=True),
    QuantMode(fold_bn=True, weights=True, activations=True, fuse_gains=True))))
STEP_WORDS = {1: "float", 2: "quantized weights", 3: "quantized weights and 5-bit activations",
              4: "gain-fused"}
# The GTI MDK's two structures (its GNetDet.from_config); the output conv is 10 + classes wide.
STRUCTURES = {448: [64, "M", 64, "M", 128, 128, "M", 256, 256, 256, "M", 256, 256, 256, "M", 256,
                    256, 256, 256, 256],
              224: [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 256, 256, 256, "M", 256, 256,
                    256, 256, 256]}
MASK_BITS = [3] * 13 + [8] * 3  # 3-bit but for its last major layer (both structures)
BOXES = 2  # its decoder's boxes per cell


def is_gti(obj: Any) -> bool:
    """A GTI MDK checkpoint: every entry a ``features.conv{i}``/``BatchNorm{i}`` tensor (or one
    of its plain numbers), at least one conv."""
    if not isinstance(obj, dict) or not obj:
        return False
    keys = [k for k in obj if k not in NUMBERS]
    return bool(keys) and all(isinstance(k, str) and KEY.match(k) and torch.is_tensor(obj[k])
                              for k in keys) and any(".conv" in k for k in keys)


@dataclass
class GtiFile:
    """A GTI MDK checkpoint's tensors by conv index: ``convs[i]`` the conv's weight and bias,
    ``bns[i]`` the BatchNorm after it."""
    convs: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    bns: dict[int, dict[str, torch.Tensor]] = field(default_factory=dict)
    ddp: bool = False


def parse(obj: dict[str, Any], path: Path) -> GtiFile:
    out = GtiFile()
    for k, v in obj.items():
        if k in NUMBERS:
            continue
        m = KEY.match(k)
        out.ddp |= bool(m.group(1))
        (out.convs if m.group(2) == "conv" else out.bns).setdefault(int(m.group(3)), {})[
            m.group(4)] = v
    n = len(out.convs)
    if sorted(out.convs) != list(range(n)) or any(set(c) != {"weight", "bias"}
                                                  for c in out.convs.values()):
        raise CheckpointError(f"GTI MDK checkpoint {path} has convs {sorted(out.convs)} with "
                              "parts missing (each conv{i} needs a weight and a bias, numbered "
                              "from 0); it is damaged or not a GNetDet")
    if any(i not in out.convs or set(b) < {"running_mean", "running_var"}
           for i, b in out.bns.items()):
        raise CheckpointError(f"GTI MDK checkpoint {path} has a BatchNorm without its conv or "
                              "its running statistics; it is damaged or not a GNetDet")
    return out


def _swap_rgb_bgr(w: torch.Tensor) -> torch.Tensor:
    """A first conv's input channels in the other order (BGR <-> RGB)."""
    return w.flip(1) if w.shape[1] == 3 else w


def to_mdk(f: GtiFile, path: Path, model_layers: int, model_bn: bool, channels: str
           ) -> tuple[dict[str, torch.Tensor], list[str]]:
    """mdk's ``layers.{i}`` tensors of a parsed GTI file, and what was done to them (for the
    log): BN mapped where the model has BN, folded where it has none (the output conv's always),
    the first conv made RGB. ``model_layers``: the model's chip layers (the depth must agree)."""
    n = len(f.convs)
    if n != model_layers:
        raise CheckpointError(
            f"GTI MDK checkpoint {path} has {n} conv layers, this model {model_layers}: another "
            "depth; use the preset of its structure (model=gnetdet for the GTI MDK's 448, "
            "model=gnetdet_224 for its 224 structure)")
    out: dict[str, torch.Tensor] = {}
    notes: list[str] = []
    folded_at = []
    for i in range(n):
        w, b = f.convs[i]["weight"], f.convs[i]["bias"]
        bn = f.bns.get(i)
        if bn is not None and (i == n - 1 or not model_bn):
            w, b = folded(w, b, bn["running_mean"], bn["running_var"], bn.get("weight"),
                          bn.get("bias"), BN_EPS)
            folded_at.append(i)
        elif bn is not None:
            out.update({f"layers.{i}.bn.{k}": v for k, v in bn.items() if k in BN_KEYS})
        out[f"layers.{i}.conv.weight"] = _swap_rgb_bgr(w) if i == 0 and channels == "BGR" else w
        out[f"layers.{i}.conv.bias"] = b
    if folded_at == [n - 1]:
        notes.append("its output conv's BatchNorm folded into that conv with its running "
                     "statistics (mdk's output layer has none)")
    elif folded_at:
        notes.append(f"its {len(folded_at)} BatchNorm layers folded into their convs with their "
                     "running statistics (this model has no BatchNorm)")
    if channels == "BGR" and f.convs[0]["weight"].shape[1] == 3:
        notes.append("its first conv's input channels swapped from BGR (the GTI MDK's "
                     "image_format) to mdk's RGB")
    if f.ddp:
        notes.append("saved from DDP ('module.' prefix dropped)")
    return out, notes


def from_mdk(state: dict[str, torch.Tensor], n: int, channels: str = "BGR"
             ) -> dict[str, torch.Tensor]:
    """The GTI MDK's ``state_dict`` of an mdk model's ``layers.{i}`` tensors (``n`` chip layers).
    With BN, every conv gets a BatchNorm as the GTI MDK's BN models have: the output conv an
    identity (mdk's output layer has none; its folded BN stays folded)."""
    out: dict[str, torch.Tensor] = {}
    with_bn = any(k.startswith("layers.0.bn.") for k in state)
    for i in range(n):
        w = state[f"layers.{i}.conv.weight"]
        out[f"features.conv{i}.weight"] = _swap_rgb_bgr(w) if i == 0 and channels == "BGR" else w
        out[f"features.conv{i}.bias"] = state[f"layers.{i}.conv.bias"]
        if not with_bn:
            continue
        if i < n - 1:
            for k in BN_KEYS:
                out[f"features.BatchNorm{i}.{k}"] = state[f"layers.{i}.bn.{k}"]
        else:
            out.update({f"features.BatchNorm{i}.{k}": v for k, v in identity_bn(w).items()})
    return out


def identity_bn(weight: torch.Tensor) -> dict[str, torch.Tensor]:
    """Running statistics that make an eval-mode BatchNorm after ``weight``'s conv pass its input
    on unchanged: ``var = 1 - eps`` so ``sqrt(var + eps) = 1``."""
    c = weight.shape[0]
    one = torch.ones(c, dtype=weight.dtype)
    return {"weight": one.clone(), "bias": torch.zeros(c, dtype=weight.dtype),
            "running_mean": torch.zeros(c, dtype=weight.dtype),
            "running_var": one - BN_EPS, "num_batches_tracked": torch.tensor(0)}


def pools_of(layout: list) -> list[int]:
    """The conv layers a channel list (``M``: a 2x2 pool) pools after."""
    out, conv = [], -1
    for c in layout:
        if c == "M":
            out.append(conv)
        else:
            conv += 1
    return out


def structure_words(pools: list[int], preset: str) -> str:
    """Which structure a GTI file is read as: the preset's, named by where it pools."""
    for size, layout in STRUCTURES.items():
        if pools == pools_of(layout):
            return f"read as the GTI MDK's {size} structure (model={preset})"
    return f"read with model={preset}'s layers (pools after layers {pools})"


def step_from_path(path: Path) -> Optional[int]:
    """The GTI step that wrote ``path`` by the GTI MDK's layout: ``checkpoint/step{N}/*.pth``
    (``cal-best.pth``: calibration, in step 2's folder), else None."""
    m = re.fullmatch(r"step([1-4])", Path(path).parent.name)
    return int(m.group(1)) if m else None


def caps_path(path: Path, named: Optional[str | Path]) -> Optional[Path]:
    """Where a GTI file's ``relu_cap.txt`` is: ``named``, else beside the file, else under the
    GTI MDK's root (``<root>/checkpoint/stepN/best.pth`` -> ``<root>/model/relu_cap.txt``)."""
    if named:
        return Path(named).expanduser()
    path = Path(path)
    for cand in (path.parent / CAP_FILE, path.parent.parent.parent / "model" / CAP_FILE):
        if cand.is_file():
            return cand
    return None


def read_caps(path: Path, n: int) -> list[float]:
    """The ``n`` caps of a ``relu_cap.txt``: one positive number per line (blank lines at the
    end allowed); CheckpointError names the file, the line and what is wrong."""
    if not Path(path).is_file():
        raise CheckpointError(f"{path} does not exist: name the GTI MDK's relu_cap.txt with "
                              "step.init_caps=PATH")
    lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    caps = []
    for no, line in enumerate(lines, 1):
        try:
            c = float(line.strip())
        except ValueError:
            raise CheckpointError(f"{path} line {no}: {line.strip()[:40]!r} is not a number; a "
                                  "relu_cap.txt holds one activation cap per conv layer, one per "
                                  "line (the GTI MDK's calibration writes it)") from None
        if not (math.isfinite(c) and c > 0):
            raise CheckpointError(f"{path} line {no}: cap {c} must be a positive number; "
                                  "calibrate again (GTI MDK: its cal step; mdk: step=cal)")
        caps.append(c)
    if len(caps) != n:
        raise CheckpointError(f"{path} holds {len(caps)} caps, this model has {n} conv layers; "
                              "it belongs to another model (one cap per conv layer, in order)")
    return caps


def write_caps(path: Path, caps: list[float]) -> Path:
    """``relu_cap.txt`` as the GTI MDK reads it: one number per line, exact (Python's repr)."""
    return write_text(path, "".join(f"{float(c)!r}\n" for c in caps))


def cap_state(caps: list[float], fused: bool) -> dict[str, torch.Tensor]:
    """mdk's ``cap``/``fused``/``out_scale`` tensors for caps ``c_i``: the caps themselves, or
    after gain fusion (the GTI MDK's step 4) every cap 31 and the output scaled by c_last/31."""
    n = len(caps)
    out = {f"layers.{i}.cap": torch.tensor(float(LEVELS) if fused else float(c))
           for i, c in enumerate(caps)}
    out.update({f"layers.{i}.fused": torch.tensor(fused) for i in range(n)})
    out["out_scale"] = torch.tensor(float(caps[-1]) / LEVELS if fused else 1.0)
    return out


def caps_of(state: dict[str, torch.Tensor], n: int) -> Optional[list[float]]:
    """The caps to write for an mdk model's state (None: not calibrated): its caps, or when gain
    fused 31 for all but the last, which carries the output scale (``31 x out_scale``)."""
    caps = [float(state[f"layers.{i}.cap"]) for i in range(n)]
    if not all(c > 0 for c in caps):
        return None
    if bool(state[f"layers.{n - 1}.fused"]):
        caps[-1] = float(state["out_scale"]) * LEVELS  # exact: GTI's last/31 gives out_scale back
    return caps
