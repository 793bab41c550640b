"""A weights file's tensors in mdk's names, for a given model: an mdk checkpoint's (its EMA
weights where it has them), a bare mdk ``state_dict``'s, a GTI MDK checkpoint's
(mdk/checkpoint/gti_mdk.py: mapped, its step and caps said) or a torchvision VGG file's
(mdk/checkpoint/vgg.py: the leading convs that fit). Which kind a file is, and reading it:
mdk/checkpoint/weights_file.py; docs/pipeline.md, "Start from weights".
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import torch

from mdk.checkpoint import gti_mdk, vgg
from mdk.checkpoint.files import check_finite
from mdk.errors import CheckpointError
from mdk.quant.bn_fold import chip_layers

LAYER_KEY = re.compile(r"^layers\.(\d+)\.")
KINDS = {"mdk": "an mdk checkpoint", "weights": "an mdk state_dict", "gti": "a GTI MDK checkpoint",
         "vgg": "a torchvision VGG file"}


@dataclass
class Want:
    """What the stage (or tool) that starts from a file needs of it. ``caps``: its mode reads
    activation caps; ``as_written``: the file runs in its own GTI step's mode (a tool evaluating
    it), so that step's caps are needed; ``gti_step``/``caps_file``/``channels``: the user's word on
    a GTI file (``step.init_*``); ``gti_default``: the GTI step to assume when neither the user
    nor the file's folder says, and why; ``preset``: the model's name, for messages."""
    caps: bool = False
    as_written: bool = False
    gti_step: Optional[int] = None
    caps_file: Optional[str] = None
    channels: Optional[str] = None
    gti_default: tuple[int, str] = (1, "a float starting point")
    preset: str = "this preset"


@dataclass
class Source:
    """A file's tensors in mdk's names (``state``), what wrote it (``kind``, ``ck``: the whole
    mdk checkpoint), what its output layer predicts where known, and what was assumed or
    converted on the way (``notes``, said in the log line)."""
    path: Path
    kind: str
    state: dict[str, torch.Tensor]
    ck: Optional[dict[str, Any]] = None
    classes: Optional[int] = None
    boxes: Optional[int] = None
    notes: list[str] = field(default_factory=list)
    mode_step: Optional[int] = None  # a GTI file: the GTI step whose mode it holds

    @property
    def what(self) -> str:
        return KINDS[self.kind]


def chip_layer_count(state: dict[str, Any]) -> int:
    """How many chip layers a state in mdk's names has (``layers.{i}.conv.weight``)."""
    idx = [int(m.group(1)) for k in state if (m := LAYER_KEY.match(k)) and k.endswith("conv.weight")]
    return max(idx) + 1 if idx else 0


def weights_of(ck: dict[str, Any], prefer_ema: bool = True) -> dict[str, torch.Tensor]:
    """An mdk checkpoint's weights as a model ``state_dict``: with ``prefer_ema`` its EMA
    weights where it has them (what was evaluated and chose best.pth), in the model's dtypes.
    The EMA is stored once, as the run state's ``ema.shadow``; files written before 2026-11-28
    also hold it as ``model_ema``."""
    if prefer_ema and ck.get("model_ema"):
        return ck["model_ema"]
    shadow = (ck.get("ema") or {}).get("shadow") if prefer_ema else None
    if not shadow:
        return ck["model"]
    model = ck["model"]
    return {k: v.to(model[k].dtype) if k in model else v for k, v in shadow.items()}


def mdk_output(ck: dict[str, Any]) -> tuple[Optional[int], Optional[int]]:
    """(classes, boxes per cell) an mdk checkpoint's output layer predicts, from its config."""
    net = ((ck.get("config") or {}).get("model") or {}).get("net") or {}
    head = net.get("head") if isinstance(net.get("head"), dict) else {}
    classes = head.get("num_classes", net.get("num_classes"))
    boxes = head.get("boxes_per_cell", net.get("boxes_per_cell"))
    if isinstance(head.get("anchors"), list):
        boxes = len(head["anchors"])
    return (int(classes) if isinstance(classes, int) else None,
            int(boxes) if isinstance(boxes, int) else None)


def to_source(kind: str, obj: Any, path: Path, model: torch.nn.Module, want: Want, advice: str,
              prefer_ema: bool = True) -> Source:
    """The tensors of ``obj`` (a file of ``kind``, read from ``path``) in ``model``'s names;
    CheckpointError (one line) for a GTI/VGG file that cannot fit the model at all or NaN/Inf
    weights."""
    own = model.state_dict()
    n = chip_layer_count(own)
    if kind == "mdk":
        classes, boxes = mdk_output(obj)
        src = Source(path, "mdk", dict(weights_of(obj, prefer_ema)), obj, classes, boxes)
    elif kind == "gti":
        src = _gti(obj, path, model, want, n)
    elif kind == "vgg":
        state, notes = vgg.to_mdk(obj, path, own, n, want.preset)
        src = Source(path, "vgg", state, notes=notes)
    else:
        src = Source(path, "weights", dict(obj))
    check_finite(src.state, path, advice)
    return src


def _gti(obj: dict[str, Any], path: Path, model: torch.nn.Module, want: Want, n: int) -> Source:
    """A GTI MDK file: its tensors mapped, its step said (given, its folder, or assumed), its
    caps read where the stage needs them or the file is gain-fused."""
    f = gti_mdk.parse(obj, path)
    channels = want.channels or "BGR"  # the GTI MDK's default image_format
    model_bn = any(".bn." in k for k in model.state_dict())
    state, notes = gti_mdk.to_mdk(f, path, n, model_bn, channels)
    if want.gti_step is not None:
        step, why = int(want.gti_step), "step.init_gti_step"
    elif (by_folder := gti_mdk.step_from_path(path)) is not None:
        step, why = by_folder, f"its folder {path.parent.name}/"
    else:
        step, why = want.gti_default
    fused = gti_mdk.STEPS[step].fuse_gains
    said = f"GTI step {step}, {gti_mdk.STEP_WORDS[step]} ({why})"
    caps_at = gti_mdk.caps_path(path, want.caps_file)
    need = want.caps or fused or (want.as_written and gti_mdk.STEPS[step].activations)
    if need and caps_at is None:
        raise CheckpointError(
            f"GTI MDK checkpoint {path} ({said}) needs its activation caps, and there is no "
            f"{gti_mdk.CAP_FILE} beside it or in the GTI MDK's model/ folder; name it with "
            "step.init_caps=PATH (python -m mdk.tools.evaluate: --caps PATH)")
    if caps_at is not None and (need or gti_mdk.STEPS[step].activations):
        caps = gti_mdk.read_caps(caps_at, n)
        state.update(gti_mdk.cap_state(caps, fused))
        said += f", caps from {caps_at}"
    classes = int(f.convs[n - 1]["weight"].shape[0]) - 5 * gti_mdk.BOXES
    pools = [i for i, layer in enumerate(chip_layers(model)) if layer.pool]
    return Source(path, "gti", state, classes=classes, boxes=gti_mdk.BOXES,
                  notes=[said, gti_mdk.structure_words(pools, want.preset), *notes],
                  mode_step=step)
