"""Loading a starting file's tensors into a freshly built model (docs/pipeline.md, "Start from
weights"): all of them (``strict``: the input of a quantized stage, a resume), or every tensor
whose name and shape fit (``transfer``: a float stage's starting point from elsewhere), where the
output layer may differ in its channels (another class count or boxes per cell) and keeps its
initialisation. Layers that do not fit at all are refused in one line naming the first.
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional

import torch

from mdk.checkpoint.files import load_model_weights
from mdk.checkpoint.sources import Source, chip_layer_count
from mdk.errors import CheckpointError
from mdk.quant.bn_fold import BN_KEYS, folded
from mdk.quant.modes import drop_bn

log = logging.getLogger(__name__)


def _fold_extra_bn(state: dict[str, torch.Tensor], own: dict[str, torch.Tensor], n: int
                   ) -> tuple[dict[str, torch.Tensor], int]:
    """BatchNorms of the file where the model has none, folded into their convs."""
    out, count = dict(state), 0
    for i in range(n):
        p = f"layers.{i}.bn."
        if f"{p}running_mean" in out and f"{p}running_mean" not in own:
            w, b = folded(out[f"layers.{i}.conv.weight"], out[f"layers.{i}.conv.bias"],
                          out[f"{p}running_mean"], out[f"{p}running_var"], out.get(f"{p}weight"),
                          out.get(f"{p}bias"))
            out[f"layers.{i}.conv.weight"], out[f"layers.{i}.conv.bias"] = w, b
            for k in BN_KEYS:
                out.pop(p + k, None)
            count += 1
    return out, count


def _refuse(src: Source, preset: str, why: str) -> None:
    hint = ("; model=gnetdet holds the GTI MDK's 448 structure, model=gnetdet_224 its 224"
            if src.kind in ("gti", "vgg") else "; use the file's own model=")
    raise CheckpointError(f"{src.what} {src.path} does not fit model={preset}: {why}{hint}")


def _check_depth(src: Source, state: dict[str, torch.Tensor], n: int, preset: str) -> None:
    depth = chip_layer_count(state)
    if depth != n:
        _refuse(src, preset, f"the file has {depth} conv layers, the model {n} (another depth)")


def _output_change(src: Source, model: torch.nn.Module, theirs: int, mine: int) -> str:
    """Why the output layer is re-initialised, in the user's terms."""
    why = []
    classes, boxes = getattr(model, "num_classes", None), getattr(model, "boxes_per_cell", None)
    if src.classes is not None and classes is not None and src.classes != classes:
        why.append(f"class count {src.classes} \u2192 {classes}")
    if src.boxes is not None and boxes is not None and src.boxes != boxes:
        why.append(f"boxes per cell {src.boxes} \u2192 {boxes}")
    return f"{theirs} \u2192 {mine} channels" + (f", {', '.join(why)}" if why else "")


def transfer(model: torch.nn.Module, src: Source, preset: str) -> str:
    """Copy every tensor of ``src`` whose name and shape fit ``model``; the output layer may
    differ in its output channels (kept at its initialisation). Returns the log line's body."""
    own = model.state_dict()
    n = chip_layer_count(own)
    state, n_folded = _fold_extra_bn(src.state, own, n)
    if src.kind != "vgg":  # (a VGG file gives its leading layers only)
        _check_depth(src, state, n, preset)
    last = f"layers.{n - 1}.conv."
    take: dict[str, torch.Tensor] = {}
    reinit: Optional[str] = None
    for i in range(n):  # layer by layer, so the first layer that does not fit is named
        for k in [k for k in state if k.startswith(f"layers.{i}.")]:
            if k not in own:
                continue
            theirs, mine = tuple(state[k].shape), tuple(own[k].shape)
            if theirs == mine:
                take[k] = state[k]
            elif k.startswith(last) and theirs[1:] == mine[1:]:
                reinit = _output_change(src, model, theirs[0], mine[0])
            else:
                _refuse(src, preset, f"{k} is {theirs} in the file and {mine} in the model (" + (
                    "another channel list)" if i < n - 1 else "the output layer's inputs differ)"))
    rest = {k: v for k, v in state.items() if not k.startswith("layers.") and k in own and
            tuple(v.shape) == tuple(own[k].shape)}  # out_scale
    take.update(rest)
    model.load_state_dict(take, strict=False)
    # the weights proper (conv and BN tensors): the caps, fused flags and output scale are state
    wanted = [k for k in own if (".conv." in k or ".bn." in k) and
              not k.endswith("num_batches_tracked")]
    copied = [k for k in take if k in wanted]
    parts = [f"{len(copied)} of {len(wanted)} tensors copied"]
    if reinit:
        parts.append(f"re-initialised: the output layer ({last.rstrip('.')}: {reinit})")
    kept = sorted({int(k.split(".")[1]) for k in wanted if k not in take and ".bn." in k})
    if kept:
        parts.append(f"BatchNorm of {len(kept)} layers kept at its initialisation (the file "
                     "has none)")
    fresh = sorted({int(k.split(".")[1]) for k in wanted if k not in take and ".conv." in k
                    and not (reinit and k.startswith(last))})
    if fresh:
        parts.append(f"layers {fresh[0]}-{fresh[-1]} keep their initialisation (not in the file)"
                     if len(fresh) > 1 else f"layer {fresh[0]} keeps its initialisation")
    if n_folded:
        parts.append(f"{n_folded} BatchNorm layers of the file folded into their convs (this "
                     "model has none)")
    return "; ".join(parts + src.notes)


def load_all(model: torch.nn.Module, src: Source, preset: str) -> str:
    """Load every tensor the model has from ``src`` (the input of a stage that continues a
    chain, a file a tool evaluates), in the file's structure: without BN where its convs hold it
    (folded). A file without the caps/fused/output-scale buffers (a GTI file of a float or
    weight-quantized step) leaves them at the model's values. Returns the log line's body."""
    if not any(".bn." in k for k in src.state):
        drop_bn(model)
    own = model.state_dict()
    n = chip_layer_count(own)
    _check_depth(src, src.state, n, preset)
    state = dict(src.state)
    if src.kind != "mdk":
        state, _ = _fold_extra_bn(state, own, n)
        for k, v in own.items():
            if k.endswith((".cap", ".fused")) or k == "out_scale":
                state.setdefault(k, v)
    load_model_weights(model, state, Path(src.path), strict=True)
    return "; ".join(src.notes)
