"""Write an mdk stage checkpoint in the GTI GNetDet MDK's layout, so its tools and training read it.

    python -m mdk.tools.to_gti outputs/checkpoints/gnetdet_voc/step3/best.pth gti_out/
    python -m mdk.tools.to_gti <checkpoint> <dir> --channels RGB     # a GTI run with image_format RGB

``<dir>`` takes the GTI MDK's own layout: ``checkpoint/step<N>/best.pth`` (a plain ``state_dict``,
N the GTI step whose mode the stage trained in) and, once calibrated, ``model/relu_cap.txt``; copy
them into the GTI MDK's folder. Only a model the GTI MDK can build is written: its 448 or 224
structure (``model=gnetdet`` / ``model=gnetdet_224``) at that input size, the YOLOv1 grid with 2
boxes per cell, and for quantized stages its mask widths. docs/gti-compat.md, "Checkpoints".
"""
from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any, Optional, Sequence

from mdk.checkpoint import gti_mdk
from mdk.checkpoint.files import atomic_save
from mdk.checkpoint.layout import BEST
from mdk.checkpoint.sources import chip_layer_count, weights_of
from mdk.checkpoint.weights_file import read_weights
from mdk.errors import CheckpointError, ToolError
from mdk.stage_config import CHANNEL_ORDERS


def gti_refusal(net: dict[str, Any], image_size: Any, quantized: bool) -> Optional[str]:
    """Why the GTI MDK cannot build a model of this ``model.net`` config (None: it can)."""
    channels = [c if c == "M" else int(c) for c in net.get("channels", [])]
    sizes = [s for s, layout in gti_mdk.STRUCTURES.items() if layout == channels]
    if not sizes:
        return (f"its layer list {channels} is neither of the GTI MDK's structures (448: "
                f"{gti_mdk.STRUCTURES[448]}; 224: {gti_mdk.STRUCTURES[224]})")
    if image_size != sizes[0]:
        return (f"that layer list is the GTI MDK's {sizes[0]} structure, and the GTI MDK builds it "
                f"for {sizes[0]} px only (this model: model.image_size={image_size})")
    head = net.get("head") if isinstance(net.get("head"), dict) else {}
    target = str(head.get("_target_", "mdk.models.heads.YoloV1Head"))
    boxes = head.get("boxes_per_cell", net.get("boxes_per_cell"))
    if not target.endswith("YoloV1Head") or boxes != gti_mdk.BOXES:
        return (f"the GTI MDK reads a YOLOv1 grid with {gti_mdk.BOXES} boxes per cell; this model "
                f"has head {target.rsplit('.', 1)[-1]} with {boxes}")
    if quantized and [int(b) for b in net.get("mask_bits", [])] != gti_mdk.MASK_BITS:
        return (f"its mask widths {list(net.get('mask_bits', []))} are not the GTI MDK's "
                f"{gti_mdk.MASK_BITS} (it hard-codes them), and this stage's weights were "
                "quantized with them")
    return None


def to_gti(path: str | Path, out_dir: str | Path, channels: str = "BGR"
           ) -> tuple[list[Path], str, str]:
    """Write ``path``'s weights (its EMA weights when it has them: what best.pth was chosen by)
    in the GTI MDK's layout under ``out_dir``; returns the files written, the GTI MDK's settings
    that read them, and what the file is (``WeightsFile.describe``)."""
    path = Path(path)
    advice = "pass a best.pth/last.pth written by `python run.py`"
    try:
        f = read_weights(path, advice)
        ck = f.stage_checkpoint(advice)
    except CheckpointError as e:
        raise ToolError(str(e)) from None
    spec, cfg = f.stage, ck.get("config") or {}
    model_cfg = cfg.get("model") or {}
    if spec is None or not model_cfg.get("net"):
        raise ToolError(f"{path} records no stage or model config (written by an older mdk?); "
                        "run its stage again to rewrite it")
    why = gti_refusal(model_cfg["net"], model_cfg.get("image_size"), spec.quant.weights)
    if why:
        raise ToolError(f"{path} (model={model_cfg.get('name')}) cannot be written for the GTI "
                        f"MDK: {why}")
    state = weights_of(ck)
    n = chip_layer_count(state)
    step = next(k for k, m in gti_mdk.STEPS.items() if m == spec.quant)
    out_dir = Path(out_dir)
    pth = out_dir / "checkpoint" / f"step{step}" / BEST
    gti_state = gti_mdk.from_mdk(state, n, channels)
    atomic_save(collections.OrderedDict(gti_state), pth)
    written = [pth]
    caps = gti_mdk.caps_of(state, n)
    if caps is not None:
        written.append(gti_mdk.write_caps(out_dir / "model" / gti_mdk.CAP_FILE, caps))
    bn = any(".BatchNorm" in k for k in gti_state)
    settings = (f"image_size = {model_cfg['image_size']}, batch_norm = {bn}, image_format = "
                f"{channels!r}, VOC_CLASSES = {list((cfg.get('dataset') or {}).get('class_names', []))}"
                f" (GTI step {step}: {gti_mdk.STEP_WORDS[step]})")
    return written, settings, f.describe()


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m mdk.tools.to_gti", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="an mdk stage checkpoint (best.pth / last.pth)")
    ap.add_argument("out_dir", help="where the GTI MDK's checkpoint/ and model/ folders go")
    ap.add_argument("--channels", choices=CHANNEL_ORDERS, default="BGR",
                    help="the GTI run's image_format: its first conv's channel order (default "
                         "BGR, the GTI MDK's; mdk trains on RGB)")
    args = ap.parse_args(argv)
    try:
        files, settings, what = to_gti(args.checkpoint, args.out_dir, args.channels)
    except ToolError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"{args.checkpoint} is {what}")
    for f in files:
        print(f"wrote {f}")
    print(f"the GTI MDK's configs.py for it: {settings}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
